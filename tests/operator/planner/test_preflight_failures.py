"""A pod whose launcher's pre-flight check found its node's network too slow (exit 87,
``PreflightFailed``): the node's fault, not the job's. The pod is replaced, the node
quarantined for the job so the replacement lands elsewhere, nothing charged."""

from __future__ import annotations

from llmtrain_operator.planner import plan
from support.planning import NOW, job, observed, running_status, summary, worker

W1 = "tiny-elastic-worker-1"
SAID = {"code": 87, "reason": "PreflightFailed",
        "message": "the pre-flight echo through the rendezvous store at tiny-elastic-rdzv:29401 ran at 1.2 MB/s (the best "
                   "of 5 rounds of 4 MiB), below faultTolerance.preflightMinMbps=50: this node's network is too slow to join"}


def test_a_failed_pre_flight_quarantines_the_node_and_replaces_the_pod_uncharged():
    raw = job(status=running_status())
    failed = worker(1, phase="Failed", exit_code=87, termination=SAID, node="node-1", uid="u1")
    result = plan(raw, observed(raw, [worker(0), failed]), NOW)
    status = result.status
    assert status.get("restarts", 0) == 0 and status["disruptions"] == 1
    assert [q["node"] for q in status["quarantinedNodes"]] == ["node-1"]
    failure = status["lastFailure"]
    assert (failure["kind"], failure["reason"], failure["pod"], failure["node"]) == ("NodeFailure", "PreflightFailed", W1, "node-1")
    assert "1.2 MB/s" in failure["message"]
    assert any(e.reason == "PreflightFailed" and "1.2 MB/s" in e.message and e.type == "Warning" for e in result.events)
    assert f"keep {W1}" in summary(result.actions)
    # The next pass creates the slot's next pod, kept off the node.
    later = {**raw, "status": status}
    kept = worker(1, phase="Failed", exit_code=87, termination=SAID, node="node-1", uid="u1", kept=True)
    again = plan(later, observed(later, [worker(0), kept]), NOW)
    created = [a for a in again.actions if getattr(a, "kind", "") == "Pod"]
    assert created and "node-1" in str(created[0].manifest["spec"]["affinity"]), created
    assert again.status.get("restarts", 0) == 0


def test_a_pre_flight_failure_with_no_budget_left_still_fails_nothing():
    raw = job({"spec.faultTolerance.maxRestarts": 0}, status=running_status())
    failed = worker(1, phase="Failed", exit_code=87, termination=SAID, uid="u1")
    result = plan(raw, observed(raw, [worker(0), failed]), NOW)
    assert result.status["phase"] in ("Running", "Restarting") and result.status.get("restarts", 0) == 0


def _preflight_env(result) -> list[str]:
    pods = [a.manifest for a in result.actions if getattr(a, "kind", "") == "Pod" and "worker" in a.manifest["metadata"]["name"]]
    assert pods, result.actions
    return [e.get("value") for p in pods for e in p["spec"]["containers"][0]["env"] if e["name"] == "LLMTRAIN_PREFLIGHT_MIN_MBPS"]


def test_only_a_pod_joining_a_job_that_has_trained_checks_its_network_and_0_turns_it_off():
    # A new job's first pods start with their store: no check.
    fresh = job()
    first = plan(fresh, observed(fresh, []), NOW)
    assert _preflight_env(first) == []
    # A replacement joins a job that has trained: checked against the floor.
    raw = job(status=running_status())
    replaced = plan(raw, observed(raw, [worker(0)]), NOW)
    assert _preflight_env(replaced) == ["50"]
    off = job({"spec.faultTolerance.preflightMinMbps": 0}, status=running_status())
    assert _preflight_env(plan(off, observed(off, [worker(0)]), NOW)) == []
