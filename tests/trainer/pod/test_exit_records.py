"""Exit records: what ended each failed attempt of a pod, as the trainer reports it to
the operator (which charges causes, never victims)."""

from __future__ import annotations

import time

from llmtrain_trainer.pod import exitrecord
from llmtrain_contract.exitcodes import ExitCode


def run(run_dir, attempt, local_rank, code=None, rank=None):
    """One run of a local rank: it starts, and (unless killed) writes its record."""
    exitrecord.mark_started(run_dir, attempt, local_rank)
    time.sleep(0.002)
    if code is not None:
        exitrecord.write(run_dir, attempt, local_rank if rank is None else rank, local_rank, code, "", 5)


def test_a_rank_killed_by_a_signal_leaves_no_record_and_the_attempt_is_a_crash(tmp_path):
    run(tmp_path, 0, 0)  # SIGKILLed: no record
    run(tmp_path, 0, 1, ExitCode.COLLECTIVE_TIMEOUT)
    assert exitrecord.attempt_cause(tmp_path, 0, local_world_size=2) == "crash"


def test_every_rank_timing_out_on_a_vanished_peer_is_a_victim(tmp_path):
    run(tmp_path, 0, 0, ExitCode.COLLECTIVE_TIMEOUT)
    run(tmp_path, 0, 1, ExitCode.PREEMPTED)  # stopped by the agent once its sibling failed
    assert exitrecord.attempt_cause(tmp_path, 0, local_world_size=2) == "victim"


def test_a_hang_outranks_everything_else(tmp_path):
    run(tmp_path, 3, 0, ExitCode.HANG)
    run(tmp_path, 3, 1, 1)
    assert exitrecord.attempt_cause(tmp_path, 3, local_world_size=2) == "hang"


def test_a_python_error_is_a_crash(tmp_path):
    run(tmp_path, 0, 0, 1)
    assert exitrecord.attempt_cause(tmp_path, 0, local_world_size=1) == "crash"


def test_a_record_left_by_an_earlier_run_under_the_same_restart_count_is_ignored(tmp_path):
    # A membership change restarts the workers without bumping torchrun's count: the
    # earlier run's record (SIGTERMed by the agent) stays in the folder. The later run is
    # SIGKILLed and writes nothing: that is a crash, not a preemption.
    run(tmp_path, 1, 0, ExitCode.PREEMPTED, rank=1)
    run(tmp_path, 1, 0)
    assert exitrecord.read_attempt(tmp_path, 1) == []
    assert exitrecord.attempt_cause(tmp_path, 1, local_world_size=1) == "crash"


def test_failed_attempts_counts_each_earlier_attempt_by_cause(tmp_path):
    run(tmp_path, 0, 0, ExitCode.COLLECTIVE_TIMEOUT)
    run(tmp_path, 1, 0)
    run(tmp_path, 2, 0, ExitCode.HANG)
    run(tmp_path, 3, 0)  # the current, running attempt: not counted
    counts = exitrecord.failed_attempts(tmp_path, restart_count=3, local_world_size=1)
    assert counts == {"crash": 1, "hang": 1, "victim": 1, "preempted": 0, "permanent": 0}


def test_a_rank_out_of_gpu_memory_explains_its_peers_ends_and_a_hang_still_outranks_it(tmp_path):
    run(tmp_path, 0, 0, ExitCode.GPU_OUT_OF_MEMORY)
    run(tmp_path, 0, 1, ExitCode.COLLECTIVE_TIMEOUT)
    run(tmp_path, 0, 2, 1)  # a peer that crashed on its way down
    assert exitrecord.attempt_cause(tmp_path, 0, local_world_size=3) == "gpu_oom"
    run(tmp_path, 1, 0, ExitCode.GPU_OUT_OF_MEMORY)
    run(tmp_path, 1, 1, ExitCode.HANG)
    assert exitrecord.attempt_cause(tmp_path, 1, local_world_size=2) == "hang"
    run(tmp_path, 2, 0)  # the current attempt
    assert exitrecord.failed_attempts(tmp_path, restart_count=1, local_world_size=3)["gpu_oom"] == 1
    # Reported once it happened only: an operator older than the cause refuses counts naming it.
    assert "gpu_oom" not in exitrecord.failed_attempts(tmp_path, restart_count=0, local_world_size=3)
    # Replaced by a membership change under the same restart count, it is still counted.
    run(tmp_path, 2, 0, ExitCode.GPU_OUT_OF_MEMORY)
    run(tmp_path, 2, 0)
    assert exitrecord.superseded_causes(tmp_path) == ["gpu_oom"]


def test_the_launcher_picks_the_most_significant_record(tmp_path):
    run(tmp_path, 0, 0, ExitCode.COLLECTIVE_TIMEOUT, rank=4)
    run(tmp_path, 0, 1, ExitCode.HANG, rank=5)
    best = exitrecord.most_significant(exitrecord.read_attempt(tmp_path, 0))
    assert (best["code"], best["rank"], best["local_rank"]) == (ExitCode.HANG, 5, 1)


def test_a_failed_run_replaced_by_a_membership_change_under_the_same_restart_count_is_still_counted(tmp_path):
    # Rank 0 of this pod froze; its supervisor wrote the HANG record, but the agent was
    # already restarting the group because the peer pod's victim had failed first: the
    # new run has the same restart count (0) and would shadow the record.
    run(tmp_path, 0, 0, ExitCode.HANG)
    run(tmp_path, 0, 0)
    assert exitrecord.read_attempt(tmp_path, 0) == [], "the new run's folder holds no record of its own"
    counts = exitrecord.failed_attempts(tmp_path, restart_count=0, local_world_size=1)
    assert counts == {"crash": 0, "hang": 1, "victim": 0, "preempted": 0, "permanent": 0}
    # Once, however often later runs start; a crash replaced the same way counts too.
    run(tmp_path, 0, 0, 1)
    run(tmp_path, 0, 0)
    run(tmp_path, 0, 0)
    assert exitrecord.failed_attempts(tmp_path, 0, 1) == {"crash": 1, "hang": 1, "victim": 0, "preempted": 0, "permanent": 0}


def test_a_victims_or_a_preempted_run_replaced_the_same_way_is_no_failure_of_this_pod(tmp_path):
    run(tmp_path, 2, 0, ExitCode.COLLECTIVE_TIMEOUT)
    run(tmp_path, 2, 0, ExitCode.PREEMPTED)
    run(tmp_path, 2, 0)
    assert exitrecord.superseded_causes(tmp_path) == []
    assert exitrecord.failed_attempts(tmp_path, 3, 1)["victim"] == 0, "the shadowed victim record counts nowhere"
