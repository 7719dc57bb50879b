"""The trainer's log: its milestones at INFO shown by default, libraries' INFO never,
``LLMTRAIN_LOG_LEVEL`` raising the bar for the trainer's own, and a bad value a warning,
not a crash."""

from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = """
import logging
from llmtrain_trainer.train.main import _configure_logging
_configure_logging()
logging.getLogger("llmtrain.trainer").info("resumed from step 7")
logging.getLogger("llmtrain.checkpoint").warning("a tier failed")
logging.getLogger("torch.distributed.elastic").info("library chatter")
logging.getLogger("torch.distributed.elastic").warning("library warning")
"""


def _run(level: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "LLMTRAIN_LOG_LEVEL"}
    if level is not None:
        env["LLMTRAIN_LOG_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_milestones_show_by_default_and_libraries_info_never():
    out = _run(None)
    assert "INFO: resumed from step 7" in out and "WARNING: a tier failed" in out
    assert "library warning" in out and "library chatter" not in out


def test_a_higher_level_hides_milestones_and_a_bad_one_falls_back_to_info_with_a_warning():
    out = _run("warning")
    assert "resumed from step 7" not in out and "a tier failed" in out
    out = _run("verbose")
    assert "LLMTRAIN_LOG_LEVEL='VERBOSE' is not a log level" in out and "resumed from step 7" in out
