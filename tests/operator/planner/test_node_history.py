"""A node that keeps killing the job's pods (planner/node_history.py): one charge per
episode, quarantined at the threshold, replacements elsewhere; a crash the launcher
reports stays the program's."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from llmtrain_operator.api.observed import NodeView
from llmtrain_operator.planner import plan
from support.planning import NOW, job, observed, running_status, summary, worker

W0 = "tiny-elastic-worker-0"


def killed(uid: str, node: str = "node-0", report: dict | None = None, code: int = 137, reason: str = "Error"):
    pod = worker(0, phase="Failed", node=node, exit_code=code, reason=reason, termination=report or {})
    return dataclasses.replace(pod, uid=uid)


def fail_repeatedly(pods, spacing: float = 30.0, changes=None):
    """One pass per failure, each pod failed ``spacing`` seconds after the last; the status carried."""
    # No progress is reported in these passes: the wedge backstop is off, to see only the charges.
    raw = job({"spec.faultTolerance.progressTimeoutSeconds": 0, **(changes or {})}, status=running_status())
    results = []
    for i, pod in enumerate(pods):
        result = plan(raw, observed(raw, [pod, worker(1)]), NOW + timedelta(seconds=i * spacing))
        raw = {**raw, "status": result.status}
        results.append(result)
    return results


def test_a_node_that_keeps_killing_the_jobs_pods_is_charged_once_and_quarantined():
    results = fail_repeatedly([killed(f"u{i}") for i in range(5)])
    final = results[-1].status
    assert final["restarts"] == 1, final["restartsByReason"]  # five kills in two minutes: one episode
    assert [q["node"] for q in final["quarantinedNodes"]] == ["node-0"]
    quarantined = [r for r in results if "NodeQuarantined" in [e.reason for e in r.events]]
    assert quarantined and quarantined[0] is results[1]  # at the second kill (threshold 2)
    for r in results:
        assert f"keep {W0}" in summary(r.actions)  # every failed pod is replaced (and kept for its log)
    assert any("the same episode" in e.message for e in results[2].events)


def test_the_replacement_avoids_the_quarantined_node():
    results = fail_repeatedly([killed("u0"), killed("u1")])
    raw = job({"spec.faultTolerance.progressTimeoutSeconds": 0}, status=results[-1].status)
    created = plan(raw, observed(raw, [worker(1)]), NOW + timedelta(seconds=120))
    pod = next(a.manifest for a in created.actions if getattr(a, "manifest", {}).get("kind") == "Pod")
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert any(e["operator"] == "NotIn" and "node-0" in e["values"] for t in terms for e in t["matchExpressions"])


def test_kills_further_apart_than_the_window_are_separate_episodes():
    results = fail_repeatedly([killed("u0"), killed("u1")], spacing=700)
    assert results[-1].status["restarts"] == 2
    assert not results[-1].status.get("quarantinedNodes")


def test_crashes_the_launcher_reports_are_the_programs_and_never_count_against_the_node():
    report = {"code": 1, "reason": "Crash", "message": "ValueError: boom"}
    results = fail_repeatedly([killed(f"u{i}", code=1, report=report) for i in range(3)])
    assert results[-1].status["restarts"] == 3
    assert not results[-1].status.get("quarantinedNodes")
    oom = fail_repeatedly([killed(f"u{i}", reason="OOMKilled") for i in range(3)])
    assert oom[-1].status["restarts"] == 3 and not oom[-1].status.get("quarantinedNodes")


def test_kills_on_different_nodes_are_each_charged():
    results = fail_repeatedly([killed("u0", node="node-0"), killed("u1", node="node-2"), killed("u2", node="node-3")])
    assert results[-1].status["restarts"] == 3


def test_a_node_flapping_past_the_grace_is_charged_once_per_window():
    raw = job({"spec.faultTolerance.progressTimeoutSeconds": 0, "spec.faultTolerance.nodeFailureGraceSeconds": 10},
              status=running_status())
    restarts = []
    for i in range(3):
        now = NOW + timedelta(seconds=i * 120)
        pod = dataclasses.replace(worker(0, node="node-0"), uid=f"u{i}")
        nodes = [NodeView("node-0", "Unknown", now - timedelta(seconds=30))] + [NodeView(f"node-{j}", "True", NOW) for j in (1, 2, 3)]
        result = plan(raw, observed(raw, [pod, worker(1)], nodes=nodes), now)
        raw = {**raw, "status": result.status}
        restarts.append(result.status["restartsByReason"].get("NodeFailure", 0))
    assert restarts == [1, 1, 1]


def test_a_kill_and_a_later_notready_episode_on_one_node_are_two_charges():
    results = fail_repeatedly([killed("u0")])
    raw = job({"spec.faultTolerance.progressTimeoutSeconds": 0, "spec.faultTolerance.nodeFailureGraceSeconds": 10},
              status=results[-1].status)
    later = NOW + timedelta(seconds=120)
    nodes = [NodeView("node-0", "Unknown", later - timedelta(seconds=30))] + [NodeView(f"node-{j}", "True", NOW) for j in (1, 2, 3)]
    pod = dataclasses.replace(worker(0, node="node-0"), uid="u9")
    result = plan(raw, observed(raw, [pod, worker(1)], nodes=nodes), later)
    assert result.status["restartsByReason"] == {"Signal9": 1, "NodeFailure": 1}


def test_a_node_that_never_stops_is_charged_again_each_window_so_the_budget_ends_it():
    # A kill every 300 s for 25 minutes, window 600 s: charged at 0, 600 (new episode), 1200.
    results = fail_repeatedly([killed(f"u{i}") for i in range(6)], spacing=300,
                              changes={"spec.faultTolerance.nodeQuarantineSeconds": 0})
    assert [r.status.get("restarts", 0) for r in results] == [1, 1, 2, 2, 3, 3]
    # No quarantine configured: no Event claims one.
    assert not any("NodeQuarantined" in [e.reason for e in r.events] for r in results)


def test_the_quarantine_event_comes_once():
    results = fail_repeatedly([killed(f"u{i}") for i in range(4)])
    assert sum("NodeQuarantined" in [e.reason for e in r.events] for r in results) == 1


def test_kills_on_more_nodes_than_the_bookkeeping_follows_are_charged_alone_and_quarantine_keeps_its_newest():
    from llmtrain_operator.planner.node_history import MAX_NODES_KEPT
    from llmtrain_operator.planner.quarantine import MAX_QUARANTINED

    nodes = MAX_QUARANTINED + 20  # each killed once: threshold 1 quarantines it
    results = fail_repeatedly([killed(f"u{i}", node=f"node-{i}") for i in range(nodes)], spacing=1.0,
                              changes={"spec.faultTolerance.nodeFailureThreshold": 1, "spec.faultTolerance.maxRestarts": 10_000})
    final = results[-1].status
    book = final["internal"]["nodeFailures"]
    followed = {f"node-{i}" for i in range(MAX_NODES_KEPT)}
    assert set(book) == followed | {f"charged:{n}" for n in followed}  # the first ones, each whole
    assert final["restarts"] == nodes  # every one an episode of its own
    quarantined = [q["node"] for q in final["quarantinedNodes"]]
    assert len(quarantined) == MAX_QUARANTINED and quarantined[-1] == f"node-{nodes - 1}" and "node-0" not in quarantined


def test_nodes_failing_in_turn_beyond_what_is_followed_keep_the_followed_ones_episodes():
    from llmtrain_operator.planner.node_history import MAX_NODES_KEPT

    nodes = MAX_NODES_KEPT + 6
    # Every node killed twice within the window, its second kill after every other node's first.
    pods = [killed(f"a{i}", node=f"node-{i}") for i in range(nodes)] + [killed(f"b{i}", node=f"node-{i}") for i in range(nodes)]
    results = fail_repeatedly(pods, spacing=1.0, changes={"spec.faultTolerance.maxRestarts": 10_000})
    # The followed nodes' second kills merge into their episodes; the six others count alone.
    assert results[-1].status["restarts"] == nodes + 6
    assert len({k.removeprefix("charged:") for k in results[-1].status["internal"]["nodeFailures"]}) == MAX_NODES_KEPT
