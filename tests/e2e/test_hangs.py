"""Hangs that the hung process cannot report, on the cluster: a job's only rank frozen
(SIGSTOP), a rank holding the GIL in native code while its peer waits in a real
collective, and a whole worker pod frozen (launcher, torchrun and ranks; replaced on its
peer's reports). Each is detected from outside the failing process, blamed on the right
pod and node in the status and Events, never charged to the victims, and the jobs succeed.

Two jobs (the module's ``jobs`` fixture) go through these faults; each fault's checks are
a test of their own, in order, so that a failed one hides nothing of the next, and the
last tests check how each job ended.

Sanity bounds only; detection and recovery times are measured by bench/recovery.py."""

from __future__ import annotations

import json
import time

import pytest
from support.waiting import wait_for

from .jobs import GANG, create, job_manifest, pod_with_marker, pods, run_dir, wait_event, wait_status
from .matrix import check_counters, restores

pytestmark = pytest.mark.e2e

NS = "e2e-hangs"
HANG = 10
FAULTS = "LLMTRAIN_FAULT_INJECT"
PACE = "slow@step=1,seconds=0.5,steps=200"
"""Every step takes >= 0.5 s: the jobs cannot finish before their faults are handled."""
COMMON = {"spec.faultTolerance.hangTimeoutSeconds": HANG, "spec.faultTolerance.progressTimeoutSeconds": 600,
          "spec.faultTolerance.maxRestarts": 6, "spec.checkpoint.intervalSteps": 5}
GIL_MARKER = "fault-0-rank-1.fired"


@pytest.fixture(scope="module")
def jobs(operator):
    """Both jobs, created together; their faults fire on their own (the spec's fault
    injection) but for the frozen pod, which its test makes. What one test hands to the
    next goes into the dict."""
    bed = operator
    # The single job also meets bad numerics later: a NaN at step 20 rolls it back to
    # step 15 and skips the samples of steps 16..20 (8 per step).
    create(bed, NS, job_manifest("single", {**COMMON, "spec.replicas": {"min": 1, "max": 1}, "spec.trainer.builtin.maxSteps": 30,
                                            "spec.env": [{"name": FAULTS, "value": f"stop@step=8,rank=0;nan@step=20,rank=0;{PACE}"}]}))
    # The pair job also gets a straggler late: steps 45..56 of rank 1 take 2.5 s longer,
    # a ratio above the factor 2 even when a loaded machine adds seconds to every step. A
    # gang: its faults need a rank 1 at steps 8 and 45.
    create(bed, NS, job_manifest("pair", {**COMMON, **GANG, "spec.trainer.builtin.maxSteps": 70,
                                          "spec.faultTolerance.stragglers": {"factor": 2, "steps": 5},
                                          "spec.env": [{"name": FAULTS,
                                                        "value": f"gil@step=8,rank=1;slow@step=45,rank=1,seconds=2.5,steps=12;{PACE}"}]}))
    return {}


def _finished(bed, job: str) -> dict:
    return wait_status(bed, NS, job, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, f"{job} finished")


def test_a_frozen_only_rank_is_ended_by_its_launcher_and_restored_from_tier_1(operator, jobs):
    """The job's only rank is frozen: its own watchdog thread is frozen with it, and nobody
    else is left to time out. The launcher's supervisor ends it; torchrun restarts it in
    place."""
    bed = operator
    single = wait_status(bed, NS, "single", lambda s: s.get("restartsByReason", {}).get("Hang", 0) >= 1, 240, "the frozen rank detected")
    failure = single["lastFailure"]
    (pod,) = pods(bed, NS, "single")
    assert (failure["kind"], failure["reason"], failure["pod"], failure["node"]) == \
        ("Hang", "Hang", "single-worker-0", pod["spec"]["nodeName"]), failure
    wait_event(bed, NS, "single", "RestartedInPlace", f"pod single-worker-0 on node {pod['spec']['nodeName']}")
    # Frozen at step 8, restored at most one interval back, from its node-local tier.
    frozen_at = float((run_dir(bed, pod) / "faults" / "fault-0-rank-0.fired").read_text())
    resumed = wait_for(lambda: restores(bed, NS, "single", since=frozen_at), 120, 1, "the single job's restore")
    assert min(r.step for r in resumed) >= 8 - COMMON["spec.checkpoint.intervalSteps"] and resumed[0].tier == "local", resumed


def test_a_rank_holding_the_gil_is_blamed_its_blocked_peer_is_not_and_the_pair_resumes(operator, jobs):
    """Rank 1 holds the GIL; rank 0 waits for it in the gradient all-reduce. Only the
    spinning rank's pod is charged."""
    bed = operator
    pair = wait_status(bed, NS, "pair", lambda s: s.get("restartsByReason", {}).get("Hang", 0) >= 1, 240, "the GIL-holding rank detected")
    cause = pod_with_marker(bed, NS, "pair", GIL_MARKER)
    jobs["cause"] = cause
    failure = pair["lastFailure"]
    assert (failure["kind"], failure["pod"], failure["node"]) == ("Hang", cause["metadata"]["name"], cause["spec"]["nodeName"]), failure
    assert pair["restartsByReason"] == {"Hang": 1}, pair["restartsByReason"]
    wait_status(bed, NS, "pair", lambda s: s.get("lastRecoverySeconds") is not None and s.get("step", 0) >= 15, 240, "training again")
    # The restore after the hang lost at most one interval (the fault fired at step 8;
    # its marker holds the moment, so the pair's growth to two workers is left out).
    fired = float((run_dir(bed, cause) / "faults" / GIL_MARKER).read_text())
    resumed = restores(bed, NS, "pair", since=fired)
    assert resumed and min(r.step for r in resumed) >= 8 - COMMON["spec.checkpoint.intervalSteps"], resumed


def test_a_frozen_pod_is_replaced_on_its_peers_reports_and_charged_as_a_hang_on_it(operator, jobs):
    """The whole other pod is frozen (launcher, torchrun, ranks): nothing in it can report.
    Its peer's supervisor judges its own ranks victims after hangTimeoutSeconds and its
    launcher says they wait on a peer; the operator, whose probes of the frozen launcher go
    unanswered, replaces that pod and charges a hang on it (policies/frozen_pods.py). The
    liveness probe, the second line, would fire only 20 s later: a kill by it would say
    Signal9. The survivor's ranks were victims, not charged."""
    bed = operator
    # The pair training again after the GIL hang: where the test before passed, at once.
    wait_status(bed, NS, "pair", lambda s: s.get("lastRecoverySeconds") is not None and s.get("step", 0) >= 15, 240, "training again")
    cause = jobs.get("cause") or pod_with_marker(bed, NS, "pair", GIL_MARKER)
    frozen = next(p for p in pods(bed, NS, "pair") if p["metadata"]["name"] != cause["metadata"]["name"])
    name = frozen["metadata"]["name"]
    frozen_at = time.monotonic()
    bed.kill_pod(NS, name, "SIGSTOP")
    replaced = wait_status(bed, NS, "pair", lambda s: s.get("restarts", 0) >= 2, 240, "the frozen pod replaced")
    seen_after = time.monotonic() - frozen_at
    failure = replaced["lastFailure"]
    assert (failure["pod"], failure["node"]) == (name, frozen["spec"]["nodeName"]), failure
    assert (failure["kind"], failure["reason"]) == ("Hang", "Hang"), failure
    assert "has not answered" in failure["message"] and "blocked waiting for a peer" in failure["message"], failure
    assert replaced["restartsByReason"] == {"Hang": 2}, replaced["restartsByReason"]
    # A sanity bound only (bench/recovery.py measures it): before the liveness probe could act.
    assert seen_after < HANG + 20, seen_after
    wait_event(bed, NS, "pair", "PodUnresponsive", name)


def test_a_straggler_is_reported_with_its_rank_pod_and_node_and_not_charged(operator, jobs):
    bed = operator
    slow = wait_status(bed, NS, "pair", lambda s: any(c["type"] == "Straggler" and c["status"] == "True" for c in s.get("conditions", [])),
                       300, "the straggler reported")
    message = next(c["message"] for c in slow["conditions"] if c["type"] == "Straggler")
    holders = [p for p in pods(bed, NS, "pair") if f"rank 1 in pod {p['metadata']['name']} on node {p['spec']['nodeName']}" in message]
    assert len(holders) == 1, message
    wait_event(bed, NS, "pair", "Straggler", f"rank 1 in pod {holders[0]['metadata']['name']}")
    assert slow["restartsByReason"] == {"Hang": 2}


def test_the_single_job_rolls_back_its_nan_and_succeeds_charged_only_its_hang(operator, jobs):
    bed = operator
    single = _finished(bed, "single")
    assert single["phase"] == "Succeeded", json.dumps(single)[:3000]
    assert single["restartsByReason"] == {"Hang": 1}, "a rollback is not a restart"
    assert single["numerics"] == {"rollbacks": 1, "skipped": [{"firstStep": 16, "lastStep": 20, "firstSample": 120, "endSample": 160}]}
    wait_event(bed, NS, "single", "RolledBack", "samples 120..159")


def test_the_pair_succeeds_charged_its_hang_and_its_frozen_pod_once_each(operator, jobs):
    bed = operator
    pair = _finished(bed, "pair")
    assert pair["phase"] == "Succeeded", json.dumps(pair)[:3000]
    assert pair["restartsByReason"] == {"Hang": 2}


def test_prometheus_has_the_two_jobs_charges_as_the_operator_counted_them(operator, prometheus, jobs):
    bed = operator
    for job in ("single", "pair"):
        _finished(bed, job)
    check_counters(prometheus, NS, by_reason={"Hang": 3}, succeeded=2)
