"""The pure planner, table by table: every row of the failure taxonomy (docs/design.md), elastic
scaling, the restart budget, and the job lifecycle."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from llmtrain_operator.api.observed import PodView, TrainerProbe
from llmtrain_operator.api import receive
from llmtrain_operator.planner import plan, plan_received
from support.planning import NOW, ago, job, node, observed, running_status, summary, worker
from llmtrain_operator.planner.policies.progress import duration

W0, W1 = "tiny-elastic-worker-0", "tiny-elastic-worker-1"


def run(raw, obs, now=NOW):
    result = plan(raw, obs, now)
    return result, result.status, summary(result.actions), [e.reason for e in result.events]


# ---------------------------------------------------------------- creation


def test_a_new_job_creates_services_config_store_and_one_pod_per_slot():
    raw = job()
    result, status, actions, events = run(raw, observed(raw, [], with_store=False, services=frozenset(), configmaps={}))
    assert actions == [
        "create Service/tiny-elastic-workers", "create Service/tiny-elastic-rdzv", "create ConfigMap/tiny-elastic-config",
        "create Pod/tiny-elastic-rdzv", f"create Pod/{W0}", f"create Pod/{W1}",
    ]
    assert status["phase"] == "Created" and status["workers"] == "0/2"
    assert "Created" in events and "CreatedWorkers" in events
    assert result.requeue_after is not None


def test_nothing_changed_means_no_actions_and_no_events():
    raw = job(status=running_status(step=20))
    obs = observed(raw, [worker(0), worker(1)], probes={W0: TrainerProbe(step=20, world_size=2, restarts=0)})
    first = plan(raw, obs, NOW)
    again = plan({**raw, "status": first.status}, obs, NOW + timedelta(seconds=1))
    assert summary(again.actions) == [] and again.events == []
    assert again.urgent_after is None, "a steady job's next pass is routine"


def test_running_status_reads_step_world_and_checkpoint_from_the_trainer():
    raw = job(status=running_status(step=10))
    probes = {W0: TrainerProbe(step=42, world_size=2, restarts=0, last_checkpoint={"local": 40, "shared": 40})}
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert actions == []
    assert (status["phase"], status["step"], status["worldSize"], status["workers"]) == ("Running", 42, 2, "2/2")
    assert status["lastCheckpoint"]["summary"] == "40@shared"  # the most durable tier holding the newest step
    assert {c["type"]: c["status"] for c in status["conditions"]}["Running"] == "True"


# ---------------------------------------------------------------- taxonomy: exits

EXIT_TABLE = [
    # (exit code, kubelet reason, termination message, expected class, reason, counts a restart)
    (0, "Completed", {}, "success", "Completed", False),
    (137, "Error", {}, "retry", "Signal9", True),
    (137, "OOMKilled", {}, "retry", "OOMKilled", True),
    (80, "Error", {"code": 80, "reason": "Hang", "message": "no step progress for 300s"}, "retry", "Hang", True),
    (83, "Error", {"code": 83, "reason": "CollectiveTimeout"}, "retry", "CollectiveTimeout", True),
    (1, "Error", {}, "retry", "Crash", True),
    (64, "Error", {"code": 64, "reason": "ConfigError", "message": "bad config"}, "fail", "ConfigError", False),
    (65, "Error", {"code": 65, "reason": "DataError"}, "fail", "DataError", False),
    (82, "Error", {"code": 82, "reason": "CorruptCheckpoint"}, "fail", "CorruptCheckpoint", False),
    (86, "Error", {"code": 86, "reason": "StorageFull", "message": "no tier has room for the final checkpoint"}, "fail",
     "StorageFull", False),
    (81, "Error", {"code": 81, "reason": "Preempted"}, "disruption", "Preempted", False),
]


@pytest.mark.parametrize(("code", "reason", "term", "klass", "why", "counts"), EXIT_TABLE, ids=[f"exit-{r[0]}-{r[1]}" for r in EXIT_TABLE])
def test_worker_exit_is_classified(code, reason, term, klass, why, counts):
    raw = job(status=running_status())
    phase = "Succeeded" if code == 0 else "Failed"
    pods = [worker(0, phase=phase, exit_code=code, reason=reason, termination=term),
            worker(1, phase=phase if code == 0 else "Running", exit_code=code if code == 0 else None)]
    _, status, actions, events = run(raw, observed(raw, pods))
    if klass == "success":
        assert status["phase"] == "Succeeded" and status["completionTime"]
        assert "Completed" in events
        assert status["workers"] == "0/2" and status["replicas"]["ready"] == 0
    elif klass == "fail":
        assert status["phase"] == "Failed" and status["lastFailure"]["reason"] == why
        assert f"delete {W1}" in actions  # the survivor is stopped
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["status"] == "True" and failed["reason"] == why
    elif klass == "disruption":
        assert (status["disruptions"], status["restarts"]) == (1, 0)
        assert actions == [f"keep {W0}"]  # kept for its log; its slot gets a new pod
    else:
        assert status["restarts"] == 1 and status["restartsByReason"] == {why: 1}
        assert actions == [f"keep {W0}"] and status["nextRestartTime"]
        assert status["lastFailure"]["kind"] == ("Hang" if why == "Hang" else "ProcessCrash")
    assert ("PodFailed" in events) == counts


def test_an_eviction_is_a_disruption_not_a_crash():
    raw = job(status=running_status())
    pods = [worker(0, phase="Failed", exit_code=143, reason="Evicted", disruption=True), worker(1)]
    _, status, actions, events = run(raw, observed(raw, pods))
    assert (status["disruptions"], status["restarts"]) == (1, 0)
    assert actions == [f"keep {W0}"] and "PodDisrupted" in events
    assert status["lastFailure"]["kind"] == "Eviction"


def test_a_failed_pod_is_counted_once_even_if_its_deletion_is_slow():
    raw = job(status=running_status())
    pods = [worker(0, phase="Failed", exit_code=137), worker(1)]
    first = plan(raw, observed(raw, pods), NOW)
    second = plan({**raw, "status": first.status}, observed(raw, pods), NOW + timedelta(seconds=2))
    assert second.status["restarts"] == 1


# ---------------------------------------------------------------- backoff and budget


def test_replacement_waits_for_the_backoff_then_is_created():
    # A status written before backoff was per slot: its one time holds back every slot.
    raw = job(status=running_status(restarts=3, nextRestartTime=ago(-3)))
    obs = observed(raw, [worker(1)])
    result, _, actions, _ = run(raw, obs)
    assert actions == [] and 1 <= result.requeue_after <= 3
    _, _, actions, _ = run(raw, obs, NOW + timedelta(seconds=4))
    assert actions == [f"create Pod/{W0}"]


BACKOFF = {"spec.faultTolerance.backoff": {"initialSeconds": 2, "factor": 3, "maxSeconds": 50}}
CRASHED = [worker(0, phase="Failed", exit_code=137), worker(1)]


def streak(failures: int, due: float) -> dict:
    """A slot's backoff entry: ``failures`` in a row, its replacement due ``due`` seconds ago."""
    return {"failures": failures, "until": ago(due)}


def test_backoff_grows_with_a_slots_failures_in_a_row_and_is_capped():
    raw = job(BACKOFF, status=running_status(restarts=3, internal={"backoff": {"0": streak(3, 60)}}))
    _, status, _, _ = run(raw, observed(raw, CRASHED))
    assert status["nextRestartTime"] == ago(-50)  # 2 * 3**3 = 54, capped at 50
    assert status["internal"]["backoff"]["0"] == {"failures": 4, "until": ago(-50)}
    raw = job(BACKOFF, status=running_status(restarts=1, internal={"backoff": {"0": streak(1, 60)}}))
    _, status, _, _ = run(raw, observed(raw, CRASHED))
    assert status["nextRestartTime"] == ago(-6)  # 2 * 3**1


def test_a_failure_elsewhere_in_the_job_does_not_delay_a_slot():
    """Failures of different nodes of a large job are independent: the job's restarts and
    another slot's streak leave a slot's first failure at the initial delay."""
    raw = job(BACKOFF, status=running_status(restarts=4, internal={"backoff": {"1": streak(4, 30)}}))
    _, status, _, _ = run(raw, observed(raw, CRASHED))
    assert status["restarts"] == 5 and status["nextRestartTime"] == ago(-2)
    assert status["internal"]["backoff"] == {"1": streak(4, 30), "0": {"failures": 1, "until": ago(-2)}}


def test_a_slot_that_ran_past_reset_after_seconds_starts_its_streak_again():
    raw = job({**BACKOFF, "spec.faultTolerance.backoff.resetAfterSeconds": 300},
              status=running_status(restarts=4, internal={"backoff": {"0": streak(4, 301), "1": streak(2, 299)}}))
    _, status, _, _ = run(raw, observed(raw, CRASHED))
    assert status["nextRestartTime"] == ago(-2)
    # The slot starts at 1; slot 1's streak, due 299 s ago, is still followed.
    assert status["internal"]["backoff"] == {"1": streak(2, 299), "0": {"failures": 1, "until": ago(-2)}}


def test_a_slot_waiting_out_its_backoff_does_not_hold_back_another():
    raw = job(BACKOFF, status=running_status(restarts=2, nextRestartTime=ago(-5), internal={"backoff": {"0": streak(2, -5)}}))
    result, _, actions, _ = run(raw, observed(raw, []))
    assert actions == [f"create Pod/{W1}"] and 4 <= result.requeue_after <= 5
    _, _, actions, _ = run(raw, observed(raw, [worker(1)]), NOW + timedelta(seconds=5))
    assert actions == [f"create Pod/{W0}"]


def test_a_replacement_is_created_when_its_backoff_ends_to_the_millisecond():
    """A second's truncation and the planner's one-second timer floor added up to 1 s to
    a 1 s backoff (bench/operator_scale.py: kill -> replacement 2.4 s at worst)."""
    raw = job(status=running_status())  # example 01: 1 s doubling to 10 s
    _, status, _, _ = run(raw, observed(raw, CRASHED), NOW + timedelta(seconds=0.25))
    assert status["internal"]["backoff"]["0"]["until"] == ago(-1.25).replace("Z", ".250Z")
    after = {**raw, "status": status}
    result, _, actions, _ = run(after, observed(after, [worker(1)]), NOW + timedelta(seconds=0.9))
    assert actions == [] and result.requeue_after == pytest.approx(0.35) and result.urgent_after == pytest.approx(0.35)
    _, _, actions, _ = run(after, observed(after, [worker(1)]), NOW + timedelta(seconds=1.25))
    assert actions == [f"create Pod/{W0}"]


def test_a_job_wide_restart_holds_back_every_slot_by_its_own_streak():
    raw = job({**BACKOFF, "spec.faultTolerance.restartPolicy": "RestartAll"},
              status=running_status(restarts=1, internal={"backoff": {"*": streak(1, 30)}}))
    _, status, actions, _ = run(raw, observed(raw, CRASHED))
    assert status["internal"]["backoff"] == {"*": {"failures": 2, "until": ago(-6)}}
    assert status["restartGeneration"] == 1
    after = {**raw, "status": status}
    result, _, actions, _ = run(after, observed(after, []), NOW + timedelta(seconds=5))
    assert not [a for a in actions if a.startswith("create Pod/tiny-elastic-worker")] and result.requeue_after <= 1
    _, _, actions, _ = run(after, observed(after, []), NOW + timedelta(seconds=6))
    assert [a for a in actions if a.startswith("create Pod/tiny-elastic-worker")] == [f"create Pod/{W0}", f"create Pod/{W1}"]


def test_a_hand_edited_streak_of_millions_waits_the_cap_and_plans():
    raw = job(BACKOFF, status=running_status(internal={"backoff": {"0": streak(10**9, 10), "x": {"failures": 2, "until": "never"}}}))
    _, status, _, _ = run(raw, observed(raw, CRASHED))
    assert status["internal"]["backoff"] == {"0": {"failures": 10**9 + 1, "until": ago(-50)}}  # the unreadable one dropped


def test_the_slots_followed_are_bounded_the_longest_due_going_first():
    from llmtrain_operator.planner.backoff import MAX_SLOTS
    table = {str(i): streak(1, 100 - i / 10) for i in range(2, MAX_SLOTS + 2)}
    raw = job(BACKOFF, status=running_status(internal={"backoff": table}))
    _, status, _, _ = run(raw, observed(raw, CRASHED))
    kept = status["internal"]["backoff"]
    assert len(kept) == MAX_SLOTS and "2" not in kept and "3" in kept and kept["0"]["failures"] == 1


def test_resuming_a_suspended_job_starts_its_pods_without_waiting():
    raw = job({"spec.suspend": False}, status=running_status(phase="Suspended", nextRestartTime=ago(-40),
                                                            internal={"backoff": {"0": streak(3, -40), "*": streak(1, -40)}}))
    _, status, actions, _ = run(raw, observed(raw, []))
    assert f"create Pod/{W0}" in actions and f"create Pod/{W1}" in actions
    assert status["internal"].get("backoff", {}) == {} and "nextRestartTime" not in status


def test_the_budget_running_out_fails_the_job_with_backoff_limit_exceeded():
    raw = job(status=running_status(restarts=5))  # example 01: maxRestarts 5
    _, status, actions, events = run(raw, observed(raw, [worker(0, phase="Failed", exit_code=137), worker(1)]))
    assert status["phase"] == "Failed" and status["restarts"] == 6
    assert next(c for c in status["conditions"] if c["type"] == "Failed")["reason"] == "BackoffLimitExceeded"
    assert "BackoffLimitExceeded" in events and f"delete {W1}" in actions


def test_restarts_are_never_reset_when_children_are_recreated():
    raw = job(status=running_status(restarts=4, disruptions=2, restartGeneration=3))
    _, status, actions, _ = run(raw, observed(raw, [], with_store=False))
    assert (status["restarts"], status["disruptions"], status["restartGeneration"]) == (4, 2, 3)
    assert f"create Pod/{W0}" in actions


def test_an_unreadable_status_keeps_the_counters_it_can_find():
    raw = job(status={"restarts": 4, "phase": "NotAPhase", "restartGeneration": 2})
    _, status, _, _ = run(raw, observed(raw, []))
    assert (status["restarts"], status["restartGeneration"]) == (4, 2)


# ---------------------------------------------------------------- restart policy


def test_restart_all_bumps_the_generation_and_replaces_every_worker():
    raw = job({"spec.faultTolerance.restartPolicy": "RestartAll"}, status=running_status())
    _, status, actions, events = run(raw, observed(raw, [worker(0, phase="Failed", exit_code=137), worker(1)]))
    assert status["restartGeneration"] == 1 and status["restarts"] == 1
    assert sorted(actions) == [f"delete {W1}", f"keep {W0}"]  # the failed pod kept for its log
    assert "RestartAll" in events


def test_pods_of_an_older_generation_are_replaced():
    raw = job(status=running_status(restartGeneration=2))
    _, _, actions, _ = run(raw, observed(raw, [worker(0, generation=2), worker(1, generation=1)]))
    assert actions == [f"delete {W1}"]


# ---------------------------------------------------------------- nodes


def test_a_failed_node_within_its_grace_is_only_watched():
    raw = job(status=running_status())  # example 01: nodeFailureGraceSeconds 10
    nodes = [node("node-0"), node("node-1", ready="Unknown", since_seconds=4)]
    result, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], nodes=nodes))
    assert actions == [] and status["restarts"] == 0
    assert 5 <= result.requeue_after <= 6
    assert result.urgent_after == result.requeue_after, "the grace's end acts on a failure: an urgent pass"


def test_after_the_grace_pods_on_a_failed_node_are_force_deleted_and_the_node_quarantined():
    raw = job(status=running_status())
    nodes = [node("node-0"), node("node-1", ready="Unknown", since_seconds=30, unreachable=True)]
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1, deleting=True)], nodes=nodes))
    assert actions == [f"force-delete {W1}"]
    assert status["restartsByReason"] == {"NodeFailure": 1}
    assert status["lastFailure"]["kind"] == "NodeFailure" and status["lastFailure"]["node"] == "node-1"
    assert [q["node"] for q in status["quarantinedNodes"]] == ["node-1"]
    assert "NodeFailure" in events


def zoned(view, zone: str):
    return dataclasses.replace(view, zone=zone)


@pytest.mark.parametrize("ready, held", [
    (["Unknown"] * 4, True),                          # every node of the zone: the control plane, not the nodes
    (["Unknown", "Unknown", "Unknown", "True", "True"], True),  # more than 2 and at least 55 %
    (["Unknown", "Unknown", "True", "True"], False),  # 2 of 4: node failures
    (["Unknown", "True", "True", "True"], False),
], ids=["all", "3-of-5", "2-of-4", "1-of-4"])
def test_most_of_a_zone_not_ready_at_once_is_a_disruption_and_keeps_the_pods(ready, held):
    raw = job(status=running_status())
    nodes = [node(f"node-{i}", ready=r, since_seconds=30) for i, r in enumerate(ready)]
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1)], nodes=nodes))
    disrupted = [c for c in status.get("conditions", []) if c["type"] == "NodesDisrupted"]
    if held:
        assert actions == [] and status["restarts"] == 0, actions
        assert disrupted[0]["status"] == "True" and disrupted[0]["reason"] == "ZoneDisrupted", disrupted
        assert f"{ready.count('Unknown')} of {len(ready)} nodes NotReady" in disrupted[0]["message"]
        assert "ZoneDisrupted" in events
    else:
        assert f"force-delete {W0}" in actions and status["restartsByReason"]["NodeFailure"] >= 1, actions
        assert not disrupted


def test_a_disruption_in_one_zone_holds_only_that_zones_pods_and_clears_when_it_heals():
    raw = job(status=running_status())
    nodes = [zoned(node("node-0", ready="Unknown", since_seconds=30), "a"), zoned(node("node-1", ready="Unknown", since_seconds=30), "b"),
             zoned(node("node-2"), "b"), zoned(node("node-3"), "b")]
    # Zone a: its only node NotReady, a full disruption: worker-0 kept. Zone b: 1 of 3: worker-1's node failed.
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], nodes=nodes))
    assert actions == [f"force-delete {W1}"]
    assert status["restartsByReason"] == {"NodeFailure": 1}
    assert [c["status"] for c in status["conditions"] if c["type"] == "NodesDisrupted"] == ["True"]
    healed = [zoned(node("node-0"), "a"), *nodes[1:]]
    _, later, _, _ = run(job(status=status), observed(raw, [worker(0)], nodes=healed))
    assert [(c["status"], c["reason"]) for c in later["conditions"] if c["type"] == "NodesDisrupted"] == [("False", "NodesReachable")]


def test_a_pod_whose_node_object_vanished_is_treated_as_on_a_failed_node():
    raw = job(status=running_status())
    result, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1, node="gone")], nodes=[node("node-0")]))
    assert actions == [f"force-delete {W1}"]
    assert status["lastFailure"]["message"] == "node gone is gone (its Node object was deleted)"
    assert [e.message for e in result.events if e.reason == "NodeFailure"] == \
        [f"node gone is gone (its Node object was deleted): force-deleting {W1} and keeping this job off the node"]


def test_a_lost_node_s_event_says_the_survivors_wait_to_heal_only_where_they_do():
    # In-process healing with fewer pods left than replicas.min: the survivors wait for the
    # replacement. With enough left, torchrun re-forms the job without the node, healing or not.
    base = f"node gone is gone (its Node object was deleted): force-deleting {W1} and keeping this job off the node"
    waits = "; the other pods' ranks keep their processes and wait up to collectiveTimeoutSeconds (90s) for the replacement " \
            "to heal from them"
    for changes, words in (({"spec.faultTolerance.inProcessHealing": True, "spec.faultTolerance.collectiveTimeoutSeconds": 90,
                             "spec.replicas": {"min": 2, "max": 2}}, waits),
                           ({"spec.faultTolerance.inProcessHealing": True, "spec.replicas": {"min": 1, "max": 2}}, ""),
                           ({"spec.replicas": {"min": 2, "max": 2}}, "")):
        raw = job(changes, status=running_status())
        result = plan(raw, observed(raw, [worker(0), worker(1, node="gone")], nodes=[node("node-0")]), NOW)
        assert [e.message for e in result.events if e.reason == "NodeFailure"] == [base + words], changes
    # Three pods, replicas 2..3: two are left, enough to go on.
    raw = job({"spec.faultTolerance.inProcessHealing": True, "spec.replicas": {"min": 2, "max": 3},
               "spec.trainer.builtin.globalBatchSize": 12}, status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1, node="gone"), worker(2, node="node-0")], nodes=[node("node-0")]), NOW)
    assert [e.message for e in result.events if e.reason == "NodeFailure"] == [base], result.events


def test_a_young_pod_on_a_node_not_seen_yet_waits_for_the_grace():
    """The node watch can deliver a brand-new node after the pod bound to it: a pod younger
    than the grace is not failed for a missing Node until the grace has passed."""
    raw = job({"spec.faultTolerance.nodeFailureGraceSeconds": 40}, status=running_status())
    young = worker(1, node="new-node", created=NOW - timedelta(seconds=3))
    for age in (0, 30):
        _, status, actions, _ = run(raw, observed(raw, [worker(0), young], nodes=[node("node-0")]), NOW + timedelta(seconds=age))
        assert actions == [] and status["restarts"] == 0
    later = plan(raw, observed(raw, [worker(0), young], nodes=[node("node-0")]), NOW + timedelta(seconds=38))
    assert later.status["restartsByReason"] == {"NodeFailure": 1}


def test_replacements_avoid_quarantined_nodes():
    raw = job(status=running_status(quarantinedNodes=[{"node": "node-1", "until": ago(-300)}]))
    result = plan(raw, observed(raw, [worker(0)]), NOW)
    pod = next(a.manifest for a in result.actions if getattr(a, "kind", "") == "Pod")
    expr = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]
    assert expr == {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-1"]}


def test_an_expired_quarantine_is_dropped():
    raw = job(status=running_status(quarantinedNodes=[{"node": "node-1", "until": ago(5)}]))
    result = plan(raw, observed(raw, [worker(0)]), NOW)
    assert result.status["quarantinedNodes"] == []
    pod = next(a.manifest for a in result.actions if getattr(a, "kind", "") == "Pod")
    assert "affinity" not in pod["spec"]


# ---------------------------------------------------------------- hangs and wedges


def test_a_wedged_job_is_restarted_all_at_once():
    raw = job(status=running_status(lastProgressTime=ago(130)))  # progressTimeoutSeconds 120
    probes = {W0: TrainerProbe(step=20, world_size=2, restarts=0)}
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["restartsByReason"] == {"Wedged": 1} and status["restartGeneration"] == 1
    assert sorted(actions) == [f"delete {W0}", f"delete {W1}"]
    assert "RestartAll" in events and status["lastFailure"]["kind"] == "Wedged"


@pytest.mark.parametrize("phase", ["Restarting", "Created"])
def test_a_job_stuck_outside_running_is_restarted_too(phase):
    # E.g. a frozen pod that never becomes ready again: the job sits in Restarting (or a
    # trainer stuck before its first step in Created) with its workers alive.
    raw = job(status=running_status(phase=phase, lastProgressTime=ago(130), step=0 if phase == "Created" else 20))
    pods = [worker(0, ready=False), worker(1, ready=False)]
    _, status, actions, events = run(raw, observed(raw, pods, probes={}))
    assert status["restartsByReason"] == {"Wedged": 1} and sorted(actions) == [f"delete {W0}", f"delete {W1}"]
    assert f"(phase {phase})" in status["lastFailure"]["message"]
    if phase == "Created":
        assert "no training step for 130s" in status["lastFailure"]["message"]


def test_waiting_for_capacity_is_not_a_wedge_and_restarts_the_clock():
    raw = job(status=running_status(phase="Created", lastProgressTime=ago(130), step=0))
    queued = [worker(0, phase="Pending", ready=False), dataclasses.replace(worker(1, phase="Pending", ready=False), unschedulable=True)]
    _, status, actions, _ = run(raw, observed(raw, queued, probes={}))
    assert actions == [] and not status.get("restartsByReason")
    assert status["lastProgressTime"] == ago(0), "the clock starts once every worker can run"


def test_steps_redone_after_a_restore_are_progress_too():
    # status.step is 20 (the high-water mark); the trainers restored step 10 and are at 15.
    raw = job(status=running_status(lastProgressTime=ago(130), step=20))
    probes = {W0: TrainerProbe(step=15, world_size=2, restarts=0, last_step_time=NOW.timestamp() - 2)}
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert actions == [] and status["lastProgressTime"] == ago(0) and status["step"] == 20
    stale = {W0: TrainerProbe(step=15, world_size=2, restarts=0, last_step_time=NOW.timestamp() - 200)}
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=stale))
    assert status["restartsByReason"] == {"Wedged": 1}, "a step older than the last progress is not progress"


def test_progress_resets_the_wedge_timer():
    raw = job(status=running_status(lastProgressTime=ago(130), step=20))
    probes = {W0: TrainerProbe(step=21, world_size=2, restarts=0)}
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert actions == [] and status["lastProgressTime"] == ago(0)



def test_the_status_shows_step_of_max_steps_loss_throughput_and_the_time_left():
    raw = job(status=running_status(step=20))
    spec = raw["spec"]["trainer"]["builtin"]
    tokens_per_step = spec["globalBatchSize"] * spec["data"]["seqLen"]
    # The trainer furthest along speaks for the job: 30 steps left at 2 s a step.
    probes = {W0: TrainerProbe(step=30, world_size=2, loss=2.71828, tokens_per_second=tokens_per_step / 2.0),
              W1: TrainerProbe(step=29, world_size=2, loss=9.0, tokens_per_second=1.0)}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    max_steps = spec["maxSteps"]
    assert status["progress"] == f"30/{max_steps}"
    assert status["loss"] == 2.7183 and status["tokensPerSecond"] == round(tokens_per_step / 2.0, 1)
    assert status["eta"] == duration((max_steps - 30) * 2.0)
    assert "rankZero" not in status, "no page said which pod holds rank 0"
    probes = {W0: TrainerProbe(step=30, rank=2), W1: TrainerProbe(step=30, rank=0)}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["rankZero"] == {"pod": W1, "container": "trainer"}
    # After a restart a fresh trainer serves step 0 and loss 0 until its first step: not news.
    restarted = job(status={**status, "loss": 2.7183, "phase": "Restarting"})
    fresh = {W0: TrainerProbe(step=0, loss=0.0, tokens_per_second=None), W1: TrainerProbe(step=0, loss=0.0)}
    _, after, _, _ = run(restarted, observed(restarted, [worker(0), worker(1)], probes=fresh))
    assert after["loss"] == 2.7183 and after.get("eta") is None, "no time left is shown while not training"
    _, gone, _, _ = run(restarted, observed(restarted, [worker(0)], probes={}))
    assert "rankZero" not in gone, "the pod that held rank 0 is gone"
    assert [duration(s) for s in (45, 750, 3 * 3600 + 301, 2 * 86400 + 4 * 3600, 400 * 86400)] == ["45s", "12m30s", "3h5m", "2d4h", None]


def test_the_status_says_which_live_pod_holds_which_ranks_from_their_pages():
    # Two ranks a pod; worker-1's replacement holds ranks 0-1, worker-0 ranks 2-3. The
    # failed pod kept for its log, a page past the world size (read before a re-rendezvous)
    # and a pod not yet scraped are left out.
    raw = job({"spec.procsPerNode": 2}, status=running_status(step=20))
    w1_1, w2 = "tiny-elastic-worker-1-1", "tiny-elastic-worker-2"
    pods = [worker(0), worker(1, phase="Failed", exit_code=1, kept=True), worker(1, incarnation=1), worker(2), worker(3)]
    probes = {W0: TrainerProbe(step=20, world_size=4, rank=2), W1: TrainerProbe(step=20, world_size=4, rank=0),
              w1_1: TrainerProbe(step=20, world_size=4, rank=0), w2: TrainerProbe(step=20, world_size=4, rank=6)}
    _, status, _, _ = run(raw, observed(raw, pods, probes=probes))
    assert status["ranks"] == [{"pod": w1_1, "first": 0, "last": 1}, {"pod": W0, "first": 2, "last": 3}]
    assert status["rankZero"]["pod"] == w1_1
    _, gone, _, _ = run(raw, observed(raw, [worker(0)], probes=probes))
    assert gone["ranks"] == [{"pod": W0, "first": 2, "last": 3}], "the pods gone hold nothing"
    # The pods ended and their pages are gone: the last word stands for the pods still there.
    ended = job({"spec.procsPerNode": 2}, status={**status, "phase": "Running"})
    _, after, _, _ = run(ended, observed(ended, [worker(0, phase="Succeeded", exit_code=0),
                                                 worker(1, incarnation=1, phase="Succeeded", exit_code=0)], probes={}))
    assert after["ranks"] == status["ranks"], after.get("ranks")


def test_a_finished_jobs_progress_is_its_last_step_of_max_steps_with_no_time_left():
    # The trainers' last scrape saw a step short of the end; the pods then exited 0.
    max_steps = job()["spec"]["trainer"]["builtin"]["maxSteps"]
    raw = job(status=running_status(step=max_steps - 4, tokensPerSecond=500.0))
    probes = {W0: TrainerProbe(step=max_steps - 4, world_size=2, tokens_per_second=500.0)}
    done = [worker(0, phase="Succeeded", exit_code=0), worker(1, phase="Succeeded", exit_code=0)]
    _, status, _, _ = run(raw, observed(raw, done, probes=probes))
    assert status["phase"] == "Succeeded" and status["step"] == max_steps
    assert status["progress"] == f"{max_steps}/{max_steps}" and status.get("eta") is None



def test_a_job_that_ends_between_scrapes_shows_its_last_steps_loss_from_the_termination_message():
    # The last scrape saw step 56 and its loss; the pods then finished step 60 and exited 0.
    max_steps = job()["spec"]["trainer"]["builtin"]["maxSteps"]
    raw = job(status=running_status(step=max_steps - 4, loss=3.0))
    probes = {W0: TrainerProbe(step=max_steps - 4, world_size=2, loss=3.0)}
    final = {"code": 0, "lastStep": {"step": max_steps, "loss": 2.46813}}
    done = [worker(0, phase="Succeeded", exit_code=0, termination=final), worker(1, phase="Succeeded", exit_code=0, termination=final)]
    _, status, _, _ = run(raw, observed(raw, done, probes=probes))
    assert status["phase"] == "Succeeded" and status["step"] == max_steps and status["loss"] == 2.4681


def test_an_ended_pods_last_step_counts_only_when_it_is_not_behind_or_past_the_end():
    max_steps = job()["spec"]["trainer"]["builtin"]["maxSteps"]
    raw = job(status=running_status(step=30, loss=3.0))
    probes = {W1: TrainerProbe(step=30, world_size=2, loss=3.0)}
    for last in ({"step": 12, "loss": 5.0}, {"step": max_steps + 1, "loss": 0.5}):
        # a pod of an earlier attempt, failed at step 12; a message claiming a step past the end
        failed = worker(0, phase="Failed", exit_code=1, termination={"code": 1, "lastStep": last})
        _, status, _, _ = run(raw, observed(raw, [failed, worker(1)], probes=probes))
        assert status["loss"] == 3.0 and status["step"] == 30, last
    failed = worker(0, phase="Failed", exit_code=1, termination={"code": 1, "lastStep": {"step": 33, "loss": 2.9}})
    _, status, _, _ = run(raw, observed(raw, [failed, worker(1)], probes=probes))
    assert status["loss"] == 2.9 and status["step"] == 33


def test_the_final_checkpoint_a_finished_pod_reports_is_the_newest_checkpoint():
    # The last scrape saw step 50 committed; the pods then committed step 60 and said so in
    # their termination messages (after the last scrape a probe could see).
    max_steps = job()["spec"]["trainer"]["builtin"]["maxSteps"]
    raw = job(status=running_status(step=max_steps, lastCheckpoint={"step": 50, "tier": "local", "time": ago(5), "summary": "50@local"}))
    final = {"code": 0, "checkpoints": {"local": max_steps}}
    done = [worker(0, phase="Succeeded", exit_code=0, termination=final), worker(1, phase="Succeeded", exit_code=0, termination=final)]
    _, status, _, _ = run(raw, observed(raw, done, probes={}))
    assert status["phase"] == "Succeeded"
    assert status["lastCheckpoint"]["summary"] == f"{max_steps}@local", status["lastCheckpoint"]

def test_a_scripts_progress_is_its_step_alone_with_no_time_left():
    raw = job({"spec.trainer": {"command": ["python", "train.py"]}}, status=running_status(step=20))
    probes = {W0: TrainerProbe(step=25, world_size=2, tokens_per_second=1000.0)}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["progress"] == "25" and status.get("eta") is None

def test_an_in_place_crash_is_charged_once_and_its_victims_never():
    # A rank in worker 0 crashed; worker 1's group failed only because its peer vanished.
    raw = job(status=running_status())
    probes = {W0: TrainerProbe(step=20, restarts=1, failed_attempts={"crash": 1}),
              W1: TrainerProbe(step=20, restarts=1, failed_attempts={"victim": 1})}
    first, status, _, events = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["restartsByReason"] == {"RestartedInPlace": 1} and "RestartedInPlace" in events
    assert status["lastFailure"]["pod"] == W0
    again = plan({**raw, "status": status}, observed(raw, [worker(0), worker(1)], probes=probes), NOW + timedelta(seconds=5))
    assert again.status["restarts"] == 1  # seen again: not charged again


def test_an_in_place_crash_says_which_groups_torchrun_restarted_with_and_without_healing():
    # Without healing every node's group restarts; with it only the crashed pod's, in
    # place, and the other pods' ranks heal in process: the Event and lastFailure say so.
    probes = {W0: TrainerProbe(step=20, restarts=1, failed_attempts={"crash": 1}),
              W1: TrainerProbe(step=20, restarts=0)}
    for healing, words in ((False, "torchrun restarted the worker groups in place"),
                           (True, "torchrun restarted that pod's worker group in place, for the other pods' ranks, if any, "
                                  "to heal in process")):
        raw = job({"spec.faultTolerance.inProcessHealing": healing}, status=running_status())
        result = plan(raw, observed(raw, [worker(0), worker(1)], probes=probes), NOW)
        [event] = [e for e in result.events if e.reason == "RestartedInPlace"]
        assert event.message == f"a rank in pod {W0} on node node-0 failed (RestartedInPlace); {words}", healing
        assert result.status["lastFailure"]["message"].endswith(f"failed and {words}"), healing


def test_the_job_s_heals_come_from_the_pages_and_never_go_back():
    raw = job({"spec.faultTolerance.inProcessHealing": True}, status=running_status())
    probes = {W0: TrainerProbe(step=20, heals=2), W1: TrainerProbe(step=20, heals=3)}  # W0's page from before the last heal
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["heals"] == 3
    # A trainer restored from an older checkpoint says fewer; a page without the gauge says nothing.
    probes = {W0: TrainerProbe(step=21, heals=1), W1: TrainerProbe(step=21)}
    _, status, _, _ = run(job(status=status), observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["heals"] == 3


def test_in_place_counts_written_by_an_earlier_version_are_not_charged_again():
    # Earlier versions kept a key a pod and cause; the counts it saw must still count.
    earlier = running_status(restarts=3, internal={"attemptsSeen": {"pod:uid-0/crash": 2, "pod:uid-0/hang": 1, "pod:uid-0/oom": 1}})
    raw = job(status=earlier)
    probes = {W0: TrainerProbe(step=20, restarts=3, failed_attempts={"crash": 2, "hang": 1})}
    _, status, _, _ = run(raw, observed(raw, [worker(0, uid="uid-0"), worker(1, uid="uid-1")], probes=probes))
    assert status["restarts"] == 3
    assert status["internal"]["attemptsSeen"] == {"pod:uid-0": "crash=2,hang=1,oom=1"}
    probes = {W0: TrainerProbe(step=20, restarts=4, failed_attempts={"crash": 3, "hang": 1}), W1: TrainerProbe(step=20)}
    _, status, _, _ = run({**raw, "status": status}, observed(raw, [worker(0, uid="uid-0"), worker(1, uid="uid-1")], probes=probes))
    assert status["restarts"] == 4 and status["internal"]["attemptsSeen"] == {"pod:uid-0": "crash=3,hang=1,oom=1"}


def test_a_hand_edited_attempts_entry_is_read_as_far_as_it_makes_sense_and_never_stops_a_pass():
    from llmtrain_operator.api.status import read_status

    for value in ("crash=\u00b2", "crash=" + "9" * 5000, "garbage", "crash=-1,hang=x", "=3"):
        raw = job(status=running_status(restarts=1, internal={"attemptsSeen": {"pod:uid-0": value}}))
        probes = {W0: TrainerProbe(step=20, restarts=1, failed_attempts={"crash": 1})}
        _, status, _, _ = run(raw, observed(raw, [worker(0, uid="uid-0"), worker(1, uid="uid-1")], probes=probes))
        assert status["internal"]["attemptsSeen"] == {"pod:uid-0": "crash=1"}, value
    # Both forms for one pod (a hand edit, or two versions at once): the larger count stands.
    mixed = read_status({"internal": {"attemptsSeen": {"pod:a": "crash=3", "pod:a/crash": 2, "pod:a/hang": True}}})
    assert mixed.internal.attempts_seen == {"pod:a": "crash=3"}


def test_bookkeeping_of_another_shape_is_read_as_far_as_it_can_be_and_charges_nothing_twice():
    # The CRD does not check status.internal: a newer version's key, a value of another
    # type or a stamp that is no time must leave the rest of the bookkeeping guarding.
    failed = PodView(name=W0, role="worker", slot=0, generation=0, phase="Failed", uid="uid-0", node="node-0", exit_code=137)
    for internal in ({"chargedFailures": ["pod:uid-0"], "futureField": {"x": 1}},
                     {"chargedFailures": ["pod:uid-0"], "nodeFailures": "not a map"},
                     {"chargedFailures": ["pod:uid-0"], "nodeFailures": {"node-0": ["garbage"], "charged:node-0": ["2026-11-21T11:59:00"]}},
                     {"chargedFailures": ["pod:uid-0"], "attemptsSeen": {"pod:uid-1": 3}}):
        raw = job(status=running_status(restarts=1, internal=internal))
        _, status, actions, _ = run(raw, observed(raw, [failed, worker(1)]))
        assert status["restarts"] == 1 and status["phase"] == "Running", internal
        assert status["internal"]["chargedFailures"] == ["pod:uid-0"] and "futureField" not in status["internal"]


def test_two_pods_crashing_in_place_are_two_failures():
    raw = job(status=running_status())
    probes = {W0: TrainerProbe(step=20, restarts=1, failed_attempts={"crash": 1}),
              W1: TrainerProbe(step=20, restarts=2, failed_attempts={"crash": 1, "victim": 1})}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["restartsByReason"] == {"RestartedInPlace": 2}


def test_a_survivors_victim_restart_after_a_replaced_pod_is_not_charged():
    raw = job(status=running_status())
    first = plan(raw, observed(raw, [worker(0, phase="Failed", exit_code=137), worker(1)]), NOW)
    later = {**raw, "status": first.status}
    # The survivor's group failed twice as a victim: once when its peer vanished, once
    # more in the race with the replacement's rendezvous.
    probes = {W1: TrainerProbe(step=20, restarts=2, failed_attempts={"victim": 2})}
    result = plan(later, observed(later, [worker(1)], probes=probes), NOW + timedelta(seconds=30))
    assert result.status["restarts"] == 1


# ---------------------------------------------------------------- elastic scaling


def test_training_goes_on_degraded_while_at_least_min_nodes_are_ready():
    raw = job(status=running_status())  # min 1, max 2
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1, phase="Pending", ready=False)]))
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert status["phase"] == "Running" and status["workers"] == "1/2"
    assert conditions["Degraded"] == ("True", "ReducedWorldSize")


def test_below_min_nodes_the_job_is_restarting_after_a_short_readiness_grace():
    pods = [worker(0), worker(1, phase="Pending", ready=False)]
    raw = job({"spec.replicas": {"min": 2, "max": 2}}, status=running_status())
    _, status, _, _ = run(raw, observed(raw, pods))
    assert status["phase"] == "Running" and status["internal"]["notReadySince"] == ago(0)  # one missed probe is not a failure
    raw = job({"spec.replicas": {"min": 2, "max": 2}}, status=running_status(internal={"notReadySince": ago(30)}))
    _, status, _, _ = run(raw, observed(raw, pods))
    assert status["phase"] == "Restarting"


def test_scale_down_deletes_the_highest_slots_gracefully():
    raw = job({"spec.replicas": {"min": 1, "max": 1}}, status=running_status())
    _, _, actions, events = run(raw, observed(raw, [worker(0), worker(1)]))
    assert actions == [f"delete {W1}"] and "ScaledDown" in events


def test_scale_up_creates_the_new_slots():
    raw = job({"spec.replicas": {"min": 1, "max": 4}, "spec.trainer.builtin.globalBatchSize": 24}, status=running_status())
    _, _, actions, _ = run(raw, observed(raw, [worker(0), worker(1)]))
    assert actions == ["create Pod/tiny-elastic-worker-2", "create Pod/tiny-elastic-worker-3"]


# ---------------------------------------------------------------- lifecycle


def test_suspend_deletes_pods_and_keeps_status():
    raw = job({"spec.suspend": True}, status=running_status(restarts=2))
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1)]))
    assert sorted(actions) == sorted([f"delete {W0}", f"delete {W1}", "delete tiny-elastic-rdzv"])
    assert status["phase"] == "Suspended" and status["restarts"] == 2 and "Suspended" in events


def test_resume_recreates_pods_without_counting_a_restart():
    raw = job(status={**running_status(restarts=2), "phase": "Suspended",
                      "conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "",
                                      "lastTransitionTime": ago(60)}]})
    _, status, actions, events = run(raw, observed(raw, [], with_store=False))
    assert "Resumed" in events and status["restarts"] == 2
    assert f"create Pod/{W0}" in actions and "create Pod/tiny-elastic-rdzv" in actions
    assert next(c for c in status["conditions"] if c["type"] == "Suspended")["status"] == "False"


def test_suspended_time_does_not_count_toward_the_deadline():
    raw = job({"spec.suspend": True, "spec.activeDeadlineSeconds": 100}, status={**running_status(activeSeconds=90), "phase": "Suspended"})
    _, status, _, _ = run(raw, observed(raw, []), NOW + timedelta(seconds=500))
    assert status["activeSeconds"] == 90 and status["phase"] == "Suspended"


def test_the_active_deadline_fails_the_job():
    raw = job({"spec.activeDeadlineSeconds": 100}, status=running_status(activeSeconds=98))
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1)]))
    assert status["phase"] == "Failed" and "DeadlineExceeded" in events
    assert sorted(actions) == ["delete tiny-elastic-rdzv", f"delete {W0}", f"delete {W1}"]


def test_ttl_after_finished_deletes_the_job():
    done = {"phase": "Succeeded", "completionTime": ago(120)}
    raw = job({"spec.ttlSecondsAfterFinished": 60}, status=done)
    _, _, actions, events = run(raw, observed(raw, [worker(0, phase="Succeeded", exit_code=0)]))
    assert actions == ["delete tiny-elastic-rdzv", "delete-job"] and "TTLExpired" in events
    raw = job({"spec.ttlSecondsAfterFinished": 600}, status=done)
    result, _, actions, _ = run(raw, observed(raw, [], with_store=False))
    assert actions == [] and 479 <= result.requeue_after <= 481


def test_an_invalid_spec_is_reported_with_the_field_and_nothing_is_created():
    raw = job({"spec.replicas": {"min": 3, "max": 2}})
    _, status, actions, events = run(raw, observed(raw, []))
    assert actions == [] and status["phase"] == "Invalid"
    invalid = next(c for c in status["conditions"] if c["type"] == "Invalid")
    assert invalid["status"] == "True" and "spec.replicas.min" in invalid["message"]
    assert events == ["InvalidSpec"]


def test_a_missing_secret_is_reported_by_name():
    raw = job()
    _, status, actions, _ = run(raw, observed(raw, [], missing=("Secret s3-credentials",)))
    assert actions == [] and status["phase"] == "Invalid"
    assert "Secret s3-credentials" in next(c for c in status["conditions"] if c["type"] == "Invalid")["message"]


def _waiting(pod: PodView, message: str, reason: str = "CreateContainerConfigError") -> PodView:
    return dataclasses.replace(pod, phase="Pending", ready=False, waiting_reason=reason, waiting_message=message)


@pytest.mark.parametrize("message, missing", [
    ('secret "s3-creds" not found', "Secret s3-creds"),                                   # the kubelet
    ("couldn't find key AWS_ACCESS_KEY_ID in Secret ml/s3-creds", "Secret s3-creds (key AWS_ACCESS_KEY_ID)"),
    ("Secret ml/s3-creds not found", "Secret s3-creds"),                                  # the local cluster's node agent
    ("key AWS_SECRET_ACCESS_KEY not found in Secret ml/s3-creds", "Secret s3-creds (key AWS_SECRET_ACCESS_KEY)"),
    ('configmap "user-extras" not found', "ConfigMap user-extras"),                       # a podTemplate's own volume
])
def test_a_secret_the_operator_may_not_read_is_reported_missing_from_the_pods_that_wait_for_it(message, missing):
    # Cluster-wide, the operator reads no Secrets (no RBAC rule for them): the worker pods'
    # CreateContainerConfigError names what is missing.
    raw = job(status=running_status(phase="Pending"))
    _, status, actions, events = run(raw, observed(raw, [_waiting(worker(0), message), _waiting(worker(1), message)]))
    invalid = next(c for c in status["conditions"] if c["type"] == "Invalid")
    assert status["phase"] == "Invalid" and invalid["status"] == "True"
    assert invalid["message"] == f"missing: {missing} (in the job's namespace)", invalid
    assert events == ["MissingDependency"] and not [a for a in actions if "delete" in a], actions
    # Once it exists the kubelet starts the containers; the condition clears.
    recovered = {**raw, "status": status}
    _, again, _, events = run(recovered, observed(recovered, [worker(0), worker(1)]))
    assert again["phase"] != "Invalid" and "SpecValid" in events
    cleared = next(c for c in again["conditions"] if c["type"] == "Invalid")
    assert cleared["message"] == "the objects the job was missing exist now", "not a claim about the spec"


def test_a_wait_for_the_jobs_own_config_map_or_an_image_is_not_a_missing_dependency():
    raw = job(status=running_status(phase="Pending"))
    pods = [_waiting(worker(0), 'configmap "tiny-elastic-config" not found'),
            _waiting(worker(1), "Back-off pulling image", "ImagePullBackOff")]
    _, status, _, _ = run(raw, observed(raw, pods))
    assert status["phase"] != "Invalid"
    assert not [c for c in status.get("conditions", []) if c["type"] == "Invalid" and c["status"] == "True"]


def test_an_image_that_would_run_as_root_is_reported_with_the_way_out_once_it_has_waited():
    message = "container has runAsNonRoot and image will run as root (pod: \"ml_tiny-elastic-worker-0\", container: trainer)"
    raw = job(status=running_status(phase="Pending"))
    fresh = [_waiting(worker(0, created=NOW - timedelta(seconds=5)), message)]
    _, status, _, _ = run(raw, observed(raw, fresh))
    assert status["phase"] != "Invalid", "a moment's wait is not judged yet"
    old = [_waiting(worker(0, created=NOW - timedelta(seconds=60)), message),
           _waiting(worker(1, created=NOW - timedelta(seconds=60)), message)]
    _, status, _, events = run(raw, observed(raw, old))
    invalid = next(c for c in status["conditions"] if c["type"] == "Invalid")
    assert status["phase"] == "Invalid" and invalid["reason"] == "ContainerConfigError" and events == ["ContainerConfigError"]
    assert invalid["message"].startswith("pod tiny-elastic-worker-0 cannot start: container has runAsNonRoot")
    assert "securityContext.runAsNonRoot: false" in invalid["message"] and invalid["message"].count("cannot start") == 1


def test_goodput_counts_running_time_over_active_time():
    raw = job(status=running_status(activeSeconds=100, productiveSeconds=90, lastReconcileTime=ago(10)))
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)]))
    assert (status["activeSeconds"], status["productiveSeconds"]) == (110, 100)
    assert status["goodput"] == round(100 / 110, 4)


def test_ettr_leaves_out_the_time_spent_redoing_steps_lost_before_a_restore():
    # Step 30 was reached before a failure; the trainers restored step 20 and report 25:
    # the 10 s since the last pass were Running but replayed work.
    raw = job(status=running_status(step=30, activeSeconds=100, productiveSeconds=90, lastReconcileTime=ago(10)))
    redo = {W0: TrainerProbe(step=25, world_size=2, restarts=0)}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=redo))
    assert (status["productiveSeconds"], status["redoSeconds"]) == (100, 10)
    assert status["goodput"] == round(100 / 110, 4) and status["ettr"] == round(90 / 110, 4)
    assert status["step"] == 30, "the high-water mark never goes down"
    # Past the high-water mark the time counts as progress again.
    later = {**raw, "status": {**status, "lastReconcileTime": ago(5)}}
    ahead = {W0: TrainerProbe(step=31, world_size=2, restarts=0)}
    _, status, _, _ = run(later, observed(later, [worker(0), worker(1)], probes=ahead))
    assert (status["productiveSeconds"], status["redoSeconds"]) == (105, 10)
    assert status["ettr"] == round(95 / 115, 4) and status["step"] == 31
    # A pass whose probes answered nothing is no evidence of replay.
    quiet = {**later, "status": {**status, "lastReconcileTime": ago(5)}}
    _, status, _, _ = run(quiet, observed(quiet, [worker(0), worker(1)]))
    assert status["redoSeconds"] == 10 and status["ettr"] == round(100 / 120, 4)


def test_a_job_being_deleted_is_left_alone():
    raw = job(status=running_status())
    raw["metadata"]["deletionTimestamp"] = ago(1)
    result = plan(raw, observed(raw, [worker(0, phase="Failed", exit_code=137)]), NOW)
    assert result.actions == [] and result.events == []


def test_an_eviction_in_progress_is_counted_once_as_a_disruption():
    raw = job(status=running_status())
    pods = [worker(0, deleting=True, disruption=True), worker(1)]
    first = plan(raw, observed(raw, pods), NOW)
    assert (first.status["disruptions"], first.status["restarts"]) == (1, 0)
    assert summary(first.actions) == []  # the API server is already deleting it
    again = plan({**raw, "status": first.status}, observed(raw, pods), NOW + timedelta(seconds=1))
    assert again.status["disruptions"] == 1


def test_the_rendezvous_store_on_a_failed_node_is_force_deleted_to_be_recreated():
    from llmtrain_operator.api.observed import PodView

    raw = job(status=running_status())
    store = PodView(name="tiny-elastic-rdzv", role="rendezvous", slot=None, generation=0, phase="Running", node="node-3", ready=True)
    obs = observed(raw, [worker(0), worker(1)], nodes=[node("node-0"), node("node-1"), node("node-3", ready="Unknown", since_seconds=60)],
                   with_store=False)
    obs = type(obs)(**{**obs.__dict__, "pods": obs.pods + (store,)})
    _, _, actions, events = run(raw, obs)
    assert actions == ["force-delete tiny-elastic-rdzv"] and "StoreRestarted" in events


def test_recovery_ends_with_the_first_step_the_trainer_finishes_after_the_failure():
    failure = {"kind": "ProcessCrash", "reason": "Signal9", "time": ago(10)}
    raw = job(status=running_status(lastFailure=failure, phase="Restarting"))
    before = {W0: TrainerProbe(step=20, last_step_time=(NOW - timedelta(seconds=12)).timestamp())}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=before))
    assert status.get("lastRecoverySeconds") is None  # that step predates the failure
    after = {W0: TrainerProbe(step=21, last_step_time=(NOW - timedelta(seconds=2)).timestamp())}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=after))
    assert status["lastRecoverySeconds"] == 8.0


def test_suspending_without_a_durable_tier_warns_that_checkpoints_are_lost():
    raw = job({"spec.suspend": True}, status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1)]), NOW)
    warning = next(e for e in result.events if e.reason == "Suspended")
    assert warning.type == "Warning" and "checkpoint.shared" in warning.message
    raw = job({"spec.suspend": True, "spec.checkpoint.shared": {"claimName": "ckpt"}}, status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1)]), NOW)
    assert next(e for e in result.events if e.reason == "Suspended").type == "Normal"


def test_an_in_place_restart_after_the_hang_watchdog_is_counted_as_a_hang():
    raw = job(status=running_status())
    probes = {W0: TrainerProbe(step=20, restarts=1, failed_attempts={"hang": 1}),
              W1: TrainerProbe(step=20, restarts=1, failed_attempts={"victim": 1})}
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["restartsByReason"] == {"Hang": 1} and status["lastFailure"]["kind"] == "Hang"


def test_a_hang_the_launcher_reports_first_is_charged_once_when_the_trainer_reports_it_too():
    """The launcher counts a failed attempt when torchrun starts the next; the restarted
    trainer counts the same attempt seconds later, and after another failure the two
    disagree until it is up. Each attempt is charged once, whatever the order."""
    raw = job(status=running_status())
    pods = [worker(0), worker(1)]
    # The restarted trainer is not up yet: only the launchers answer.
    launchers = {W0: {"hang": 1, "victim": 0}, W1: {"victim": 1}}
    first = plan(raw, observed(raw, pods, launcher_attempts=launchers), NOW)
    assert first.status["restartsByReason"] == {"Hang": 1} and first.status["lastFailure"]["pod"] == W0
    # The trainers are up and report the same attempts.
    later = {**raw, "status": first.status}
    probes = {W0: TrainerProbe(step=20, restarts=1, failed_attempts={"hang": 1}),
              W1: TrainerProbe(step=20, restarts=1, failed_attempts={"victim": 1})}
    second = plan(later, observed(later, pods, probes=probes, launcher_attempts=launchers), NOW + timedelta(seconds=5))
    assert second.status["restartsByReason"] == {"Hang": 1}
    # Another crash: the launcher knows, the trainer still shows the older count.
    later = {**raw, "status": second.status}
    launchers = {W0: {"hang": 1, "crash": 1}, W1: {"victim": 2}}
    third = plan(later, observed(later, pods, probes=probes, launcher_attempts=launchers), NOW + timedelta(seconds=10))
    assert third.status["restartsByReason"] == {"Hang": 1, "RestartedInPlace": 1}
    later = {**raw, "status": third.status}
    probes = {W0: TrainerProbe(step=21, restarts=2, failed_attempts={"hang": 1, "crash": 1})}
    fourth = plan(later, observed(later, pods, probes=probes), NOW + timedelta(seconds=15))
    assert fourth.status["restarts"] == 2, "the trainer's catching up is not a new failure"


def test_a_pod_that_ends_with_a_hang_its_launcher_counted_in_place_is_replaced_without_a_second_charge():
    """The launcher counts a hung attempt at once (torchrun has restarts left); the agent
    then ends instead of restarting, and the pod exits with the hang. The operator that saw
    the launcher's count charged it then; the exit replaces the pod only. An operator that
    never saw the count charges the exit (it is the only report)."""
    raw = job(status=running_status())
    first = plan(raw, observed(raw, [worker(0), worker(1)], launcher_attempts={W0: {"hang": 1}}), NOW)
    assert first.status["restartsByReason"] == {"Hang": 1}
    hung = {"code": 80, "reason": "Hang", "message": "cause (frozen): rank 0", "countedInPlace": 1}
    ended = [worker(0, phase="Failed", exit_code=80, termination=hung), worker(1)]
    later = {**raw, "status": first.status}
    second = plan(later, observed(later, ended), NOW + timedelta(seconds=3))
    assert second.status["restarts"] == 1 and second.status["restartsByReason"] == {"Hang": 1}
    assert "keep tiny-elastic-worker-0" in summary(second.actions)
    assert any(e.reason == "PodFailed" and "already charged" in e.message for e in second.events)
    # Never seen (the launcher counted while nobody scraped): the exit is charged.
    unseen = plan(raw, observed(raw, ended), NOW)
    assert unseen.status["restartsByReason"] == {"Hang": 1}
    assert unseen.status["lastFailure"]["pod"] == W0
    # A second hang of the same pod counted in place is not covered by the first count.
    twice = {**hung, "countedInPlace": 2}
    again = plan(later, observed(later, [worker(0, phase="Failed", exit_code=80, termination=twice), worker(1)]), NOW)
    assert again.status["restartsByReason"] == {"Hang": 2}
    # Labelled kept by someone else before this operator handled its end: still charged once.
    labelled = [worker(0, phase="Failed", exit_code=80, termination=hung, kept=True), worker(1)]
    kept = plan(later, observed(later, labelled), NOW + timedelta(seconds=3))
    assert kept.status["restarts"] == 1 and kept.status["restartsByReason"] == {"Hang": 1}


def test_a_node_that_is_ready_again_is_not_failed_while_its_taint_lingers():
    raw = job(status=running_status())
    nodes = [node("node-0"), node("node-1", ready="True", since_seconds=1, unreachable=True)]
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], nodes=nodes))
    assert actions == [] and status["restarts"] == 0


def test_a_status_written_by_an_earlier_version_keeps_its_bookkeeping():
    # Earlier versions kept the bookkeeping at the top of the status; an operator upgrade
    # must neither reset the counters nor charge an already charged failure again.
    legacy = running_status(restarts=1, countedFailures=["pod:uid-0"], notReadySince=ago(3),
                            torchrunRestarts={"x@y": 1}, hangsSeen={}, expectedInPlace=1)
    raw = job(status=legacy)
    failed = PodView(name=W0, role="worker", slot=0, generation=0, phase="Failed", uid="uid-0", node="node-0", exit_code=137)
    _, status, actions, _ = run(raw, observed(raw, [failed, worker(1)]))
    assert status["restarts"] == 1 and actions == [f"keep {W0}"]  # already charged: only the keep is repeated
    assert status["internal"]["chargedFailures"] == ["pod:uid-0"]
    assert not {"countedFailures", "torchrunRestarts", "hangsSeen", "expectedInPlace", "notReadySince"} & set(status)


def test_the_pod_template_merges_over_the_worker_pod_and_operator_fields_win():
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.api.job import SpecInvalid
    from llmtrain_operator.planner.manifests import worker_pod

    raw = job({"spec.podTemplate": {
        "metadata": {"labels": {"team": "nlp", "app.kubernetes.io/name": "mine"}, "annotations": {"note": "x"}},
        "spec": {"volumes": [{"name": "data", "emptyDir": {}}],
                 "containers": [{"name": "trainer", "command": ["evil"],
                                 "env": [{"name": "EXTRA", "value": "1"}, {"name": "LLMTRAIN_JOB", "value": "hijack"}],
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                                {"name": "sidecar", "image": "busybox"}],
                 "restartPolicy": "Always"}}})
    pod = worker_pod(parse_job(raw), 1, 0)
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    assert labels["team"] == "nlp" and labels["app.kubernetes.io/name"] == "llmtrain"  # the operator's label wins
    assert labels["llmtrain.io/slot"] == "1"
    # The operator's own label keys are refused outright: they say which pod holds a slot.
    with pytest.raises(SpecInvalid, match=r"spec.podTemplate.metadata.labels: llmtrain.io/slot: labels under llmtrain.io/"):
        parse_job(job({"spec.podTemplate": {"metadata": {"labels": {"llmtrain.io/slot": "7"}}}}))
    assert pod["metadata"]["annotations"]["note"] == "x"
    # Volumes and mounts merge by key (strategic merge): the operator's own stay.
    assert {v["name"] for v in spec["volumes"]} == {"run", "dshm", "tmp", "config", "ckpt-local", "data"}
    trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
    assert {m["mountPath"] for m in trainer["volumeMounts"]} >= {"/run/llmtrain", "/etc/llmtrain", "/ckpt/local", "/data"}
    assert trainer["command"][:3] == ["python", "-m", "llmtrain_trainer.launch.launcher"]  # the command is the operator's
    assert {"name": "EXTRA", "value": "1"} in trainer["env"]
    assert [e.get("value") for e in trainer["env"] if e["name"] == "LLMTRAIN_JOB"] == ["tiny-elastic"]  # owned env wins
    assert [c["name"] for c in spec["containers"]] == ["trainer", "sidecar"]
    assert spec["restartPolicy"] == "Never"


RESTRICTED_POD = {"runAsNonRoot": True, "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def test_worker_and_store_pods_are_pod_security_restricted_unless_the_template_says_otherwise():
    # tests/cluster/test_pod_security.py has the API server's PodSecurity admission judge them.
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.planner.manifests import store_pod, worker_pod

    default = parse_job(job())
    for pod in (worker_pod(default, 0, 0), store_pod(default)):
        assert pod["spec"]["securityContext"] == RESTRICTED_POD
        assert all(c["securityContext"] == RESTRICTED_CONTAINER for c in pod["spec"]["containers"])
    # A root image, allowed by the template: for the store (same image) too.
    as_root = parse_job(job({"spec.podTemplate": {"spec": {
        "securityContext": {"runAsNonRoot": False, "runAsUser": 0},
        "containers": [{"name": "trainer", "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}]}}}))
    for pod in (worker_pod(as_root, 0, 0), store_pod(as_root)):
        assert pod["spec"]["securityContext"] == {**RESTRICTED_POD, "runAsNonRoot": False, "runAsUser": 0}
        first = pod["spec"]["containers"][0]["securityContext"]
        assert first == {**RESTRICTED_CONTAINER, "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]}}


def test_worker_and_store_pods_get_no_api_token_unless_the_template_names_a_service_account():
    """Nothing in them calls the API server: a compromised rank finds no token to use. A
    template that names its own service account gets that account's default, or what it
    sets itself."""
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.planner.manifests import store_pod, worker_pod

    default = parse_job(job())
    for pod in (worker_pod(default, 0, 0), store_pod(default)):
        assert pod["spec"]["automountServiceAccountToken"] is False
    assert store_pod(default)["spec"]["containers"][0]["resources"]["limits"] == {"memory": "1Gi"}
    named = parse_job(job({"spec.podTemplate": {"spec": {"serviceAccountName": "trainer-reader"}}}))
    assert "automountServiceAccountToken" not in worker_pod(named, 0, 0)["spec"]
    explicit = parse_job(job({"spec.podTemplate": {"spec": {"serviceAccountName": "x", "automountServiceAccountToken": True}}}))
    assert worker_pod(explicit, 0, 0)["spec"]["automountServiceAccountToken"] is True
    assert store_pod(named)["spec"]["automountServiceAccountToken"] is False, "the store never takes the template"


def test_the_builtin_trainer_and_the_store_run_on_a_read_only_root_with_a_writable_tmp_and_a_script_need_not():
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.planner.manifests import store_pod, worker_pod

    for pod in (worker_pod(parse_job(job()), 0, 0), store_pod(parse_job(job()))):
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        assert {"name": "tmp", "emptyDir": {}} in pod["spec"]["volumes"]
    # DeepSpeed builds its ops at first use: under /tmp, not in the image's home folder.
    zero = worker_pod(parse_job(job({"spec.trainer.builtin.strategy": {"kind": "deepspeed", "zeroStage": 2}})), 0, 0)
    assert {"name": "TORCH_EXTENSIONS_DIR", "value": "/tmp/torch_extensions"} in zero["spec"]["containers"][0]["env"]
    assert all(e["name"] != "TORCH_EXTENSIONS_DIR" for e in worker_pod(parse_job(job()), 0, 0)["spec"]["containers"][0]["env"])
    mine = worker_pod(parse_job(job({"spec.trainer.builtin.strategy": {"kind": "deepspeed"},
                                     "spec.env": [{"name": "TORCH_EXTENSIONS_DIR", "value": "/cache/ops"}]})), 0, 0)
    assert [e["value"] for e in mine["spec"]["containers"][0]["env"] if e["name"] == "TORCH_EXTENSIONS_DIR"] == ["/cache/ops"]
    # A template may turn it off.
    writable = worker_pod(parse_job(job({"spec.podTemplate": {"spec": {"containers": [
        {"name": "trainer", "securityContext": {"readOnlyRootFilesystem": False}}]}}})), 0, 0)
    assert writable["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


def test_a_host_path_tier_runs_as_root_to_write_the_folder_the_kubelet_creates():
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.planner.manifests import worker_pod

    pod = worker_pod(parse_job(job({"spec.checkpoint.local": {"hostPath": "/mnt/nvme/llmtrain"}})), 0, 0)
    assert pod["spec"]["securityContext"]["runAsUser"] == 0 and pod["spec"]["securityContext"]["runAsNonRoot"] is False
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_worker_pod_has_a_liveness_probe_on_the_launcher_lasting_the_hang_timeout_and_a_margin():
    """A frozen launcher (alone or with its pod) is seen by the kubelet: the probe targets
    the launcher's /healthz, fails for hangTimeoutSeconds and the margin that leaves a pod
    with peers to their reports first (policies/frozen_pods.py), and kills quickly."""
    from llmtrain_contract.names import HEALTH_PORT
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.planner.manifests import LIVENESS_MARGIN_SECONDS, worker_pod

    pod = worker_pod(parse_job(job({"spec.faultTolerance.hangTimeoutSeconds": 31})), 0, 0)
    trainer = pod["spec"]["containers"][0]
    probe = trainer["livenessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": HEALTH_PORT}
    lasts = 31 + LIVENESS_MARGIN_SECONDS
    assert LIVENESS_MARGIN_SECONDS >= 10 and lasts <= probe["periodSeconds"] * probe["failureThreshold"] <= lasts + probe["periodSeconds"]
    assert probe["terminationGracePeriodSeconds"] < pod["spec"]["terminationGracePeriodSeconds"]
    assert {"name": "health", "containerPort": HEALTH_PORT} in trainer["ports"]
    command = trainer["command"]
    assert command[command.index("--health-port") + 1] == str(HEALTH_PORT) and command.index("--health-port") < command.index("--")


def test_a_skipped_window_is_recorded_once_with_an_event_and_as_the_last_failure():
    raw = job(status=running_status(step=30))
    probes = {W0: TrainerProbe(step=30, world_size=2, rollbacks=1, skipped=((11, 13, 80, 104),)),
              W1: TrainerProbe(step=30, world_size=2, rollbacks=1, skipped=((11, 13, 80, 104),))}
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1)], probes=probes))
    assert status["numerics"] == {"rollbacks": 1, "skipped": [{"firstStep": 11, "lastStep": 13, "firstSample": 80, "endSample": 104}]}
    assert events.count("RolledBack") == 1 and actions == []
    assert status["lastFailure"]["kind"] == "BadNumerics" and "samples 80..103" in status["lastFailure"]["message"]
    assert status["restarts"] == 0, "a rollback is not charged to the restart budget"
    again = job(status=status)
    _, status2, _, events2 = run(again, observed(again, [worker(0), worker(1)], probes=probes))
    assert "RolledBack" not in events2 and status2["numerics"] == status["numerics"]


# ---------------------------------------------------------------- a user's script

SCRIPT = {"spec.trainer": {"command": ["/app/train.py"], "args": ["--lr", "0.1"]}, "spec.image": "example.com/mine:1"}


def test_a_script_pod_runs_the_launcher_copied_in_from_the_runtime_image():
    """The user's image needs only Python and torch: an init container (the runtime
    image) copies the launcher, the runner and the store into an emptyDir."""
    from llmtrain_contract.names import HEALTH_PORT
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.planner.manifests import store_pod, worker_pod

    spec = parse_job(job(SCRIPT))
    pod = worker_pod(spec, 0, 0, runtime_image="registry.local/llmtrain-operator:9")
    [init] = pod["spec"]["initContainers"]
    assert init["image"] == "registry.local/llmtrain-operator:9"
    assert init["command"] == ["python", "-m", "llmtrain_trainer.launch.bundle", "/opt/llmtrain"]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    [trainer] = pod["spec"]["containers"]
    assert trainer["image"] == "example.com/mine:1"
    command = trainer["command"]
    assert command[:2] == ["python", "/opt/llmtrain/launcher.py"]
    assert command[command.index("--") + 1:][:3] == ["python", "-m", "torch.distributed.run"]
    assert command[-4:] == ["/opt/llmtrain/script.py", "/app/train.py", "--lr", "0.1"]
    assert {"name": "llmtrain-runtime", "mountPath": "/opt/llmtrain"} in trainer["volumeMounts"]
    assert trainer["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": HEALTH_PORT}, "no metrics of ours to be ready on"
    assert {"name": "LLMTRAIN_PROGRESS_FILE", "value": "/run/llmtrain/progress/pod"} in trainer["env"]
    store = store_pod(spec, "registry.local/llmtrain-operator:9")
    assert store["spec"]["containers"][0]["command"][:2] == ["python", "/opt/llmtrain/rdzv_store.py"]
    assert store["spec"]["initContainers"][0]["image"] == "registry.local/llmtrain-operator:9"
    builtin = worker_pod(parse_job(job()), 0, 0)
    assert "initContainers" not in builtin["spec"], "the built-in trainer's image has the launcher"
    assert builtin["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/metrics"


def test_the_runtime_image_reaches_the_pods_the_planner_creates():
    raw = job(SCRIPT)
    result = plan(raw, observed(raw, [], with_store=False), NOW, runtime_image="registry.local/rt:2")
    pods = [a.manifest for a in result.actions if getattr(a, "kind", "") == "Pod"]
    assert len(pods) == 3 and all(p["spec"]["initContainers"][0]["image"] == "registry.local/rt:2" for p in pods)


def test_a_script_that_never_reports_a_step_is_not_wedged():
    raw = job(SCRIPT, status=running_status(lastProgressTime=ago(130), step=0))
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], probes={}))
    assert actions == [] and not status.get("restartsByReason"), "nothing reported: no progress timeout"


def test_a_script_that_reports_its_steps_is_watched_like_the_trainer():
    raw = job(SCRIPT, status=running_status(lastProgressTime=ago(130), step=0))
    stale = {W0: TrainerProbe(step=7, last_step_time=NOW.timestamp() - 200)}
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=stale))
    assert status["step"] == 7
    fresh = job(SCRIPT, status=running_status(lastProgressTime=ago(130), step=7))
    _, status, actions, _ = run(fresh, observed(fresh, [worker(0), worker(1)], probes={}))
    assert status["restartsByReason"] == {"Wedged": 1}, "once it reported a step, its silence is a wedge"


def test_planning_a_received_job_leaves_what_was_received_as_it_was():
    # The handler reads the job once per pass and hands that reading to the planner, which
    # builds the new status from a copy.
    raw = job(status=running_status(step=10))
    received = receive(raw)
    before = received.status.model_dump()
    result = plan_received(received, observed(raw, [worker(0), worker(1, phase="Failed", exit_code=137)]), NOW)
    assert result.status["restarts"] == 1
    assert received.status.model_dump() == before
    assert plan_received(received, observed(raw, [worker(0), worker(1, phase="Failed", exit_code=137)]), NOW).status == result.status
