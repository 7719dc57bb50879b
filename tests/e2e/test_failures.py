"""A job on the cluster loses a process and then a whole node, recovers from both, and
succeeds. One job goes through both faults (the module's ``job`` fixture); each fault's
checks are a test of their own, in order, so that a failed one hides nothing of the
next, and the last test checks the job's end.

The time bounds here are sanity bounds, not the performance targets: those are measured
by bench/recovery.py (docs/benchmarks.md), never by timed tests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.waiting import wait_for

from .jobs import PVC, create, events, finished_released_once_whole, job_manifest, pods, status, wait_status
from .matrix import check_counters, restores

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-failures", "survivor"
RELEASE = "release-pacing"
DETECT_BOUND = 5.0
RECOVERY_BOUND = 60.0
GRACE = 10


@pytest.fixture(scope="module")
def job(operator):
    """The job, running past step 12; what one test hands to the next (the node it
    failed, the status before) goes into the dict. The failed node is healed at the end,
    once the job has ended, whatever failed."""
    bed = operator
    # A shared tier (a ReadWriteMany PVC): a lost node must not take the only copy of the
    # newest checkpoint with it.
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("apply", "-n", NS, "-f", "-", input=PVC)
    create(bed, NS, job_manifest(NAME, {
        "spec.trainer.builtin.maxSteps": 90, "spec.checkpoint.intervalSteps": 10,
        "spec.checkpoint.shared": {"claimName": "ckpt-shared", "intervalSteps": 10},
        "spec.faultTolerance.nodeFailureGraceSeconds": GRACE, "spec.faultTolerance.maxRestarts": 6,
        # Pacing: from step 20 every step takes >= 1 s, so that the survivor cannot finish
        # all 90 steps alone before the node loss is even detected (NotReady after 16 s,
        # then the grace); unpaced, a fast run sometimes did. Released once both faults
        # are handled and the replacement trains (the last test): the job does not sit
        # out the rest.
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": f"slow@step=20,seconds=1,steps=70,until={RELEASE}"}],
    }))
    wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 12, 300, "running past step 12")
    run: dict = {}
    yield run
    if run.get("node"):
        bed.heal_node(run["node"])


def test_a_process_crash_is_charged_to_its_pod_and_recovered(operator, job):
    """Every process of worker-1 is SIGKILLed."""
    bed = operator
    before = bed.pod_log(NS, f"{NAME}-worker-1", "trainer")
    bed.kill_pod(NS, f"{NAME}-worker-1")
    crashed = wait_status(bed, NS, NAME, lambda s: s.get("restarts", 0) >= 1, 60, "crash detected")
    failure = crashed["lastFailure"]
    assert (failure["kind"], failure["reason"], failure["pod"]) == ("ProcessCrash", "Signal9", f"{NAME}-worker-1")
    assert failure["detectSeconds"] <= DETECT_BOUND, failure
    recovered = wait_status(bed, NS, NAME, lambda s: s.get("lastRecoverySeconds") is not None, 180, "recovered from the crash")
    crash_recovery = recovered["lastRecoverySeconds"]
    # The crashed pod is kept with its log; its slot runs a new pod under the next name
    # and the same host name (the job's DNS names do not change).
    assert recovered["keptPods"] == [f"{NAME}-worker-1"], recovered.get("keptPods")
    (kept,) = pods(bed, NS, NAME, kept=True)
    assert kept["metadata"]["name"] == f"{NAME}-worker-1" and kept["status"]["phase"] == "Failed"
    job["kept_node"] = kept["spec"]["nodeName"]
    assert bed.pod_log(NS, f"{NAME}-worker-1", "trainer").startswith(before), "the failed attempt's log is kept, as it was"
    # An elastic job recovers on its survivor first; the slot's next pod follows after the
    # backoff (on kind it was not there yet when the recovery was: waited for, not assumed).
    (new,) = wait_for(lambda: [p for p in pods(bed, NS, NAME) if p["metadata"]["labels"]["llmtrain.io/slot"] == "1"] or None, 60,
                      what="the slot's next pod")
    assert new["metadata"]["name"] == f"{NAME}-worker-1-1" and new["spec"]["hostname"] == f"{NAME}-worker-1"
    timings = {"crash_detect_seconds": failure["detectSeconds"], "crash_recovery_seconds": crash_recovery}
    assert crash_recovery <= RECOVERY_BOUND, timings


def test_a_lost_node_is_charged_once_the_survivor_trains_on_and_the_replacement_avoids_it(operator, job):
    """Heartbeats stop and every process on the node dies."""
    bed = operator
    # Both workers training again, not in the middle of a recovery: after the crash test
    # the survivor trains alone until the crashed pod's replacement has rejoined, and a
    # node lost meanwhile (the replacement's) would cost the survivor nothing to restore.
    wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("worldSize") == 2
                and (s.get("restarts", 0) == 0 or s.get("lastRecoverySeconds") is not None), 240, "two workers training")
    # Which pod holds which rank (status.ranks), and `llmtrain logs --rank 1` reads that pod's log.
    placed = wait_status(bed, NS, NAME, lambda s: [(h["first"], h["last"]) for h in s.get("ranks", [])] == [(0, 0), (1, 1)],
                         60, "both ranks placed in the status")
    holder = placed["ranks"][1]["pod"]
    assert {h["pod"] for h in placed["ranks"]} <= {p["metadata"]["name"] for p in pods(bed, NS, NAME)}, placed["ranks"]
    assert placed["ranks"][0]["pod"] == placed["rankZero"]["pod"] != holder, placed
    cli = str(Path(sys.executable).with_name("llmtrain"))
    shown = subprocess.run([cli, "logs", NAME, "-n", NS, "--rank", "1"], capture_output=True, text=True, env=bed.env(), timeout=60)
    if bed.serves_pod_logs:
        assert shown.returncode == 0 and shown.stdout, shown.stderr
        assert bed.pod_log(NS, holder, "trainer").startswith(shown.stdout), "rank 1's log is its pod's"
    else:  # the process bed has no kubelet API: the command names the pod it could not read
        assert shown.returncode == 1 and f"cannot read the log of pod {holder}" in shown.stderr, shown.stderr
    # Choose a worker's node that does not also host the rendezvous store (and, where
    # there is one, not the crashed pod kept for its log: read at the end, through its
    # node's kubelet on real nodes).
    store_node = pods(bed, NS, NAME, role="rendezvous")[0]["spec"]["nodeName"]
    kept_nodes = {p["spec"].get("nodeName") for p in pods(bed, NS, NAME, kept=True)}
    running = [p for p in pods(bed, NS, NAME) if p["spec"].get("nodeName") not in (None, store_node)
               and p.get("status", {}).get("phase") == "Running"]
    victim = next((p for p in running if p["spec"]["nodeName"] not in kept_nodes), running[0])
    node = victim["spec"]["nodeName"]
    before, began = status(bed, NS, NAME), time.time()
    job.update(node=node, before=before)
    bed.fail_node(node)
    lost = wait_status(bed, NS, NAME, lambda s: s.get("restartsByReason", {}).get("NodeFailure", 0) >= 1, 180, "node failure handled")
    assert lost["restartsByReason"]["NodeFailure"] == 1, lost["restartsByReason"]
    assert lost["lastFailure"]["node"] == node
    assert node in [q["node"] for q in lost["quarantinedNodes"]]
    node_detect = lost["lastFailure"]["detectSeconds"]  # from the node turning NotReady
    assert node_detect <= GRACE + 5, lost["lastFailure"]
    after_loss = wait_status(bed, NS, NAME, lambda s: s.get("lastFailure", {}).get("kind") == "NodeFailure"
                             and s.get("lastRecoverySeconds") is not None, 240, "training again after the node loss")
    node_recovery = after_loss["lastRecoverySeconds"]
    # The survivor resumed at most one interval back.
    resumed = restores(bed, NS, NAME, since=began)
    assert resumed and min(r.step for r in resumed) >= before["step"] - 10, (before["step"], resumed)
    # The survivor went on at a smaller world size; the replacement arrives after the
    # backoff, on another node.
    slot = victim["metadata"]["labels"]["llmtrain.io/slot"]
    replacement = wait_for(lambda: [p for p in pods(bed, NS, NAME) if p["metadata"]["labels"]["llmtrain.io/slot"] == slot
                                    and p["metadata"]["uid"] != victim["metadata"]["uid"] and p["spec"].get("nodeName")],
                           120, what="a replacement scheduled")
    assert replacement[0]["spec"]["nodeName"] != node, "the replacement avoids the failed node"
    timings = {"node_detect_seconds_after_not_ready": node_detect, "node_recovery_seconds": node_recovery}
    assert node_recovery <= RECOVERY_BOUND, timings


def test_the_job_succeeds_with_each_failure_charged_once(operator, prometheus, job):
    bed = operator

    done = wait_status(bed, NS, NAME, finished_released_once_whole(bed, NS, NAME, RELEASE), 900, "finished")
    assert done["phase"] == "Succeeded", json.dumps(done)[:3000]
    assert bed.kubectl("wait", "--for=condition=Succeeded", f"ltj/{NAME}", "-n", NS, "--timeout=5s").returncode == 0
    # One charge per failure; the survivors' groups that failed because their peer
    # vanished are victims, never charged.
    assert done["restartsByReason"] == {"Signal9": 1, "NodeFailure": 1}, done["restartsByReason"]
    check_counters(prometheus, NS, by_reason={"Signal9": 1, "NodeFailure": 1}, succeeded=1)
    assert done["restarts"] == 2
    assert done["step"] == 90 and done["lastCheckpoint"]["step"] >= 80
    shared = bed.state / "pvs" / f"pv-{NS}-ckpt-shared" / NS / NAME
    assert (shared / "step-00000090" / "COMMITTED").exists(), sorted(p.name for p in shared.glob("*"))
    reasons = set(events(bed, NS, NAME))
    assert {"Created", "CreatedWorkers", "PodFailed", "NodeFailure", "Completed"} <= reasons, reasons

    table = bed.kubectl("get", "ltj", "-n", NS).stdout.splitlines()
    assert table[0].split()[:7] == ["NAME", "PHASE", "WORKERS", "STEP", "RESTARTS", "LAST", "CHECKPOINT"]
    assert table[1].split()[:5] == [NAME, "Succeeded", "0/2", "90/90", str(done["restarts"])]
    wide = bed.kubectl("get", "ltj", "-n", NS, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["LOSS", "TOKENS/S", "ETA"], wide[0]
    # Columns by their header's position: an empty one (no ETA once finished) prints nothing.
    column = {name: wide[0].index(name) for name in ("LOSS", "TOKENS/S", "ETA")}
    loss, tokens = wide[1][column["LOSS"]:column["TOKENS/S"]].strip(), wide[1][column["TOKENS/S"]:column["ETA"]].strip()
    assert float(loss) == done["loss"] and float(tokens) == done["tokensPerSecond"] > 0, wide
    assert wide[1][column["ETA"]:].strip() == "" and "eta" not in done, wide
    # The loss is step 90's, as rank 0 printed it, though no scrape may have seen step 90:
    # the pods' termination messages carry it (a job ends between two scrapes).
    last = re.search(r"step\s+90/90 \| loss ([0-9.]+)", bed.pod_log(NS, done["rankZero"]["pod"]))
    assert last and float(last.group(1)) == done["loss"], (last and last.group(0), done["loss"])
    # What a user reads next: `llmtrain status` and rank 0's log through the API server
    # (`llmtrain logs -f` returns once the job has ended).
    cli = str(Path(sys.executable).with_name("llmtrain"))
    shown = subprocess.run([cli, "status", NAME, "-n", NS], capture_output=True, text=True, env=bed.env(), timeout=60)
    assert shown.returncode == 0 and f"{NAME} ({NS}): Succeeded, step 90/90" in shown.stdout, shown.stdout + shown.stderr
    assert "NodeFailure 1" in shown.stdout and "Signal9 1" in shown.stdout, shown.stdout
    assert done["rankZero"]["pod"] in {p["metadata"]["name"] for p in pods(bed, NS, NAME)}, done.get("rankZero")
    logs = subprocess.run([cli, "logs", NAME, "-n", NS, "-f"], capture_output=True, text=True, env=bed.env(), timeout=120)
    if bed.serves_pod_logs:
        assert logs.returncode == 0 and "step     90/90" in logs.stdout, logs.stdout[-3000:] + logs.stderr
    else:  # the process bed has no kubelet API: the command names the pod it could not read
        assert logs.returncode == 1 and f"cannot read the log of pod {done['rankZero']['pod']}" in logs.stderr, logs.stderr
    # The crashed pod's log, kept with it (the node lost took its pod and that log along).
    failed = subprocess.run([cli, "logs", NAME, "-n", NS, "--failed"], capture_output=True, text=True, env=bed.env(), timeout=60)
    assert f"----- failed pod {NAME}-worker-1: its log as it ended -----" in failed.stderr, failed.stderr
    if bed.serves_pod_logs and job.get("kept_node") != job.get("node"):
        assert failed.returncode == 0, failed.stderr
    else:  # no kubelet API (the process bed), or the kept pod's node is the one still down
        assert failed.returncode == 1 and f"cannot read the log of pod {NAME}-worker-1" in failed.stderr, failed.stderr
    assert done["keptPods"] == [f"{NAME}-worker-1"], done.get("keptPods")
    # Attempt 0 of slot 1, from its pod now (the slot's newest): the crashed pod, kept.
    (current,) = [p["metadata"]["name"] for p in pods(bed, NS, NAME) if p["metadata"]["labels"]["llmtrain.io/slot"] == "1"]
    first = subprocess.run([cli, "logs", NAME, "-n", NS, "--pod", current, "--attempt", "0"], capture_output=True, text=True,
                           env=bed.env(), timeout=60)
    assert f"----- pod {NAME}-worker-1: attempt 0 of worker slot 1 (Failed, kept) -----" in first.stderr, first.stderr
    assert first.returncode == failed.returncode and first.stdout == failed.stdout, first.stderr
    # The crash was charged before the node was lost.
    assert "before" in job, "the node-loss test lost no node"
    assert job["before"]["restarts"] >= 1
