"""Operator failover, eviction, suspend/resume, Prometheus scraping and garbage
collection, on one running job."""

from __future__ import annotations

import json
import re
import time


from support.waiting import wait_for

from .conftest import OPERATOR_NS
from .jobs import PVC, create, events, job_manifest, pods, status, wait_status
from .matrix import restores

NS, NAME = "e2e-lifecycle", "lifecycle"


def worker_uids(bed) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(bed, NS, NAME)}


def test_failover_eviction_suspend_resume_metrics_and_cleanup(operator, prometheus):
    bed = operator
    # A shared tier: checkpoints must outlive the pods that suspend deletes.
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("apply", "-n", NS, "-f", "-", input=PVC)
    # Effectively endless: the test ends the job by deleting it, and a fast machine must
    # not finish training before the last phase has been exercised.
    create(bed, NS, job_manifest(NAME, {"spec.trainer.builtin.maxSteps": 100000, "spec.checkpoint.intervalSteps": 5,
                                        "spec.checkpoint.shared": {"claimName": "ckpt-shared"}}))
    running = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 6, 300, "running")

    # 1. Operator failover: delete the operator pods; the job's pods must not notice.
    uids = worker_uids(bed)
    bed.kubectl("delete", "pod", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=llmtrain-operator", "--wait=false")
    time.sleep(3)
    assert worker_uids(bed) == uids
    bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=180s")
    moved_on = wait_status(bed, NS, NAME, lambda s: s.get("step", 0) > running["step"] + 3, 240, "status advancing after failover")
    assert worker_uids(bed) == uids, "an operator restart must not recreate running pods"
    assert moved_on["restarts"] == running["restarts"]

    # 2. Prometheus scrapes the trainers and the operator.
    assert prometheus.wait_value(f'max(llmtrain_trainer_step{{namespace="{NS}"}})', lambda v: v >= 6, 120) >= 6
    # The new active operator replica (counters restart with the process, as usual).
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

    # 3. An eviction (Eviction API) is a disruption, not a restart.
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

    # 4. Suspend: pods go away, status and checkpoints stay.
    bed.kubectl("patch", "ltj", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    suspended = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Suspended", 120, "suspended")
    wait_for(lambda: pods(bed, NS, NAME) == [], 120, what="the suspended job's pods gone")
    assert pods(bed, NS, NAME) == []
    saved = suspended["lastCheckpoint"]["step"]

    # 5. Resume: training continues from the newest checkpoint, no restart counted.
    bed.kubectl("patch", "ltj", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    resumed = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("step", 0) > suspended["step"], 300, "resumed")
    assert resumed["restarts"] == suspended["restarts"]
    logs = "\n".join(bed.pod_log(NS, p["metadata"]["name"]) for p in pods(bed, NS, NAME))
    steps = [int(m) for m in re.findall(r"resumed from step (\d+) ", logs)]
    assert steps and max(steps) >= saved, logs[-3000:]  # SIGTERM may have saved an even newer one
    reasons = set(events(bed, NS, NAME))
    assert {"Suspended", "Resumed", "PodDisrupted"} <= reasons, reasons
    assert bed.kubectl("get", "ltj", NAME, "-n", NS, "-o", "jsonpath={.status.conditions[?(@.type=='Suspended')].status}").stdout == "False"

    # 6. Deleting the job removes its children (ownerReferences + garbage collector).
    bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=true", "--timeout=60s")
    def children() -> list[dict]:
        return json.loads(bed.kubectl("get", "pods,services,configmaps", "-n", NS, "-l", f"llmtrain.io/job={NAME}", "-o", "json").stdout)["items"]

    wait_for(lambda: children() == [], 120, what="the children garbage-collected")
    assert children() == []
    assert status(bed, NS, NAME) == {}
