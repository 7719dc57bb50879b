"""The README's main command: `llmtrain run` of example 01 with an injected rank crash
and a killed node, recovered from checkpoints both times (as `make demo` runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.specs import ROOT


def test_the_demo_job_recovers_from_a_crash_and_a_node_loss_and_succeeds(tmp_path: Path):
    workdir = tmp_path / "run"
    cmd = [str(Path(sys.executable).with_name("llmtrain")), "run", str(ROOT / "examples" / "01-tiny-elastic-cpu.yaml"),
           "--fresh", "--workdir", str(workdir), "--inject", "crash@step=15,rank=1", "--kill-node", "1@35",
           "--timeout", "600", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=700, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    status = json.loads((workdir / "status.json").read_text())
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    # The rank crash is restarted in place by torchrun; the killed local "node" is a pod
    # that died of SIGKILL (no Node objects here), replaced by the planner. Each is
    # charged once; the survivors' worker groups that failed because their peer vanished
    # are victims, never charged.
    by_reason = status["restartsByReason"]
    assert by_reason == {"RestartedInPlace": 1, "Signal9": 1}, by_reason
    assert sum(by_reason.values()) == status["restarts"]
    reasons = {json.loads(line)["reason"] for line in (workdir / "events.jsonl").read_text().splitlines()}
    assert {"Created", "RestartedInPlace", "InjectedNodeLoss", "PodFailed", "Completed"} <= reasons, reasons
    assert "StoreRestarted" not in reasons, "the rendezvous store must survive a run with no store fault"
    logs = "".join(p.read_text() for p in workdir.glob("tiny-elastic-worker-*.log"))
    assert "resumed from step" in logs
    assert (workdir / "loss.png").stat().st_size > 10_000
