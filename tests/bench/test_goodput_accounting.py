"""The goodput benchmark's accounting (bench/_goodput.py): interruptions found in a step
log seen from outside, their spans, and ETTR."""

import math
import sys

import pytest
from support.specs import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from _goodput import (KINDS, Injected, StepSeen, account, episode_lost, interruptions, schedule,
                      steady_step_seconds, union_seconds)


def run(start: float, first: int, count: int, group: tuple[str, int], world: int = 2, pace: float = 1.0) -> list[StepSeen]:
    return [StepSeen(start + i * pace, first + i, group, world) for i in range(count)]


def test_the_schedule_is_seeded_cycles_every_kind_and_keeps_one_failure_per_window():
    plan = schedule(7, KINDS, 600, 6)
    assert plan == schedule(7, KINDS, 600, 6)
    assert plan != schedule(8, KINDS, 600, 6)
    assert [p.kind for p in plan] == list(KINDS)
    for i, p in enumerate(plan):
        assert 600 * i + 150 <= p.at <= 600 * i + 450
        assert 0 <= p.pick < 1


def test_union_counts_overlaps_once():
    assert union_seconds([(0, 10), (5, 12), (20, 25), (21, 22), (30, 30)]) == 17


def test_a_crash_is_lost_from_its_injection_until_the_log_passes_the_old_high_water_mark():
    # Steps 1..100 at 1 s; killed at t=100.5; a new attempt resumes from a checkpoint at
    # step 90 (first new step 91) at t=110 and passes step 100 at t=120.
    steps = run(1, 1, 100, ("a", 0)) + run(110, 91, 40, ("a", 1))
    crash = Injected("crash", 100.5, "pod of rank 1")
    (cut,) = interruptions(steps, [crash], changes=[99.0, 101.2])
    assert cut.fault is crash and cut.cause == "crash"
    assert cut.detected == 101.2, "a status change before the injection is not its detection"
    assert (cut.resumed_at, cut.resumed_step, cut.high_water) == (110, 91, 100)
    assert cut.caught_up == 120 and cut.lost_steps == 10
    acct = account(0.0, 150.0, steps, [cut])
    assert acct.startup == 1 and acct.lost == pytest.approx(1 + 19.5)
    assert acct.ettr == pytest.approx(1 - 20.5 / 150)


def test_a_rejoin_with_nothing_injected_counts_from_the_old_groups_last_step_and_belongs_to_the_fault_before():
    # Node lost at 50.5: world 1 from t=70 (resumes at step 45); the node comes back and
    # the job re-forms at world 2 at t=200, resuming from step 170 (last logged 174 at t=195).
    steps = run(1, 1, 50, ("a", 0)) + run(70, 45, 130, ("a", 1), world=1) + run(200, 171, 20, ("b", 0))
    node = Injected("node", 50.5, "node-2")
    cuts = interruptions(steps, [node], changes=[61.0])
    assert [c.cause for c in cuts] == ["node", "rejoin"]
    lost, rejoin = cuts
    assert lost.caught_up == 76 and lost.lost_steps == 6
    assert rejoin.start == steps[179].at == 199 and rejoin.high_water == 174 and rejoin.caught_up == 204
    assert lost.rejoins == [rejoin]
    assert episode_lost(lost, 300) == pytest.approx((76 - 50.5) + (204 - 199))


def test_two_faults_before_one_recovery_share_it_and_a_fault_after_the_last_step_never_recovers():
    steps = run(1, 1, 20, ("a", 0)) + run(40, 18, 10, ("b", 0))
    first, second = Injected("frozen", 20.5, "rank 0"), Injected("hang", 25.0, "rank 1")
    cuts = interruptions(steps, [first, second], changes=[])
    assert [c.resumed_at for c in cuts] == [40, 40]
    assert [c.detected for c in cuts] == [None, None]
    assert [c.caught_up for c in cuts] == [43, 43]  # step 21 is the first past both high-water marks (20)
    # No step seen from t=20 to 40: a stall from the last step, before the first fault.
    assert account(0.0, 55.0, steps, cuts).lost == pytest.approx(1 + (43 - 20))
    # Injected after the last step: never recovered; the re-form at 40 is then a rejoin.
    late = Injected("crash", 60.0, "pod of rank 0")
    cuts = interruptions(steps, [late], changes=[])
    assert [c.cause for c in cuts] == ["rejoin", "crash"]
    assert cuts[-1].resumed_at is None and cuts[-1].caught_up is None
    assert account(0.0, 100.0, steps, cuts).lost == pytest.approx(1 + (43 - 20) + (100 - 49))  # stalled from its last step


def test_lost_time_of_a_fault_that_never_recovered_runs_to_the_end():
    steps = run(1, 1, 20, ("a", 0))
    cuts = interruptions(steps, [Injected("crash", 30.0, "x")], changes=[])
    assert account(0.0, 100.0, steps, cuts).lost == pytest.approx(1 + (100 - 20))  # no step since t=20


def test_the_steady_pace_leaves_out_interruptions_and_other_world_sizes():
    steps = run(1, 1, 50, ("a", 0), pace=0.5) + run(40, 40, 50, ("a", 1), world=1, pace=2.0)
    cuts = interruptions(steps, [Injected("crash", 25.6, "x")], changes=[])
    assert steady_step_seconds(steps, cuts, 2) == pytest.approx(0.5)
    assert steady_step_seconds(steps, cuts, 1) == pytest.approx(2.0)


def test_the_steady_pace_is_exact_when_the_log_is_read_slower_than_steps_are_made():
    # Steps every 0.16 s, stamped when the benchmark reads the log every 0.25 s: the single
    # gaps are 0 or 0.25 s (their median is 0.25), their mean is the step's pace.
    steps = [StepSeen(math.ceil(i * 0.16 / 0.25) * 0.25, i, ("a", 0), 2) for i in range(1, 2001)]
    assert steady_step_seconds(steps, [], 2) == pytest.approx(0.16, rel=0.01)


def test_a_rollback_in_the_same_group_is_redone_work_and_a_job_that_stopped_is_lost_until_the_end():
    # Steps 1..50; at t=51 the same group rolls back to step 40 and trains again.
    steps = run(1, 1, 50, ("a", 0)) + run(51, 41, 40, ("a", 0))
    cuts = interruptions(steps, [], changes=[])
    assert [c.cause for c in cuts] == ["rollback"]
    (back,) = cuts
    assert (back.start, back.resumed_at, back.high_water, back.caught_up) == (50, 51, 50, 61)
    # Training stops at t=90 (the job failed); the run ends at 200.
    acct = account(0.0, 200.0, steps, cuts)
    assert acct.lost == pytest.approx(1 + 11 + (200 - 90))
    # A short gap is no stall.
    assert account(0.0, 95.0, steps, cuts).lost == pytest.approx(1 + 11)


def test_a_rollback_after_a_fault_is_not_counted_as_its_rejoin():
    steps = run(1, 1, 50, ("a", 0)) + run(60, 46, 30, ("b", 0)) + run(91, 70, 10, ("b", 0))
    cuts = interruptions(steps, [Injected("crash", 50.5, "x")], changes=[])
    assert [c.cause for c in cuts] == ["crash", "rollback"]
    assert cuts[0].rejoins == []
