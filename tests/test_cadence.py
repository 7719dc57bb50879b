"""The adaptive checkpoint interval: Young/Daly's formula, its inputs, and how the
trainer's cadence takes them (measured cost and step time, the job's failure history
from ``cadence.json``) and when checkpoints fall due."""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llmtrain_contract.cadence import CADENCE_FILE, interval, mtbf_seconds, young_daly_seconds
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
       low=st.integers(1, 50), span=st.integers(0, 5000))
def test_the_interval_in_steps_is_the_optimum_clamped(cost, mtbf, step, low, span):
    high = low + span
    chosen = interval(cost, mtbf, step, low, high)
    assert low <= chosen.steps <= high
    ideal = math.sqrt(2 * cost * mtbf) / step
    if low < round(ideal) < high:
        assert chosen.steps == round(ideal)
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


def _history(tmp_path, failures, active, when):
    path = tmp_path / CADENCE_FILE
    path.write_text(json.dumps({"failures": failures, "activeSeconds": active, "time": when}))
    os.utime(path, (when + failures, when + failures))  # a new mtime: the trainer re-reads it


def test_the_initial_interval_holds_until_a_checkpoint_cost_is_measured(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(WARM_UP, [])
    cadence.observe(0.5, [])
    assert cadence.proposal(now=1000.0) == 10
    cadence.observe(0.5, [2.0])
    # sqrt(2 x 2 x 600) = 49 s at 0.5 s a step
    assert cadence.proposal(now=1000.0) == 98
    assert cadence.chosen.step_seconds == 0.5


def test_the_step_time_leaves_out_the_first_step_after_a_start_and_a_checkpoints_stall(tmp_path):
    cadence = _auto(tmp_path)
    for _ in range(2):  # a restart in the same process (a rollback) warms up again
        cadence.observe(WARM_UP, [])
        for i in range(12):
            # every fourth step took a checkpoint and carries its 2 s stall
            cadence.observe(0.5 + (2.0 if i % 4 == 3 else 0.0), [2.0] if i >= 3 else [])
        assert cadence.proposal(now=1000.0) == 98
        assert cadence.chosen.step_seconds == 0.5
        cadence.start(12)
    # A lasting change of pace is followed within half the window.
    for _ in range(13):
        cadence.observe(1.0, [2.0])
    cadence.proposal(now=1000.0)
    assert cadence.chosen.step_seconds == 1.0


def test_failures_in_the_history_shorten_the_interval_as_they_happen(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(WARM_UP, [])
    cadence.observe(0.5, [2.0])
    _history(tmp_path, 0, 0.0, 1000.0)
    before = cadence.proposal(now=1000.0)
    _history(tmp_path, 3, 300.0, 1100.0)
    after = cadence.proposal(now=1100.0)
    assert after < before
    assert cadence.chosen.mtbf_seconds == pytest.approx((600 + 300) / 4)
    # active time runs on from when the history was written
    later = cadence.proposal(now=1100.0 + 900)
    assert cadence.chosen.mtbf_seconds == pytest.approx((600 + 1200) / 4) and later > after


def test_a_history_being_replaced_or_garbled_keeps_the_last_one_read(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(WARM_UP, [])
    cadence.observe(0.5, [2.0])
    _history(tmp_path, 2, 100.0, 1000.0)
    first = cadence.proposal(now=1000.0)
    (tmp_path / CADENCE_FILE).write_text("{not json")
    assert cadence.proposal(now=1000.0) == first
    (tmp_path / CADENCE_FILE).unlink()
    assert cadence.proposal(now=1000.0) == first


def test_the_cost_is_a_running_average_of_each_new_checkpoint(tmp_path):
    cadence = _auto(tmp_path)
    cadence.observe(1.0, [10.0])
    cadence.observe(1.0, [10.0, 0.0])
    assert cadence._cost == pytest.approx(7.0)  # 0.7 x 10 + 0.3 x 0
    cadence.observe(1.0, [10.0, 0.0])
    assert cadence._cost == pytest.approx(7.0), "the same checkpoint is not counted twice"


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
    cadence.observe(1.0, [3.0])
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
    cadence.observe(WARM_UP, [])
    cadence.observe(0.5, [2.0])
    with caplog.at_level(logging.WARNING, logger="llmtrain.cadence"):
        assert cadence.proposal(now=1000.0) == 98
        # Step-time jitter of +-10 %: the optimum moves by several steps, the interval
        # (and the inputs shown with it) not.
        optima = set()
        for i in range(60):
            cadence.observe(0.5 * (1.1 if i % 2 else 0.9), [2.0])
            optima.add(round(math.sqrt(2 * cadence._cost * 600) / statistics.median(cadence._steps)))
            assert cadence.proposal(now=1000.0) == 98 and cadence.chosen.step_seconds == 0.5
        assert len(optima) > 1, "the optimum itself moved"
        assert len([r for r in caplog.records if "checkpoint interval" in r.message]) == 1, "one change, one line"
        # A failure chooses again, even within the band (the MTBF it brings is news).
        _history(tmp_path, 1, 1100.0, 1000.0)
        cadence.proposal(now=1000.0)
        assert cadence.chosen.mtbf_seconds == pytest.approx((600 + 1100) / 2)
        # Twice the pace: the optimum halves, far outside the band, and is followed.
        for _ in range(STEP_WINDOW):
            cadence.observe(1.0, [2.0])
        assert cadence.proposal(now=1000.0) == cadence.chosen.steps
        assert cadence.chosen.step_seconds == 1.0
