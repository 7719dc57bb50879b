"""The straggler watch (every rank runs it on the same numbers) and the operator's policy."""

from __future__ import annotations

import pytest
from llmtrain_contract.config import StragglerRuntime
from llmtrain_operator.api.observed import TrainerProbe
from llmtrain_trainer.train.stragglers import StragglerWatch
from support.planning import job, observed, running_status, worker
from test_planner import W0, W1, run


def test_a_rank_slow_for_n_steps_is_flagged_once_and_cleared_after_n_fast_steps():
    watch = StragglerWatch(StragglerRuntime(factor=2, steps=3, min_excess_seconds=0.05))
    assert watch.observe([0.1, 0.5]) == ({}, set())
    assert watch.observe([0.1, 0.5]) == ({}, set())
    new, _ = watch.observe([0.1, 0.5])
    assert new == {1: 5.0}, "two ranks: each is compared with the other, not with a median that includes itself"
    assert watch.observe([0.1, 0.6]) == ({}, set()) and watch.flagged == {1: pytest.approx(6.0)}
    watch.observe([0.1, 0.1])
    watch.observe([0.1, 0.1])
    assert watch.observe([0.1, 0.1]) == ({}, {1})
    assert watch.flagged == {}


def test_a_slow_streak_that_breaks_starts_over_and_noise_on_short_steps_is_not_slow():
    watch = StragglerWatch(StragglerRuntime(factor=2, steps=3, min_excess_seconds=0.05))
    for times in ([0.1, 0.1, 0.5, 0.1], [0.1, 0.1, 0.5, 0.1], [0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.5, 0.1], [0.1, 0.1, 0.5, 0.1]):
        assert watch.observe(times) == ({}, set())
    for _ in range(5):
        assert watch.observe([0.001, 0.001, 0.01, 0.001]) == ({}, set()), "10x, but only 9 ms above the median"
    off = StragglerWatch(StragglerRuntime(steps=0))
    assert off.observe([0.1, 9.0]) == ({}, set())


def probes(stragglers):
    return {W0: TrainerProbe(step=30, world_size=2), W1: TrainerProbe(step=30, world_size=2, stragglers=stragglers)}


def test_a_reported_straggler_sets_the_condition_and_one_event_naming_rank_pod_and_node():
    raw = job(status=running_status(step=30))
    _, status, actions, events = run(raw, observed(raw, [worker(0, node="node-1"), worker(1, node="node-2")], probes=probes({1: 5.2})))
    cond = {c["type"]: c for c in status["conditions"]}["Straggler"]
    assert cond["status"] == "True" and f"rank 1 in pod {W1} on node node-2 (5.2x)" in cond["message"]
    assert events.count("Straggler") == 1 and actions == [] and status["restarts"] == 0
    again = job(status=status)
    _, status2, _, events2 = run(again, observed(again, [worker(0, node="node-1"), worker(1, node="node-2")], probes=probes({1: 5.0})))
    assert "Straggler" not in events2, "announced once per pod and rank"
    healed = job(status=status2)
    _, status3, _, _ = run(healed, observed(healed, [worker(0, node="node-1"), worker(1, node="node-2")], probes=probes({})))
    assert {c["type"]: c["status"] for c in status3["conditions"]}["Straggler"] == "False"


def test_with_replace_the_stragglers_pod_is_deleted_and_its_node_quarantined_uncharged():
    raw = job({"spec.faultTolerance.stragglers": {"action": "Replace", "steps": 10}}, status=running_status(step=30))
    _, status, actions, events = run(raw, observed(raw, [worker(0, node="node-1"), worker(1, node="node-2")], probes=probes({1: 3.0})))
    assert actions == [f"delete {W1}"] and "StragglerReplaced" in events
    assert [q["node"] for q in status["quarantinedNodes"]] == ["node-2"]
    assert status["restarts"] == 0


def test_a_job_that_never_had_a_straggler_has_no_straggler_condition():
    raw = job(status=running_status(step=30))
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)], probes=probes({})))
    assert "Straggler" not in {c["type"] for c in status["conditions"]}


@pytest.mark.parametrize("values", [[0.1, 0.5], [3.0, 1.0, 2.0], [0.2, 0.2, 0.9, 0.1], [5, 1, 4, 2, 3], [1.0] * 6])
def test_medians_of_others_agree_with_the_definition(values):
    import statistics

    from llmtrain_trainer.train.stragglers import medians_of_others

    expected = [statistics.median(values[:i] + values[i + 1:]) for i in range(len(values))]
    assert medians_of_others(values) == pytest.approx(expected)
