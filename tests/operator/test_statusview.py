"""``llmtrain status``: the status as a person reads it (statusview.py), for a job that
trains, one that cannot be placed, one that failed and one that finished; and the
command itself on a local run's workdir."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, UTC
from pathlib import Path

from llmtrain_operator.statusview import render

NOW = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)
JOB = {"metadata": {"name": "gpt", "namespace": "ml"}, "spec": {"faultTolerance": {"maxRestarts": 5}}}


def _cond(type_: str, status: str, reason: str, message: str) -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": "2026-11-28T11:00:00Z"}


def test_a_training_job_says_where_it_is_how_fast_and_that_nothing_is_needed():
    status = {"phase": "Running", "progress": "54/60", "eta": "12s", "worldSize": 2, "workers": "2/2", "loss": 3.21,
              "tokensPerSecond": 4200.0, "restarts": 1, "restartsByReason": {"Signal9": 1},
              "lastFailure": {"kind": "ProcessCrash", "reason": "Signal9", "pod": "gpt-worker-1", "node": "n1",
                              "message": "killed", "time": "2026-11-28T11:58:00Z"},
              "lastCheckpoint": {"summary": "50@local"}, "checkpointTiers": [{"name": "local", "healthy": True, "lastStep": 50}],
              "goodput": 0.9, "ettr": 0.85, "activeSeconds": 600, "keptPods": ["gpt-worker-1"]}
    text = "\n".join(render({**JOB, "status": status}, NOW))
    assert text.startswith("gpt (ml): Running, step 54/60, about 12s left")
    assert "failed pods:  gpt-worker-1 (kept with their logs: llmtrain logs JOB --failed [N])" in text
    assert "loss 3.2100, 4,200 tokens/s" in text and "restarts:     1 of 5 (Signal9 1); disruptions 0\n" in text
    healed = "\n".join(render({**JOB, "status": {**status, "heals": 1}}, NOW))
    assert "restarts:     1 of 5 (Signal9 1); disruptions 0; healed in process 1\n" in healed
    assert "(pod gpt-worker-1, node n1) 2m ago: killed" in text and "newest 50@local; tiers: local ok, step 50" in text
    assert text.endswith("what to do:   nothing: it is training")


def test_a_job_that_cannot_be_placed_or_failed_says_why_and_what_to_do():
    stuck = {"phase": "Created", "conditions": [_cond("Unschedulable", "True", "Unschedulable", "0/4 nodes: Insufficient nvidia.com/gpu")]}
    text = "\n".join(render({**JOB, "status": stuck}, NOW))
    assert "Unschedulable: Unschedulable: 0/4 nodes: Insufficient nvidia.com/gpu" in text
    assert "what to do:   give its pods somewhere to run" in text
    failed = {"phase": "Failed", "lastCheckpoint": {"summary": "120@shared"},
              "conditions": [_cond("Failed", "True", "BackoffLimitExceeded", "6 restarts, over maxRestarts=5")]}
    text = "\n".join(render({**JOB, "status": failed}, NOW))
    assert "it failed (BackoffLimitExceeded: 6 restarts, over maxRestarts=5)" in text and "it resumes from 120@shared" in text
    assert "docs/runbooks.md#llmtrainjobfailed" in text
    fresh = "\n".join(render({**JOB, "status": {"phase": "Failed"}}, NOW))
    assert "no checkpoint was committed: it starts from step 0" in fresh


def test_the_command_reads_a_local_runs_workdir(tmp_path: Path):
    finished = {"phase": "Succeeded", "progress": "60/60", "lastCheckpoint": {"summary": "60@local"}}
    (tmp_path / "status.json").write_text(json.dumps(finished))
    done = subprocess.run([str(Path(sys.executable).with_name("llmtrain")), "status", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"{tmp_path.name}: Succeeded, step 60/60" in done.stdout and "llmtrain checkpoints export" in done.stdout
    (tmp_path / "status.json").write_text("{not json")
    bad = subprocess.run([str(Path(sys.executable).with_name("llmtrain")), "status", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "cannot be read" in bad.stderr and "Traceback" not in bad.stderr
