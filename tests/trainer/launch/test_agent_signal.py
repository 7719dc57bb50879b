"""The torchrun agent stopped by the pod's SIGTERM (the launcher passes it on): one line,
not torchrun's 40-line SignalException traceback in the job's log, and the exit code the
launcher has always read (1). Seen in a kind walk-through: `kubectl delete pod` of rank 0's
pod printed the traceback into `llmtrain logs`."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from llmtrain_trainer.launch.launcher import AGENT


def test_sigterm_ends_the_agent_with_one_line_and_exit_code_1(tmp_path):
    ready = tmp_path / "ready"
    script = tmp_path / "train.py"
    script.write_text(f"import pathlib, time\npathlib.Path({str(ready)!r}).write_text('x')\ntime.sleep(600)\n")
    agent = subprocess.Popen([sys.executable, str(AGENT), "--standalone", "--nproc-per-node=1", str(script)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and agent.poll() is None:
            time.sleep(0.1)
        assert ready.exists(), agent.stderr.read() if agent.poll() is not None else "the worker never started"
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=120)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 1, err
    assert "torchrun agent: stopped by SIGTERM" in err, err
    assert "Traceback" not in err, err
