"""Gang scheduling end to end on the real API server, with the PodGroup CRDs of Volcano
and scheduler-plugins taken from their own pinned modules (hack/cluster-tools/
scheduler-crds.sh): the job says so when the cluster lacks the CRD, creates the PodGroup
its scheduler expects (owned by the job, minMember from the spec), holds Volcano's pods
until the queue takes the gang in, gives the PodGroup back when suspended, and shows an
admission webhook's refusal of its pods in a condition and an Event within seconds."""

from __future__ import annotations

import json
import time

import pytest
from support import scheduler_crds as crds
from support.waiting import wait_for

from .jobs import create, get, job_manifest, pods, wait_event, wait_status
from .webhook import REFUSAL, RefusingWebhook

pytestmark = pytest.mark.e2e

NS = "e2e-gang"
CRDS = {"scheduler-plugins": ("podgroups.scheduling.x-k8s.io", "scheduling.x-k8s.io_podgroups.yaml"),
        "volcano": ("podgroups.scheduling.volcano.sh", "scheduling.volcano.sh_podgroups.yaml")}


def _gang(name: str, scheduler: str, steps: int = 400) -> dict:
    manifest = job_manifest(name, {"spec.trainer.builtin.maxSteps": steps})
    manifest["spec"]["scheduling"]["gang"] = {"minAvailable": 2, "scheduler": scheduler}
    return manifest


def _condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def _pod_group(bed, scheduler: str, name: str) -> dict | None:
    out = bed.kubectl("get", CRDS[scheduler][0], name, "-n", NS, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _install_crds(bed) -> None:
    for crd, file in CRDS.values():
        crds.install(bed, crd, file)


def test_a_gang_job_without_the_pod_group_api_says_so_once_and_runs_without_one(operator):
    bed = operator
    for crd, _ in CRDS.values():
        bed.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true")
    create(bed, NS, _gang("gang-nocrd", "scheduler-plugins"))
    try:
        missing = wait_status(bed, NS, "gang-nocrd", lambda s: _condition(s, "PodGroupReady").get("reason") == "PodGroupAPIMissing",
                              60, "PodGroupAPIMissing")
        assert "podgroups.scheduling.x-k8s.io/v1alpha1" in _condition(missing, "PodGroupReady")["message"]
        wait_event(bed, NS, "gang-nocrd", "PodGroupAPIMissing", "")
        wait_for(lambda: len(pods(bed, NS, "gang-nocrd")) == 2, 60, what="the workers, without a PodGroup")
    finally:
        bed.kubectl("delete", "ltj", "gang-nocrd", "-n", NS, "--wait=false", check=False)


def test_a_scheduler_plugins_gang_gets_its_pod_group_owned_by_the_job_and_deleted_with_it(operator):
    """The PodGroup, owned by the job, then the workers naming it; deleting the job deletes
    its PodGroup (ownerReferences)."""
    bed = operator
    _install_crds(bed)
    create(bed, NS, _gang("gang-sp", "scheduler-plugins"))
    try:
        group = wait_for(lambda: _pod_group(bed, "scheduler-plugins", "gang-sp"), 60, what="the scheduler-plugins PodGroup")
        owner = group["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "LLMTrainJob" and owner["uid"] == get(bed, NS, "gang-sp")["metadata"]["uid"]
        assert group["spec"]["minMember"] == 2 and group["spec"]["minResources"] == {"cpu": "2", "memory": "4Gi"}
        wait_status(bed, NS, "gang-sp", lambda s: _condition(s, "PodGroupReady").get("status") == "True", 60, "PodGroupReady")
        workers = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(pods(bed, NS, "gang-sp")), 60, what="the gang's workers")
        assert all(p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang-sp" for p in workers)
    finally:
        bed.kubectl("delete", "ltj", "gang-sp", "-n", NS, "--wait=false", check=False)
    wait_for(lambda: _pod_group(bed, "scheduler-plugins", "gang-sp") is None, 90, what="the PodGroup garbage-collected")


def test_a_volcano_gang_waits_for_its_queue_and_gives_its_pod_group_back_when_suspended(operator):
    """No worker pod while the PodGroup is Pending; they come once it is Inqueue."""
    bed = operator
    _install_crds(bed)
    create(bed, NS, _gang("gang-volcano", "volcano"))
    try:
        wait_for(lambda: _pod_group(bed, "volcano", "gang-volcano"), 60, what="the Volcano PodGroup")
        wait_status(bed, NS, "gang-volcano", lambda s: _condition(s, "PodGroupReady").get("reason") == "PodGroupPending", 60,
                    "PodGroupPending")
        time.sleep(4)  # two of the operator's polls of the phase
        assert pods(bed, NS, "gang-volcano") == [], "Volcano's admission would refuse them"
        assert pods(bed, NS, "gang-volcano", "rendezvous"), "the store does not wait"
        admitted = time.monotonic()
        bed.kubectl("patch", CRDS["volcano"][0], "gang-volcano", "-n", NS, "--type=merge", "-p", '{"status": {"phase": "Inqueue"}}')
        wait_for(lambda: len(pods(bed, NS, "gang-volcano")) == 2, 30, what="the workers once Volcano took the gang in")
        assert time.monotonic() - admitted < 15
        # Suspended, the job gives the PodGroup back (a Volcano queue would keep its resources).
        bed.kubectl("patch", "ltj", "gang-volcano", "-n", NS, "--type=merge", "-p", '{"spec": {"suspend": true}}')
        wait_for(lambda: _pod_group(bed, "volcano", "gang-volcano") is None, 60, what="the PodGroup of a suspended job gone")
    finally:
        bed.kubectl("delete", "ltj", "gang-volcano", "-n", NS, "--wait=false", check=False)


def test_an_admission_webhook_refusing_a_gang_jobs_pods_shows_in_a_condition_and_an_event_within_seconds(operator):
    bed = operator
    _install_crds(bed)
    with RefusingWebhook(bed.host_address) as hook:
        bed.kubectl("apply", "-f", "-", input=json.dumps(hook.configuration("e2e-refuse-gang", "gang-refused")))
        try:
            started = time.monotonic()
            create(bed, NS, _gang("gang-refused", "scheduler-plugins"))
            refused = wait_status(bed, NS, "gang-refused", lambda s: _condition(s, "ReplicaFailure").get("status") == "True",
                                  60, "ReplicaFailure")
            seen_after = time.monotonic() - started
            failure = _condition(refused, "ReplicaFailure")
            assert failure["reason"] == "FailedCreate" and REFUSAL in failure["message"], failure
            assert 'admission webhook "refuse.e2e.llmtrain.io" denied the request' in failure["message"]
            wait_event(bed, NS, "gang-refused", "FailedCreate", REFUSAL)
            assert seen_after < 20, f"the refusal showed after {seen_after:.1f}s"
            assert hook.seen, "the API server asked the webhook"
            assert not pods(bed, NS, "gang-refused") and not pods(bed, NS, "gang-refused", "rendezvous")
        finally:
            bed.kubectl("delete", "validatingwebhookconfiguration", "e2e-refuse-gang", "--ignore-not-found")
    # The webhook gone, the retries (with backoff) go through and the condition clears.
    wait_for(lambda: len(pods(bed, NS, "gang-refused")) == 2, 120, what="the workers once the webhook was removed")
    cleared = wait_status(bed, NS, "gang-refused", lambda s: _condition(s, "ReplicaFailure").get("status") == "False", 60,
                          "ReplicaFailure cleared")
    assert _condition(cleared, "ReplicaFailure")["reason"] == "CreatesAccepted"
    bed.kubectl("delete", "ltj", "gang-refused", "-n", NS, "--wait=false")
