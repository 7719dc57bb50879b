"""The loss guard and the data position, without torch processes (the rollback itself is
tested with real ranks in tests/trainer/runs/test_numerics.py)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from llmtrain_contract.config import NumericsRuntime
from llmtrain_trainer.train.numerics import DataPosition, LossGuard


def test_non_finite_losses_are_bad_from_the_first_step_and_not_remembered():
    guard = LossGuard(NumericsRuntime(spike_std_devs=6, window_steps=5))
    for bad in (math.nan, math.inf, -math.inf):
        assert guard.judge(bad) is not None
    assert len(guard.window) == 0


def test_a_spike_is_judged_only_once_the_window_is_full_and_only_upwards():
    guard = LossGuard(NumericsRuntime(spike_std_devs=3, window_steps=5))
    assert guard.judge(100.0) is None  # window not full: no spike rule yet
    guard.reset()
    for loss in (5.0, 5.1, 4.9, 5.0, 5.05):
        assert guard.judge(loss) is None
    why = guard.judge(9.0)
    assert why is not None and "standard deviations and 3.99 above" in why
    assert guard.judge(5.02) is None, "the spike was not added to the window"
    assert guard.judge(1.0) is None, "a sudden drop is not a failure"


def test_near_convergence_noise_many_deviations_above_a_flat_window_is_not_a_spike():
    """The goodput run's fourth false rollback: a memorised shard's loss of 0.1654 on
    average, then 0.3686, 6.2 deviations above it but 0.2 nats."""
    guard = LossGuard(NumericsRuntime(spike_std_devs=6, spike_min_rise=0.5, window_steps=50))
    for i in range(50):
        assert guard.judge(0.1654 + (0.03 if i % 2 else -0.03)) is None
    assert guard.judge(0.3686) is None
    assert guard.judge(0.2) is None
    why = guard.judge(0.9)
    assert why is not None and "above the last 50 steps' mean" in why
    # Without the rise rule, the same noise is a spike.
    strict = LossGuard(NumericsRuntime(spike_std_devs=6, spike_min_rise=0, window_steps=50))
    for i in range(50):
        strict.judge(0.1654 + (0.03 if i % 2 else -0.03))
    assert strict.judge(0.3686) is not None


def test_a_rise_above_the_minimum_within_the_noise_is_not_a_spike():
    guard = LossGuard(NumericsRuntime(spike_std_devs=6, spike_min_rise=0.5, window_steps=5))
    for loss in (6.0, 8.0, 5.0, 7.5, 6.5):  # an early, noisy loss: std 1.1
        assert guard.judge(loss) is None
    assert guard.judge(7.7) is None, "1 nat above the mean but within the noise"


def test_spikes_off_judges_only_non_finite_losses():
    guard = LossGuard(NumericsRuntime(spike_std_devs=0, window_steps=5))
    for loss in (1.0, 1.0, 1.0, 1.0, 1.0, 1e9):
        assert guard.judge(loss) is None


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 10)), max_size=6), st.integers(1, 64))
def test_skips_leave_every_sample_trained_once_or_skipped(rollbacks, gbs):
    """Any sequence of rollbacks (to a step at or before the bad one): the kept trajectory
    and the recorded skips together cover the stream exactly once."""
    pos = DataPosition()
    kept: dict[int, int] = {}  # step -> data step it read, last write wins (as the step log)
    step = 0
    for back, ahead in rollbacks:
        for s in range(step, step + ahead):  # train `ahead` steps, the last one bad
            kept[s + 1] = pos.data_step(s)
        bad = step + ahead
        restored = max(0, min(bad - 1, step - back))
        for s in [s for s in kept if s > restored]:
            del kept[s]
        pos.skip(restored, bad, gbs, "nan")
        step = restored
    for s in range(step, step + 5):
        kept[s + 1] = pos.data_step(s)
    trained = sorted(i for d in kept.values() for i in range(d * gbs, (d + 1) * gbs))
    skipped = sorted(i for sk in pos.skips for i in range(sk.first_sample, sk.end_sample))
    assert len(trained) == len(set(trained)) and len(skipped) == len(set(skipped))
    assert sorted(trained + skipped) == list(range(len(trained) + len(skipped)))
    assert DataPosition.from_wire(pos.to_wire()) == pos


def test_a_verdict_judges_like_judge_but_remembers_nothing():
    """The rescue of a step whose loss the ranks never agreed on asks the guard about one
    rank's loss without adding it to the window."""
    guard = LossGuard(NumericsRuntime(spike_std_devs=3, window_steps=5))
    for loss in (5.0, 5.1, 4.9, 5.0, 5.05):
        guard.judge(loss)
    window = list(guard.window)
    assert guard.verdict(9.0) == guard.judge(9.0) and guard.verdict(9.0) is not None
    assert guard.verdict(5.02) is None and guard.verdict(math.nan) is not None
    assert list(guard.window) == window
