"""The test-only fault injector: parsing, once-per-job markers, and pacing."""

from __future__ import annotations

import time

import pytest
from llmtrain_trainer.train.faults import FaultInjector, parse


def test_unknown_kinds_and_missing_steps_are_named():
    with pytest.raises(ValueError, match="unknown fault kind 'explode'"):
        parse("explode@step=3")
    with pytest.raises(ValueError, match="needs step=N or trigger=NAME"):
        parse("crash@rank=1")


def test_faults_are_kept_only_for_their_rank_and_attempt(tmp_path):
    faults = parse("crash@step=5,rank=1; exit@step=6,attempt=2,code=64; slow@step=7")
    assert [f.kind for f in FaultInjector(faults, rank=0, attempt=0, state_dir=tmp_path).faults] == ["slow"]
    assert [f.kind for f in FaultInjector(faults, rank=1, attempt=2, state_dir=tmp_path).faults] == ["crash", "exit", "slow"]


def test_a_fault_fires_once_per_job_even_when_its_step_is_replayed(tmp_path):
    fired = []
    injector = FaultInjector(parse("slow@step=3,seconds=0"), rank=0, attempt=0, state_dir=tmp_path)
    injector._fire = fired.append  # observe instead of sleeping
    for step in (2, 3, 3, 4):
        injector.at_step(step)
    assert len(fired) == 1
    again = FaultInjector(parse("slow@step=3,seconds=0"), rank=0, attempt=1, state_dir=tmp_path)  # torchrun restart
    again._fire = fired.append
    again.at_step(3)
    assert len(fired) == 1 and (tmp_path / "fault-0-rank-0.fired").exists()


def test_pacing_slows_every_step_in_its_range_each_time(tmp_path):
    injector = FaultInjector(parse("slow@step=10,seconds=0.05,steps=3"), rank=1, attempt=0, state_dir=tmp_path)
    timed = {}
    for step in (9, 10, 11, 12, 13, 11):
        began = time.perf_counter()
        injector.at_step(step)
        timed.setdefault(step, []).append(time.perf_counter() - began)
    assert max(timed[9] + timed[13]) < 0.04
    assert min(timed[10] + timed[11] + timed[12]) >= 0.05 and len(timed[11]) == 2
    assert not list(tmp_path.glob("*.fired"))



def test_pacing_ends_once_its_release_file_appears(tmp_path):
    injector = FaultInjector(parse("slow@step=1,seconds=0.05,steps=1000,until=release"), rank=0, attempt=0,
                             state_dir=tmp_path / "state", run_dir=tmp_path)
    began = time.perf_counter()
    injector.at_step(1)
    assert time.perf_counter() - began >= 0.05, "paced before the release"
    (tmp_path / "release").write_text("")
    began = time.perf_counter()
    for step in range(2, 12):
        injector.at_step(step)
    assert time.perf_counter() - began < 0.05, "ten steps, none paced after the release"

def test_a_pause_ends_early_once_its_file_appears(tmp_path):
    import threading

    injector = FaultInjector(parse("slow@step=2,seconds=30,until=go"), rank=0, attempt=0, state_dir=tmp_path / "state",
                             run_dir=tmp_path)
    threading.Timer(0.3, lambda: (tmp_path / "go").write_text("")).start()
    began = time.perf_counter()
    injector.at_step(2)
    assert 0.3 <= time.perf_counter() - began < 5, "paused until the file, not the 30 s"


def test_a_triggered_fault_fires_at_the_first_step_after_its_file_appears(tmp_path):
    fired = []
    injector = FaultInjector(parse("gil@trigger=go,rank=1,step=3"), rank=1, attempt=0, state_dir=tmp_path / "state", run_dir=tmp_path)
    injector._fire = lambda fault: fired.append(fault.kind)
    injector.at_step(1)
    (tmp_path / "go").write_text("")
    injector.at_step(2)
    assert fired == [], "not before its step"
    injector.at_step(3)
    injector.at_step(4)
    assert fired == ["gil"], "once, at the first step after the trigger"


def test_an_at_agree_fault_fires_before_the_agreement_not_at_the_step_start(tmp_path):
    with pytest.raises(ValueError, match="at must be step or agree"):
        parse("stop@step=3,at=backward")
    injector = FaultInjector(parse("slow@step=2,seconds=0.3,at=agree"), rank=0, attempt=0, state_dir=tmp_path)
    began = time.monotonic()
    injector.at_step(2)
    assert time.monotonic() - began < 0.2, "fired at the step's start"
    injector.before_agree(1)
    assert time.monotonic() - began < 0.2, "fired at another step"
    injector.before_agree(2)
    assert time.monotonic() - began >= 0.3
    assert (tmp_path / "fault-0-rank-0.fired").exists()
