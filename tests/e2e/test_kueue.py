"""Kueue's contract end to end on the real API server, with Kueue's own Workload and
ResourceFlavor CRDs (v0.14.0, from its pinned module: hack/cluster-tools/
scheduler-crds.sh). The tests play Kueue's scheduler, writing the Workload's admission and
eviction as Kueue does; the operator plays Kueue's integration for its job kind: the
Workload, suspension until admission, the flavor's placement, the quota given back after
an eviction, Finished at the end."""

from __future__ import annotations

import json
import time

import pytest
from support import scheduler_crds as crds
from support.waiting import wait_for

from .jobs import create, event_messages, get, job_manifest, pods, wait_status

pytestmark = pytest.mark.e2e

NS, NAME, WL = "e2e-kueue", "queued", "llmtrainjob-queued"
FLAVOR = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "e2e-gpu-pool"},
          "spec": {"nodeLabels": {"llmtrain.io/pool": "gpu"},
                   "tolerations": [{"key": "e2e.llmtrain.io/queued", "operator": "Exists", "effect": "NoSchedule"}]}}


def _workload(bed) -> dict | None:
    out = bed.kubectl("get", "workloads.kueue.x-k8s.io", WL, "-n", NS, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _condition(conditions: list[dict], type_: str) -> dict:
    return next((c for c in conditions if c["type"] == type_), {})


def _kueue_writes(bed, status: dict) -> None:
    """What Kueue's scheduler writes into the Workload's status."""
    bed.kubectl("patch", "workloads.kueue.x-k8s.io", WL, "-n", NS, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _admit(bed) -> None:
    workload = _workload(bed)
    assignments = [{"name": ps["name"], "count": ps["count"], "flavors": {"cpu": "e2e-gpu-pool", "memory": "e2e-gpu-pool"}}
                   for ps in workload["spec"]["podSets"]]
    kept = [c for c in (workload.get("status") or {}).get("conditions", []) if c["type"] not in ("QuotaReserved", "Admitted", "Evicted")]
    _kueue_writes(bed, {"admission": {"clusterQueue": "cluster-queue", "podSetAssignments": assignments}, "conditions": kept + [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved in ClusterQueue cluster-queue",
         "lastTransitionTime": _now()},
        {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted", "lastTransitionTime": _now()}]})


def _spec_suspend(bed) -> bool | None:
    return (get(bed, NS, NAME).get("spec") or {}).get("suspend")


def _released(bed) -> dict:
    """The Workload once its quota was given back (no admission)."""
    return wait_for(lambda: (lambda w: w if not w["status"].get("admission") else None)(_workload(bed)), 30,
                    what="the quota given back")


@pytest.fixture(scope="module")
def queued_job(operator):
    """Kueue's CRDs, the flavor, and the job, created without suspend and labelled for the
    queue ``team-a``. One job goes through the whole contract; each step's checks are a
    test of their own, in order, so that a failed one hides nothing of the next."""
    bed = operator
    crds.install(bed, "workloads.kueue.x-k8s.io", "kueue.x-k8s.io_workloads.yaml")
    crds.install(bed, "resourceflavors.kueue.x-k8s.io", "kueue.x-k8s.io_resourceflavors.yaml")
    bed.kubectl("apply", "-f", "-", input=json.dumps(FLAVOR))
    # Paced, so that the eviction lands mid-run (unpaced, 30 steps take seconds).
    manifest = job_manifest(NAME, {"spec.trainer.builtin.maxSteps": 30, "metadata.labels": {"kueue.x-k8s.io/queue-name": "team-a"},
                                   "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": "slow@step=1,seconds=0.5,steps=30"}]})
    del manifest["spec"]["scheduling"]  # the flavor places the pods
    create(bed, NS, manifest)
    yield
    bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)


def test_a_queued_job_is_suspended_with_its_workload_and_runs_nothing_before_admission(operator, queued_job):
    """Created without suspend: like Kueue's webhook, the operator suspends it, and creates
    its Workload."""
    bed = operator
    workload = wait_for(lambda: _workload(bed), 60, what="the Workload")
    assert workload["spec"]["queueName"] == "team-a"
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [("workers", 2), ("rendezvous", 1)]
    assert workload["metadata"]["ownerReferences"][0]["uid"] == get(bed, NS, NAME)["metadata"]["uid"]
    waiting = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Suspended", 60, "suspended while queued")
    assert _condition(waiting["conditions"], "Admitted")["reason"] == "WaitingForAdmission"
    wait_for(lambda: _spec_suspend(bed) is True, 30, what="spec.suspend set")
    time.sleep(3)
    assert not pods(bed, NS, NAME) and not pods(bed, NS, NAME, "rendezvous"), "nothing runs before admission"


def test_an_admitted_job_is_unsuspended_within_seconds_its_pods_on_the_flavors_nodes(operator, queued_job):
    bed = operator
    # Waiting for admission: where the test before passed, at once.
    wait_for(lambda: _workload(bed), 60, what="the Workload")
    wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Suspended", 60, "suspended while queued")
    admitted = time.monotonic()
    _admit(bed)
    workers = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(pods(bed, NS, NAME)), 60, what="the workers after admission")
    assert time.monotonic() - admitted < 20
    wait_for(lambda: _spec_suspend(bed) is False, 10, what="spec.suspend cleared (written after the pass's status)")
    for pod in workers + pods(bed, NS, NAME, "rendezvous"):
        assert pod["spec"]["nodeSelector"]["llmtrain.io/pool"] == "gpu"
        assert {"key": "e2e.llmtrain.io/queued", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert any(r == "AdmittedByKueue" for r, _ in event_messages(bed, NS, NAME))


def test_an_evicted_job_is_suspended_its_pods_go_and_its_quota_is_given_back(operator, queued_job):
    """Kueue evicts it (preempted)."""
    bed = operator
    wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running", 180, "running")
    conditions = _workload(bed)["status"]["conditions"]
    _kueue_writes(bed, {"conditions": conditions + [{"type": "Evicted", "status": "True", "reason": "Preempted",
                                                     "message": "Preempted to accommodate a higher priority Workload",
                                                     "lastTransitionTime": _now()}]})
    evicted = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Suspended", 60, "suspended after the eviction")
    assert "Preempted to accommodate" in _condition(evicted["conditions"], "Admitted")["message"]
    wait_for(lambda: not pods(bed, NS, NAME) and not pods(bed, NS, NAME, "rendezvous"), 90, what="the pods gone")
    released = _released(bed)
    assert _condition(released["status"]["conditions"], "QuotaReserved")["status"] == "False"


def test_a_readmitted_job_resumes_finishes_uncharged_and_its_workload_says_finished(operator, queued_job):
    """Admitted again (Kueue requeues it)."""
    bed = operator
    released = _released(bed)  # where the test before passed, at once
    _kueue_writes(bed, {"conditions": [c for c in released["status"]["conditions"] if c["type"] != "Evicted"]})
    _admit(bed)
    done = wait_status(bed, NS, NAME, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the job finished")
    assert done["phase"] == "Succeeded", json.dumps(done)[:2000]
    assert done["restarts"] == 0, "an eviction is not a failure"
    finished = wait_for(lambda: _condition(_workload(bed)["status"]["conditions"], "Finished"), 30, what="Finished")
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
