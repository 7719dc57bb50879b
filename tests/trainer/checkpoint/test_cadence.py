"""The adaptive checkpoint interval: Young/Daly's formula, its inputs, and how the
trainer's cadence takes them (measured cost and step time, the job's failure history
from ``cadence.json``) and when checkpoints fall due."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llmtrain_contract.cadence import CADENCE_FILE, LATENCY_FLOOR, SaveCost, interval, mtbf_seconds, young_daly_seconds
from llmtrain_contract.config import CheckpointRuntime
from llmtrain_trainer.checkpoint.cadence import STEP_WINDOW, Cadence


class Metrics:
    def __init__(self):
        self.calls = []

    def cadence(self, steps, chosen):
        self.calls.append((steps, chosen))


def test_young_daly_is_the_square_root_of_twice_cost_times_mtbf():
    assert young_daly_seconds(2.0, 3600.0) == pytest.approx(120.0)
    assert young_daly_seconds(0.0, 3600.0) == 0.0


def test_the_prior_counts_as_one_failure():
    assert mtbf_seconds(0, 0.0, 14400.0) == 14400.0
    assert mtbf_seconds(0, 3600.0, 14400.0) == 18000.0
    assert mtbf_seconds(3, 3600.0, 14400.0) == pytest.approx(18000.0 / 4)


@given(cost=st.floats(0.01, 100), mtbf=st.floats(10, 1e6), step=st.floats(0.01, 100),
       low=st.integers(1, 50), span=st.integers(0, 5000), latency=st.floats(0, 100))
def test_the_interval_in_steps_is_the_optimum_at_least_twice_the_latency_clamped(cost, mtbf, step, low, span, latency):
    high = low + span
    chosen = interval(cost, mtbf, step, low, high, latency)
    assert low <= chosen.steps <= high
    ideal = max(round(math.sqrt(2 * cost * mtbf) / step), math.ceil(LATENCY_FLOOR * latency / step))
    if low < ideal < high:
        assert chosen.steps == ideal
    if chosen.steps < high:
        assert chosen.steps * step >= LATENCY_FLOOR * latency - 1e-9, "never shorter than twice the write"
    assert "sqrt(2 x cost" in chosen.explain()


@given(failures=st.integers(0, 50), active=st.floats(0, 1e6))
def test_more_failures_never_lengthen_the_interval(failures, active):
    a = interval(1.0, mtbf_seconds(failures, active, 3600.0), 1.0, 1, 10**9).steps
    b = interval(1.0, mtbf_seconds(failures + 1, active, 3600.0), 1.0, 1, 10**9).steps
    assert b <= a


def _auto(tmp_path, **auto):
    runtime = CheckpointRuntime.model_validate({"intervalSteps": 7, "auto": {"initialSteps": 10, "minSteps": 2, "maxSteps": 1000,
                                                                              "mtbfPriorSeconds": 600, **auto}})
    cadence = Cadence(runtime, tmp_path, Metrics())
    cadence.start(0)
    return cadence


WARM_UP = 9.0
"""The first step after a start: never measured."""


def _saves(*stalls: float, latency: float = 2.0) -> list[SaveCost]:
    """Checkpoints with these stalls, each committed ``latency`` seconds after its snapshot."""
    return [SaveCost(stall, latency) for stall in stalls]


def _history(tmp_path, failures, active, when):
    path = tmp_path / CADENCE_FILE
    path.write_text(json.dumps({"failures": failures, "activeSeconds": active, "time": when}))
    os.utime(path, (when + failures, when + failures))  # a new mtime: the trainer re-reads it


def test_the_initial_interval_holds_until_a_checkpoint_cost_is_measured(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(WARM_UP, [], False)
    cadence.observe(0.5, [], False)
    assert cadence.proposal(now=1000.0) == 10
    cadence.observe(0.5, _saves(2.0), False)
    # sqrt(2 x 2 x 600) = 49 s at 0.5 s a step
    assert cadence.proposal(now=1000.0) == 98
    assert cadence.chosen.step_seconds == 0.5


def test_the_step_time_leaves_out_the_first_step_after_a_start_and_the_steps_a_write_overlaps(tmp_path):
    cadence = _auto(tmp_path)
    saves: list[SaveCost] = []
    for _ in range(2):  # a restart in the same process (a rollback) warms up again
        cadence.observe(WARM_UP, saves, False)
        for i in range(1, 13):
            # A checkpoint after every fourth step; its write slows the next step by 0.2 s.
            if i % 4 == 3:
                saves.append(SaveCost(0.001, 0.3))
            cadence.observe(0.7 if i % 4 == 0 else 0.5, saves, i % 4 == 3)
        assert cadence.step_seconds() == 0.5
        assert cadence.cost_seconds() == pytest.approx(0.001 + 0.2), "the stall plus one overlapped step's excess"
        # sqrt(2 x 0.201 x 600) = 15.5 s at 0.5 s a step
        assert cadence.proposal(now=1000.0) == 31
        cadence.start(12)
    # A lasting change of pace (4x: the interference is a fraction of the step, so the
    # optimum in steps halves, outside the band) is followed within half the window
    # (after the warm-up).
    for _ in range(1 + 13):
        cadence.observe(2.0, saves, False)
    cadence.proposal(now=1000.0)
    assert cadence.chosen.step_seconds == 2.0


def test_the_writes_latency_does_not_move_the_interval_its_interference_does(tmp_path):
    """Young/Daly with a background write: the overhead C/T + (T/2 + L)/MTBF is least at
    sqrt(2 C MTBF) whatever the latency L is."""
    def chosen(latency: float, slowdown: float) -> int:
        cadence = Cadence(CheckpointRuntime.model_validate({"intervalSteps": 10, "auto": {
            "initialSteps": 10, "minSteps": 1, "maxSteps": 100000, "mtbfPriorSeconds": 600}}), None, Metrics())
        cadence.start(0)
        saves: list[SaveCost] = []
        cadence.observe(WARM_UP, saves, False)
        for i in range(1, 42):  # ends on the step after the last save
            if i % 10 == 0:
                saves.append(SaveCost(0.0005, latency))
            cadence.observe(0.2 + (slowdown if i % 10 == 1 and i > 1 else 0.0), saves, i % 10 == 0)
        return cadence.proposal(now=0.0)

    assert chosen(0.3, 0.02) == chosen(1.0, 0.02), "the latency is not a cost"
    # 0.0005 + 0.02: sqrt(2 x 0.0205 x 600) = 4.96 s = 25 steps of 0.2 s
    assert chosen(0.3, 0.02) == 25
    assert chosen(0.3, 0.08) > chosen(0.3, 0.02), "a write that slows the steps more is taken less often"
    # The latency as the cost (as this trainer first counted it) chose an interval 3.7x as long.
    assert round(math.sqrt(2 * 0.3 * 600) / 0.2) > 3.5 * chosen(0.3, 0.02)


def test_the_interval_is_at_least_twice_the_writes_latency(tmp_path):
    cadence = _auto(tmp_path, minSteps=1)
    cadence.observe(WARM_UP, [], False)
    cadence.observe(0.5, [SaveCost(0.0001, 4.0)], False)
    # sqrt(2 x 0.0001 x 600) = 0.35 s, 1 step; but a write takes 4 s: 2 x 4 / 0.5 = 16 steps
    assert cadence.proposal(now=1000.0) == LATENCY_FLOOR * 8
    assert cadence.chosen.latency_seconds == 4.0


def test_while_every_step_overlaps_a_write_the_latency_is_the_cost_and_the_interval_grows_out_of_it(tmp_path):
    cadence = _auto(tmp_path, initialSteps=2, minSteps=1)
    cadence.observe(WARM_UP, [], True)
    saves = [SaveCost(0.001, 3.0)]
    for _ in range(5):
        cadence.observe(0.5, saves, True)
    assert cadence.cost_seconds() == 3.0 and cadence.step_seconds() == 0.5
    # sqrt(2 x 3 x 600) = 60 s = 120 steps, far past the 2 in force and the write
    assert cadence.proposal(now=1000.0) == 120


def test_failures_in_the_history_shorten_the_interval_as_they_happen(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(WARM_UP, [], False)
    cadence.observe(0.5, _saves(2.0), False)
    _history(tmp_path, 0, 0.0, 1000.0)
    before = cadence.proposal(now=1000.0)
    _history(tmp_path, 3, 300.0, 1100.0)
    after = cadence.proposal(now=1100.0)
    assert after < before
    assert cadence.chosen.mtbf_seconds == pytest.approx((600 + 300) / 4)
    # active time runs on from when the history was written: the MTBF doubles, the
    # optimum grows by sqrt(2), within the band: held
    assert cadence.proposal(now=1100.0 + 900) == after
    # it triples: the optimum grows by sqrt(3), outside the band: followed
    later = cadence.proposal(now=1100.0 + 1800)
    assert cadence.chosen.mtbf_seconds == pytest.approx((600 + 2100) / 4) and later > after


def test_a_history_being_replaced_or_garbled_keeps_the_last_one_read(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(WARM_UP, [], False)
    cadence.observe(0.5, _saves(2.0), False)
    _history(tmp_path, 2, 100.0, 1000.0)
    first = cadence.proposal(now=1000.0)
    (tmp_path / CADENCE_FILE).write_text("{not json")
    assert cadence.proposal(now=1000.0) == first
    (tmp_path / CADENCE_FILE).unlink()
    assert cadence.proposal(now=1000.0) == first


def test_the_cost_is_a_running_average_of_each_new_checkpoint(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(1.0, _saves(10.0), False)
    cadence.observe(1.0, _saves(10.0, 0.0), False)
    # no step overlapped a write: the stall alone, 0.7 x 10 + 0.3 x 0
    assert cadence.cost_seconds() == pytest.approx(7.0)
    cadence.observe(1.0, _saves(10.0, 0.0), False)
    assert cadence.cost_seconds() == pytest.approx(7.0), "the same checkpoint is not counted twice"


def test_auto_checkpoints_fall_due_after_the_agreed_interval_from_the_last_one(tmp_path):
    cadence = _auto(tmp_path)
    cadence.start(100)
    cadence.agreed(10)
    assert [s for s in range(101, 125) if cadence.due(s, 1000)][:1] == [110]
    cadence.saved(110)
    cadence.agreed(4)  # failures shortened it: the next one comes 4 steps after the last
    assert cadence.due(114, 1000) and not cadence.due(113, 1000)
    cadence.deferred()
    assert cadence.due(113, 1000), "a deferred checkpoint is taken at the next step"
    assert not cadence.due(1000, 1000), "the final save follows instead"


def test_a_fixed_interval_saves_every_multiple_and_ignores_history(tmp_path):
    runtime = CheckpointRuntime.model_validate({"intervalSteps": 5})
    cadence = Cadence(runtime, tmp_path, Metrics())
    _history(tmp_path, 10, 10.0, 1000.0)
    cadence.observe(1.0, _saves(3.0), False)
    assert cadence.proposal() == 5
    assert [s for s in range(1, 21) if cadence.due(s, 100)] == [5, 10, 15, 20]


def test_a_deferred_checkpoint_becomes_overdue_when_the_next_one_falls_due(tmp_path):
    fixed = Cadence(CheckpointRuntime.model_validate({"intervalSteps": 5}), tmp_path, Metrics())
    fixed.saved(5)
    assert not fixed.overdue(10), "nothing deferred"
    fixed.deferred()
    assert [s for s in range(11, 21) if fixed.overdue(s)] == [15, 20]
    fixed.saved(15)
    assert not fixed.overdue(20)

    auto = _auto(tmp_path)
    auto.start(100)
    auto.agreed(10)
    auto.deferred()
    assert [s for s in range(101, 125) if auto.overdue(s)][:1] == [120]


def test_the_interval_holds_while_the_optimum_moves_within_the_band_and_follows_a_lasting_change(tmp_path, caplog):
    import logging

    cadence = _auto(tmp_path)
    cadence.observe(WARM_UP, [], False)
    cadence.observe(0.5, _saves(2.0), False)
    with caplog.at_level(logging.WARNING, logger="llmtrain.cadence"):
        assert cadence.proposal(now=1000.0) == 98
        # Step-time and cost swings of +-20 % (as on a loaded machine): the optimum moves
        # by tens of steps, the interval (and the inputs shown with it) not.
        optima = set()
        costs = _saves(2.0)
        for i in range(60):
            if i % 10 == 9:
                costs.append(SaveCost(2.0 * (1.2 if i % 20 == 9 else 0.8), 2.0))
            cadence.observe(0.5 * (1.2 if (i // 5) % 2 else 0.8), costs, False)
            optima.add(round(math.sqrt(2 * cadence.cost_seconds() * 600) / cadence.step_seconds()))
            assert cadence.proposal(now=1000.0) == 98 and cadence.chosen.step_seconds == 0.5
        assert max(optima) - min(optima) > 0.2 * 98, f"the optimum itself moved: {sorted(optima)}"
        assert len([r for r in caplog.records if "checkpoint interval" in r.message]) == 1, "one change, one line"
        # A failure chooses again, even within the band (the MTBF it brings is news).
        _history(tmp_path, 1, 1100.0, 1000.0)
        cadence.proposal(now=1000.0)
        assert cadence.chosen.mtbf_seconds == pytest.approx((600 + 1100) / 2)
        # Twice the pace: the optimum halves, far outside the band, and is followed.
        for _ in range(STEP_WINDOW):
            cadence.observe(1.0, _saves(2.0), False)
        assert cadence.proposal(now=1000.0) == cadence.chosen.steps
        assert cadence.chosen.step_seconds == 1.0
