"""Operator failover, eviction, suspend/resume, Prometheus scraping and garbage
collection, on one running job (the module's ``job`` fixture). Each is a test of its own,
in order, so that a failed one hides nothing of the next."""

from __future__ import annotations

import json
import re
import time


import pytest
from support.waiting import wait_for

from .conftest import OPERATOR_NS
from .jobs import PVC, create, events, job_manifest, pods, status, wait_status
from .matrix import restores

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-lifecycle", "lifecycle"


def worker_uids(bed) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(bed, NS, NAME)}


def _running_two_of_two(bed) -> None:
    """A test's starting point: the job training with both workers (where the test before
    passed, at once)."""
    wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("workers") == "2/2", 180, "running 2/2")


@pytest.fixture(scope="module")
def job(operator):
    """The running job's status when it first ran past step 6 (``running``). The last test
    deletes the job; should it not get there, the job is deleted here."""
    bed = operator
    # A shared tier: checkpoints must outlive the pods that suspend deletes.
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("apply", "-n", NS, "-f", "-", input=PVC)
    # Effectively endless: the last test ends the job by deleting it, and a fast machine
    # must not finish training before the last phase has been exercised.
    create(bed, NS, job_manifest(NAME, {"spec.trainer.builtin.maxSteps": 100000, "spec.checkpoint.intervalSteps": 5,
                                        "spec.checkpoint.shared": {"claimName": "ckpt-shared"}}))
    running = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 6, 300, "running")
    yield {"running": running}
    # A job of 100000 steps must not outlive a failed test and load the modules after it.
    bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)


def test_an_operator_failover_leaves_the_running_pods_alone(operator, job):
    """The operator pods deleted: the job's pods must not notice."""
    bed, running = operator, job["running"]
    uids = worker_uids(bed)
    bed.kubectl("delete", "pod", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=llmtrain-operator", "--wait=false")
    time.sleep(3)
    assert worker_uids(bed) == uids
    bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=180s")
    moved_on = wait_status(bed, NS, NAME, lambda s: s.get("step", 0) > running["step"] + 3, 240, "status advancing after failover")
    assert worker_uids(bed) == uids, "an operator restart must not recreate running pods"
    assert moved_on["restarts"] == running["restarts"]


def test_prometheus_scrapes_the_trainers_and_the_operator_and_no_alert_fires(operator, prometheus, job):
    assert prometheus.wait_value(f'max(llmtrain_trainer_step{{namespace="{NS}"}})', lambda v: v >= 6, 120) >= 6
    # The active operator replica (after a failover its counters restarted with the process, as usual).
    assert prometheus.wait_value('sum(llmtrain_operator_jobs{phase="Running"})', lambda v: v >= 1, 120) >= 1
    assert prometheus.wait_value("sum(llmtrain_operator_reconcile_duration_seconds_count)", lambda v: v > 0, 60) > 0
    assert prometheus.wait_value(f'max(llmtrain_trainer_world_size{{namespace="{NS}"}})', lambda v: v == 2, 60) == 2
    # Throughput from the tokens counter (each node's local rank 0 counts its node's share).
    assert prometheus.wait_value(f'sum(rate(llmtrain_trainer_tokens_total{{namespace="{NS}",llmtrain_job="{NAME}"}}[30s]))',
                                 lambda v: v > 0, 60) > 0
    # The chart's alert rules evaluate against real series, and none fires for this job.
    rules = wait_for(lambda: (r := prometheus.rules()) and all(x["health"] == "ok" for x in r) and r, 60, what="the alert rules evaluated")
    assert {r["name"] for r in rules} >= {"LLMTrainJobFailed", "LLMTrainNoProgress", "LLMTrainCheckpointStale"}, rules
    assert not [a for r in rules for a in r.get("alerts", []) if a["labels"].get("llmtrain_job") == NAME], rules


def test_an_eviction_is_a_disruption_not_a_restart_and_loses_at_most_the_step_in_flight(operator, job):
    """An eviction through the Eviction API."""
    bed, running = operator, job["running"]
    _running_two_of_two(bed)
    victim = f"{NAME}-worker-1"
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": victim, "namespace": NS}}
    at, began = status(bed, NS, NAME).get("step", 0), time.time()
    bed.kubectl("create", "--raw", f"/api/v1/namespaces/{NS}/pods/{victim}/eviction", "-f", "-", input=json.dumps(eviction))
    evicted = wait_status(bed, NS, NAME, lambda s: s.get("disruptions", 0) >= 1, 120, "eviction counted")
    assert evicted["disruptions"] == 1 and evicted["restarts"] == running["restarts"], evicted
    wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("workers") == "2/2", 180, "back to 2/2 after the eviction")
    # SIGTERM gave the ranks their emergency checkpoint: at most the step in flight is lost.
    resumed = restores(bed, NS, NAME, since=began)
    assert resumed and min(r.step for r in resumed) >= at - 1, (at, resumed)
    # Events are posted after the status write, in the background.
    wait_for(lambda: "PodDisrupted" in set(events(bed, NS, NAME)), 30, 0.5, "a PodDisrupted Event")


def test_a_suspended_job_keeps_its_status_and_checkpoints_and_resumes_from_the_newest(operator, job):
    bed = operator
    _running_two_of_two(bed)
    # Suspend: pods go away, status and checkpoints stay.
    bed.kubectl("patch", "ltj", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    suspended = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Suspended", 120, "suspended")
    wait_for(lambda: pods(bed, NS, NAME) == [], 120, what="the suspended job's pods gone")
    assert pods(bed, NS, NAME) == []
    saved = suspended["lastCheckpoint"]["step"]

    # Resume: training continues from the newest checkpoint, no restart counted.
    bed.kubectl("patch", "ltj", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    resumed = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("step", 0) > suspended["step"], 300, "resumed")
    assert resumed["restarts"] == suspended["restarts"]
    logs = "\n".join(bed.pod_log(NS, p["metadata"]["name"]) for p in pods(bed, NS, NAME))
    steps = [int(m) for m in re.findall(r"resumed from step (\d+) ", logs)]
    assert steps and max(steps) >= saved, logs[-3000:]  # SIGTERM may have saved an even newer one
    reasons = set(events(bed, NS, NAME))
    assert {"Suspended", "Resumed"} <= reasons, reasons
    assert bed.kubectl("get", "ltj", NAME, "-n", NS, "-o", "jsonpath={.status.conditions[?(@.type=='Suspended')].status}").stdout == "False"


def test_deleting_the_job_garbage_collects_its_children(operator, job):
    """ownerReferences and the garbage collector."""
    bed = operator
    bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=true", "--timeout=60s")
    def children() -> list[dict]:
        return json.loads(bed.kubectl("get", "pods,services,configmaps", "-n", NS, "-l", f"llmtrain.io/job={NAME}",
                                      "-o", "json").stdout)["items"]

    wait_for(lambda: children() == [], 120, what="the children garbage-collected")
    assert children() == []
    assert status(bed, NS, NAME) == {}
