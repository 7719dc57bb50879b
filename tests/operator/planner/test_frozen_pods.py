"""A pod frozen whole is replaced on its peers' reports (their ranks blocked on a peer,
``Observed.peer_waits``) once its own launcher's silence is confirmed
(``Observed.silent``) and its kubelet reports it not ready, charged as a ``Hang`` on that
pod; a pod that is merely silent, a replacement still starting, a pod still ready (a
partitioned node's), a pod whose "not ready" predates its launcher's last answer, a failed
node's pod and a pod already charged are not."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from llmtrain_operator.planner import plan
from llmtrain_operator.planner.policies.frozen_pods import CONFIRM_SECONDS, RECHECK_SECONDS
from support.planning import NOW, job, node, observed, running_status, summary, worker

W0, W1, W2 = "tiny-elastic-worker-0", "tiny-elastic-worker-1", "tiny-elastic-worker-2"
FOUR = {"spec.replicas": {"min": 4, "max": 4}}


def test_a_silent_pod_its_peers_wait_on_is_force_deleted_and_charged_as_a_hang_on_it():
    raw = job(status=running_status())
    pods = [worker(0, uid="u0"), worker(1, uid="u1", ready=False)]
    result = plan(raw, observed(raw, pods, peer_waits={W0: 2.5}, silent={W1: 31.0}), NOW)
    status = result.status
    assert f"force-delete {W1}" in summary(result.actions) and f"force-delete {W0}" not in summary(result.actions)
    assert status["restartsByReason"] == {"Hang": 1} and status["restarts"] == 1
    failure = status["lastFailure"]
    assert (failure["kind"], failure["reason"], failure["pod"], failure["node"]) == ("Hang", "Hang", W1, "node-1")
    assert f"kubelet reports it not ready and its launcher has not answered for 31s while the ranks of {W0} (2s)" in failure["message"]
    assert any(e.reason == "PodUnresponsive" and W1 in e.message and e.type == "Warning" for e in result.events)
    # The next pass (the pod still listed, its delete not yet seen) charges nothing again.
    later = {**raw, "status": status}
    again = plan(later, observed(later, pods, peer_waits={W0: 3.5}, silent={W1: 32.0}), NOW + timedelta(seconds=1))
    assert again.status["restarts"] == 1


def test_a_silent_pod_alone_is_only_watched_closely_and_peers_waiting_alone_replace_nothing():
    raw = job(status=running_status())
    pods = [worker(0), worker(1, ready=False)]
    # Silent, nobody waits on it (a busy launcher, a network blip): looked at every second.
    quiet = plan(raw, observed(raw, pods, silent={W1: 40.0}), NOW)
    assert quiet.status["phase"] == "Running" and quiet.status.get("restarts", 0) == 0
    assert not any("delete" in a for a in summary(quiet.actions))
    assert quiet.requeue_after is not None and quiet.requeue_after <= RECHECK_SECONDS
    # Silent for longer than any verdict could take (a launcher this operator cannot reach):
    # back to the normal pace, not a pass a second for ever.
    unreachable = plan(raw, observed(raw, pods, silent={W1: 300 + 31.0}), NOW)
    assert unreachable.requeue_after is None or unreachable.requeue_after > RECHECK_SECONDS
    # Peers wait, every launcher answers: the cause is a rank its own supervisor ends.
    waiting = plan(raw, observed(raw, pods, peer_waits={W0: 5.0, W1: 5.0}), NOW)
    assert waiting.status.get("restarts", 0) == 0 and not any("delete" in a for a in summary(waiting.actions))


def test_the_silence_must_be_confirmed_and_older_than_the_peers_wait():
    raw = job(status=running_status())
    pods = [worker(0), worker(1, ready=False)]
    # One unanswered probe is not a confirmation.
    first = plan(raw, observed(raw, pods, peer_waits={W0: 1.0}, silent={W1: CONFIRM_SECONDS / 2}), NOW)
    assert first.status.get("restarts", 0) == 0
    # A replacement still starting is silent for less time than its peers have waited: it
    # is not the cause they wait on.
    young = plan(raw, observed(raw, [worker(0), worker(1, incarnation=1, ready=False)], peer_waits={W0: 30.0},
                               silent={"tiny-elastic-worker-1-1": 12.0}), NOW)
    assert young.status["phase"] == "Running" and young.status.get("restarts", 0) == 0
    assert not any("delete" in a for a in summary(young.actions))


def test_a_pod_waiting_itself_or_on_a_failed_node_or_not_running_is_not_the_cause():
    raw = job(FOUR, status=running_status())
    pods = [worker(0), worker(1, ready=False), worker(2, phase="Pending"), worker(3)]
    nodes = [node("node-0"), node("node-1", ready="Unknown", since_seconds=10), node("node-2"), node("node-3")]
    # W1's node is failed (node_failures' to handle, after its grace); W2 is not running.
    result = plan(raw, observed(raw, pods, nodes=nodes, peer_waits={W0: 3.0}, silent={W1: 50.0, W2: 50.0}), NOW)
    assert result.status["phase"] in ("Running", "Restarting")
    assert f"force-delete {W2}" not in summary(result.actions) and not any(e.reason == "PodUnresponsive" for e in result.events)
    assert result.status.get("restartsByReason", {}).get("Hang", 0) == 0
    # A silent pod's own (stale) wait is no evidence against another silent pod.
    both = plan(raw, observed(raw, [worker(0), worker(1, ready=False), worker(2, ready=False), worker(3)], peer_waits={W1: 3.0},
                              silent={W1: 50.0, W2: 50.0}), NOW)
    assert both.status["phase"] == "Running" and both.status.get("restarts", 0) == 0


def test_two_silent_pods_of_four_are_both_replaced_on_a_peers_report():
    raw = job(FOUR, status=running_status())
    pods = [worker(0, uid="u0"), worker(1, uid="u1", ready=False), worker(2, uid="u2", ready=False), worker(3, uid="u3")]
    result = plan(raw, observed(raw, pods, peer_waits={W0: 4.0}, silent={W1: 20.0, W2: 20.0}), NOW)
    deleted = summary(result.actions)
    assert f"force-delete {W1}" in deleted and f"force-delete {W2}" in deleted
    assert f"force-delete {W0}" not in deleted and result.status["restartsByReason"] == {"Hang": 2}


def test_a_frozen_pod_with_the_budget_spent_fails_the_job_naming_the_hang():
    raw = job({"spec.faultTolerance.maxRestarts": 0}, status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1, ready=False)], peer_waits={W0: 2.0}, silent={W1: 35.0}), NOW)
    assert result.status["phase"] == "Failed"
    failed = next(c for c in result.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "last: Hang" in failed["message"]


def test_frozen_pods_on_one_node_within_the_window_are_one_episode_and_quarantine_it():
    raw = job({"spec.faultTolerance.nodeFailureThreshold": 2}, status=running_status())
    pods = [worker(0, uid="u0"), worker(1, uid="u1", node="node-1", ready=False)]
    first = plan(raw, observed(raw, pods, peer_waits={W0: 2.0}, silent={W1: 31.0}), NOW)
    later = {**raw, "status": first.status}
    replacement = worker(1, uid="u1b", node="node-1", incarnation=1, ready=False)
    second = plan(later, observed(later, [worker(0, uid="u0"), replacement], peer_waits={W0: 2.0},
                                  silent={replacement.name: 31.0}), NOW + timedelta(seconds=60))
    assert second.status["restartsByReason"] == {"Hang": 1}, "the node's second freeze within the window is not charged again"
    assert any(q["node"] == "node-1" for q in second.status.get("quarantinedNodes", [])), second.status.get("quarantinedNodes")
    assert any(e.reason == "NodeQuarantined" for e in second.events)


def test_a_silent_pod_its_kubelet_still_reports_ready_is_a_partitioned_nodes_and_left_to_the_node_policy():
    """Cut off with its node (a partition), a pod is as silent as a frozen one and its peers
    wait on it as well; but no kubelet reports it not ready until the node is NotReady,
    and then the node's failure (after its grace) is what is charged."""
    raw = job(status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1, ready=True)], peer_waits={W0: 5.0}, silent={W1: 40.0}), NOW)
    assert result.status.get("restarts", 0) == 0 and not any("delete" in a for a in summary(result.actions))
    assert result.requeue_after is not None and result.requeue_after <= RECHECK_SECONDS, "watched closely meanwhile"


def test_a_not_ready_written_before_the_launcher_last_answered_is_no_verdict_on_its_silence():
    """A pod not ready since before this operator last heard its launcher (still starting,
    a readiness probe failed once under load) and then cut off with its node: the kubelet's
    word is older than the silence, so it proves no kubelet alive since; the node's failure
    comes after its grace. A not-ready written after the last answer is a live kubelet's."""
    raw = job(status=running_status())
    heard = 12.0  # the launcher last answered 12 s ago, then went silent
    stale = replace(worker(1, uid="u1", ready=False), ready_since=NOW - timedelta(seconds=heard + 5))
    kept = plan(raw, observed(raw, [worker(0, uid="u0"), stale], peer_waits={W0: 10.0}, silent={W1: 11.0},
                              since_answer={W1: heard}), NOW)
    assert kept.status.get("restarts", 0) == 0 and not any("delete" in a for a in summary(kept.actions))
    assert kept.requeue_after is not None and kept.requeue_after <= RECHECK_SECONDS, "watched closely meanwhile"
    # Written within the same second as the last answer (transition times are whole
    # seconds), or later: the kubelet saw the pod broken after the silence began.
    for after in (heard - 0.5, heard + 0.9, 3.0):
        fresh = replace(worker(1, uid="u1", ready=False), ready_since=NOW - timedelta(seconds=after))
        result = plan(raw, observed(raw, [worker(0, uid="u0"), fresh], peer_waits={W0: 10.0}, silent={W1: 11.0},
                                    since_answer={W1: heard}), NOW)
        assert f"force-delete {W1}" in summary(result.actions), after
        assert result.status["restartsByReason"] == {"Hang": 1}
    # Never heard by this operator (a new leader): the kubelet's word as it stands.
    unheard = plan(raw, observed(raw, [worker(0, uid="u0"), stale], peer_waits={W0: 10.0}, silent={W1: 11.0}), NOW)
    assert f"force-delete {W1}" in summary(unheard.actions)
