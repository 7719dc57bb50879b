"""The README's main command: `llmtrain run` of example 01 with an injected rank crash
and a killed node, recovered from checkpoints both times (as `make demo` runs it)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, UTC
from pathlib import Path

import pytest
import yaml
from llmtrain_operator.api import parse_job
from llmtrain_operator.localrun.cluster import LocalCluster
from llmtrain_operator.planner import plan
from support.planning import job
from support.specs import ROOT

pytestmark = pytest.mark.slow  # real multi-process torchrun runs


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
    # The killed node's pod is kept with its log; its slot ran the next pod under a new name.
    assert status["keptPods"] == ["tiny-elastic-worker-1"], status.get("keptPods")
    assert (workdir / "tiny-elastic-worker-1.log").stat().st_size and (workdir / "tiny-elastic-worker-1-1.log").stat().st_size
    logs = "".join(f"----- {p.name}\n{p.read_text()}" for p in sorted(workdir.glob("tiny-elastic-worker-*.log")))
    # On failure, everything needed to tell why: each worker's whole log (a restart that
    # found no committed checkpoint says "starting from step 0") and the Events.
    said = f"logs:\n{logs[-12000:]}\nevents:\n{(workdir / 'events.jsonl').read_text()[-4000:]}"
    assert "resumed from step" in logs, said
    assert (workdir / "loss.png").stat().st_size > 10_000


def test_a_frozen_node_is_replaced_on_its_peers_report_and_charged_as_a_hang(tmp_path: Path):
    """Every process of node 1 stopped (launcher, torchrun, rank): nothing there reports.
    Its peer's supervisor judges its own rank a victim after hangTimeoutSeconds; the run
    replaces the silent node on that report (policies/frozen_pods.py, as the operator
    does), charged as a hang on it, and the job succeeds."""
    spec = yaml.safe_load((ROOT / "examples" / "01-tiny-elastic-cpu.yaml").read_text())
    spec["spec"]["faultTolerance"]["hangTimeoutSeconds"] = 10
    spec["spec"]["replicas"] = {"min": 2, "max": 2}  # the survivor waits for its peer: no re-forming alone
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    workdir = tmp_path / "run"
    cmd = [str(Path(sys.executable).with_name("llmtrain")), "run", str(path), "--fresh", "--workdir", str(workdir),
           "--inject", "slow@step=1,seconds=0.3,steps=1000", "--freeze-node", "1@12", "--timeout", "600", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=700, cwd=ROOT)
    events = [json.loads(line) for line in (workdir / "events.jsonl").read_text().splitlines()]
    said = out.stdout[-3000:] + out.stderr[-3000:] + json.dumps(events)[-3000:]
    assert out.returncode == 0, said
    status = json.loads((workdir / "status.json").read_text())
    assert status["phase"] == "Succeeded", said
    assert status["restartsByReason"] == {"Hang": 1}, said
    frozen = next(e for e in events if e["reason"] == "InjectedNodeFreeze")
    replaced = next(e for e in events if e["reason"] == "PodUnresponsive")
    assert "tiny-elastic-worker-1" in replaced["message"] and "blocked waiting for a peer" in replaced["message"], replaced
    # A sanity bound only: the peer's report after the 10 s timeout, not a progress timeout (120 s).
    assert replaced["time"] - frozen["time"] < 10 + 20, (frozen, replaced)



def test_ctrl_c_stops_the_run_and_still_writes_its_events_plot_and_summary(tmp_path: Path):
    """Interrupted as a user at a terminal would: every process stops, and what the run
    produced so far (events.jsonl, loss.png, the summary) is written before it exits; with
    no terminal, a progress line comes every 10 s between the Events."""
    workdir = tmp_path / "run"
    # 1 s a step: 60 steps outlast the wait below for a progress line while Running (they
    # come every 10 s, so up to 10 s after the Running Event plus start-up).
    cmd = [str(Path(sys.executable).with_name("llmtrain")), "run", str(ROOT / "examples" / "01-tiny-elastic-cpu.yaml"),
           "--fresh", "--workdir", str(workdir), "--inject", "slow@step=1,seconds=1,steps=1000", "--no-progress"]
    running_line = re.compile(r"^\d\d:\d\d:\d\d step \d+/60 Running world=", re.M)
    # The output goes to files, read while the run goes on: the interrupt waits for what
    # the test asserts it printed, not for a guessed time.
    stdout_path, stderr_path = tmp_path / "stdout", tmp_path / "stderr"
    with stdout_path.open("w") as stdout, stderr_path.open("w") as stderr:
        # Started with SIGINT ignored, as a shell starts a background job (and as this suite
        # may itself run): the command must still answer Ctrl-C.
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, cwd=ROOT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        def step() -> int:
            try:
                return json.loads((workdir / "status.json").read_text()).get("step", 0)
            except (OSError, ValueError):
                return 0

        deadline = time.monotonic() + 180
        while step() < 5 or not running_line.search(stdout_path.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, \
                "the run ended or stalled before step 5 and a progress line while Running: " + stdout_path.read_text()[-3000:]
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = stdout_path.read_text(), stderr_path.read_text()
    assert proc.returncode == 130, out[-3000:] + err[-3000:]
    assert "interrupted at step" in err and "processes stopped, checkpoints kept" in err, err[-3000:]
    reasons = [json.loads(line)["reason"] for line in (workdir / "events.jsonl").read_text().splitlines()]
    assert "Created" in reasons and "Running" in reasons, reasons
    assert (workdir / "loss.png").stat().st_size > 10_000
    assert "restarts:" in out and "plot:" in out, out[-3000:]
    left = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes of the run still alive: {left.stdout}"


def test_the_local_runner_reads_each_nodes_failed_attempts_from_its_launcher(tmp_path: Path):
    """As the operator does in a cluster: the launcher of every local "node" serves its
    failed attempts on loopback and each observation reads them, so an in-place restart
    is charged before the restarted trainer is up; and a script's reported progress."""
    script = tmp_path / "idle.py"
    script.write_text("import os, time\nopen(os.environ['LLMTRAIN_PROGRESS_FILE'], 'w').write('5\\n')\ntime.sleep(120)\n")
    raw = job({"spec.replicas": {"min": 1, "max": 1}, "spec.trainer": {"command": [str(script)]},
               "spec.checkpoint": {"enabled": False}})
    cluster = LocalCluster(parse_job({**raw, "status": None}), tmp_path / "run")
    try:
        status = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            observed = cluster.observe()
            probe = observed.probes.get("tiny-elastic-worker-0")
            if observed.launcher_attempts and probe is not None and probe.step == 5:
                break
            result = plan({**raw, "status": status}, observed, datetime.now(UTC))
            status = result.status
            cluster.apply(result.actions)
            time.sleep(0.5)
        assert observed.launcher_attempts, "no launcher answered on its health port"
        (pod, counted), = observed.launcher_attempts.items()
        assert pod == "tiny-elastic-worker-0" and isinstance(counted, dict) and sum(counted.values()) == 0, counted
        port = cluster.pods[pod].health_port
        assert port and f"--health-port {port} --health-host 127.0.0.1" in " ".join(cluster.pods[pod].proc.args)
        # A script's progress and readiness come through its launcher, as in a pod.
        assert observed.probes[pod].step == 5, "the step the script wrote to LLMTRAIN_PROGRESS_FILE"
        assert next(p for p in observed.pods if p.name == pod).ready, "ready while its workers run"
    finally:
        cluster.shutdown()


def test_a_builtin_job_with_checkpoints_off_trains_to_success_and_restarts_from_step_0(tmp_path: Path):
    """``checkpoint.enabled: false``: the trainer runs with the stand-in that saves
    nothing. Every step, the final save and a restart after a crash go through it: the
    crashed group starts again from step 0 (nothing was saved), and the job succeeds."""
    spec = yaml.safe_load((ROOT / "examples" / "01-tiny-elastic-cpu.yaml").read_text())
    spec["metadata"]["name"] = "no-ckpt"
    spec["spec"]["checkpoint"] = {"enabled": False}
    spec["spec"]["trainer"]["builtin"]["maxSteps"] = 14
    spec["spec"]["trainer"]["builtin"]["data"]["seqLen"] = 32
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    workdir = tmp_path / "run"
    cmd = [str(Path(sys.executable).with_name("llmtrain")), "run", str(path), "--fresh", "--workdir", str(workdir),
           "--inject", "crash@step=6,rank=1", "--timeout", "400", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=500, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    status = json.loads((workdir / "status.json").read_text())
    assert status["phase"] == "Succeeded" and status["step"] == 14, json.dumps(status)[:2000]
    assert status["restartsByReason"] == {"RestartedInPlace": 1}, status["restartsByReason"]
    logs = "".join(p.read_text() for p in workdir.glob("no-ckpt-worker-*.log"))
    assert "Traceback" not in logs, logs[-4000:]
    assert "resumed from step" not in logs, "nothing was saved, so nothing can be resumed"
    records = sorted((json.loads(line) for p in workdir.glob("**/steps.jsonl") for line in p.read_text().splitlines()),
                     key=lambda r: r["time"])
    steps = [r["step"] for r in records]
    # The crashed group starts again at step 1 and trains to the end. (A group may also
    # have started over once more before the crash: node 1 joining after node 0 trained
    # alone for a step re-forms it, and with nothing saved that starts at step 1 too.)
    last_start = len(steps) - 1 - steps[::-1].index(1)
    assert steps.count(1) >= 2 and steps[last_start:] == list(range(1, 15)), f"the restarted group trains from step 1 again: {steps}"
    assert 6 not in steps[:last_start], f"the crash at step 6 came before that step finished: {steps}"
    assert not any(workdir.glob("**/step-0*")), "no checkpoint folder is ever written"
