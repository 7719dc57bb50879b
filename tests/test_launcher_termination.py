"""The launcher's termination message: the pod's exit code and reason from the ranks' exit
records, and the newest committed step per tier (the final checkpoint is committed after
the last metrics scrape the operator could see)."""

from __future__ import annotations

from llmtrain_trainer import exitrecord
from llmtrain_trainer.launcher import decide


def test_a_success_reports_the_newest_commit_per_tier_over_the_local_ranks(tmp_path):
    exitrecord.write(tmp_path, 0, 0, 0, 0, "success", 40, {"local": 40, "s3": 40, "shared": 30})
    exitrecord.write(tmp_path, 0, 1, 1, 0, "success", 40, {"local": 30})
    exitrecord.write(tmp_path, 0, 2, 2, 0, "success", 40)
    code, message = decide(0, exitrecord.read_attempt(tmp_path, 0))
    assert code == 0
    assert message == {"code": 0, "reason": "Completed", "checkpoints": {"local": 40, "s3": 40, "shared": 30}}


def test_a_failure_keeps_its_cause_and_reports_the_commits_too(tmp_path):
    exitrecord.write(tmp_path, 1, 3, 0, 80, "no step progress for 31.0s", 17, {"local": 10})
    code, message = decide(1, exitrecord.read_attempt(tmp_path, 1))
    assert code == 80 and message["rank"] == 3 and message["step"] == 17
    assert message["checkpoints"] == {"local": 10}


def test_without_records_nothing_is_invented():
    assert decide(0, []) == (0, {"code": 0, "reason": "Completed"})
    code, message = decide(-9, [])
    assert code == 137 and "checkpoints" not in message
