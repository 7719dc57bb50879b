"""The contract for a user's own script (docs/custom-scripts.md), below the cluster: the
script runner's exit records, progress through ``LLMTRAIN_PROGRESS_FILE`` as the operator
reads it from the launcher, and the bundle that runs the launcher from an image without
this project. Real processes throughout; the end-to-end run is tests/e2e/test_scripts.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmtrain_contract.command import script_program
from llmtrain_contract.names import Env
from llmtrain_trainer.launch import bundle
from llmtrain_trainer.pod import exitrecord
from llmtrain_trainer.pod import progress
from llmtrain_trainer.launch.launcher import decide

def _run(tmp_path: Path, body: str, *argv: str, env: dict[str, str] | None = None, runner: list[str] | None = None,
         python: list[str] | None = None) -> subprocess.CompletedProcess:
    """One rank, as torchrun would start it: ``python -m llmtrain_trainer.train.script <script>``."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    run_dir = tmp_path / "run"
    environment = {**os.environ, Env.RUN_DIR: str(run_dir), "RANK": "3", "LOCAL_RANK": "1",
                   "TORCHELASTIC_RESTART_COUNT": "2", **(env or {})}
    command = [*(python or [sys.executable]), *(runner or ["-m", "llmtrain_trainer.train.script"]), str(script), *argv]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_an_uncaught_exception_is_recorded_with_its_type_text_and_line_and_exits_1(tmp_path):
    done = _run(tmp_path, """
        def step(n):
            raise ValueError(f"shape mismatch at step {n}")
        step(7)
    """)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "ValueError: shape mismatch at step 7" in done.stderr, "the traceback still prints"
    [record] = exitrecord.read_attempt(tmp_path / "run", 2)
    assert record["rank"] == 3 and record["local_rank"] == 1 and record["code"] == 1
    assert record["message"] == f"ValueError: shape mismatch at step 7 (at {tmp_path / 'train.py'}:3 in step)"
    code, message = decide(1, [record])
    assert code == 1 and message["reason"] == "Crash" and "shape mismatch" in message["message"] and message["rank"] == 3


def test_an_exit_code_from_the_table_keeps_its_meaning(tmp_path):
    done = _run(tmp_path, "import sys\nsys.exit(64)\n")
    assert done.returncode == 64
    code, message = decide(1, exitrecord.read_attempt(tmp_path / "run", 2))  # torchrun itself exits 1
    assert code == 64 and message["reason"] == "ConfigError", "a permanent error, as for the built-in trainer"


@pytest.mark.parametrize("value, code", [("None", 0), ("'a message'", 1), ("300", 300 & 0xFF)])
def test_sys_exit_means_what_it_means_to_python(tmp_path, value, code):
    done = _run(tmp_path, f"import sys\nsys.exit({value})\n")
    assert done.returncode == code
    [record] = exitrecord.read_attempt(tmp_path / "run", 2)
    assert record["code"] == code
    if value == "'a message'":
        assert "a message" in done.stderr and record["message"] == "a message"


def test_the_script_sees_what_python_would_give_it(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 'beside the script'\n")
    done = _run(tmp_path, """
        import json, os, sys
        import helper
        print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0], "helper": helper.VALUE,
                          "progress": os.environ["LLMTRAIN_PROGRESS_FILE"]}))
    """, "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["name"] == "__main__" and seen["argv"] == [str(tmp_path / "train.py"), "--lr", "0.1"]
    assert seen["path0"] == str(tmp_path) and seen["helper"] == "beside the script"
    assert seen["progress"] == str(progress.rank_file(tmp_path / "run", 1)), "each local rank has its own file"
    [record] = exitrecord.read_attempt(tmp_path / "run", 2)
    assert record["code"] == 0


def test_a_module_runs_as_python_dash_m_would_run_it(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nraise SystemExit(65)\n")
    done = subprocess.run([sys.executable, "-m", "llmtrain_trainer.train.script", "-m", "mypkg.train", "x"], cwd=tmp_path,
                          env={**os.environ, Env.RUN_DIR: str(tmp_path / "run")}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 65 and done.stdout.strip() == "__main__ ['x']", done.stderr
    assert exitrecord.read_attempt(tmp_path / "run", 0)[0]["code"] == 65


def test_the_runner_goes_in_front_of_python_scripts_only():
    assert script_program(["/app/train.py"], ["--lr", "1"]) == ["-m", "llmtrain_trainer.train.script", "/app/train.py", "--lr", "1"]
    assert script_program(["-m", "pkg.train"]) == ["-m", "llmtrain_trainer.train.script", "-m", "pkg.train"]
    assert script_program(["--no-python", "bash", "run.sh"]) == ["--no-python", "bash", "run.sh"], "not Python: as it is"
    assert script_program(["/app/train.py"], runner=("/opt/llmtrain/script.py",))[0] == "/opt/llmtrain/script.py"


def test_progress_is_the_largest_step_and_a_torn_write_is_skipped(tmp_path):
    assert progress.read(tmp_path) is None, "no folder: no progress"
    progress.folder(tmp_path).mkdir()
    progress.rank_file(tmp_path, 0).write_text("12\n")
    progress.rank_file(tmp_path, 1).write_text("")  # caught mid-write
    progress.pod_file(tmp_path).write_text("1\n2\n9\n")  # appending a line a step works too
    os.utime(progress.rank_file(tmp_path, 0), (1000, 1000))
    os.utime(progress.pod_file(tmp_path), (2000, 2000))
    seen = progress.read(tmp_path)
    assert seen.step == 12 and seen.updated == 2000
    progress.rank_file(tmp_path, 0).write_text("1e3")
    assert progress.read(tmp_path).step == 9, "not a whole number: ignored, never raised"


def test_the_launcher_serves_a_scripts_progress_and_readiness_as_the_operator_reads_them(tmp_path):
    import urllib.error
    import urllib.request

    from llmtrain_operator.api.observed import TrainerProbe
    from llmtrain_operator.probe import combine, scrape_launcher
    from llmtrain_trainer.launch.attempts import AttemptTracker
    from llmtrain_trainer.launch.supervisor import Supervisor, serve_health

    # A stand-in torchrun agent with one live worker (torchrun's env names), then none.
    agent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, os; "
                              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
                              "env={**os.environ, 'TORCHELASTIC_RESTART_COUNT': '0', 'LOCAL_WORLD_SIZE': '1'}); "
                              "sys.stdin.read(); p.kill()"], stdin=subprocess.PIPE)
    tracker = AttemptTracker(tmp_path, agent_pid=agent.pid)
    server = serve_health(0, Supervisor(tmp_path), tracker, host="127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        import time
        deadline = time.monotonic() + 30
        while not tracker.workers_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as resp:
            assert resp.status == 200
        report = scrape_launcher(f"{url}/metrics")
        assert report.workers_running and report.step is None
        probes, attempts, _ = combine({}, {"pod-0": report})
        assert probes == {} and attempts == {"pod-0": report.failed}, "no step reported: no progress invented"

        progress.folder(tmp_path).mkdir()
        progress.rank_file(tmp_path, 0).write_text("41")
        report = scrape_launcher(f"{url}/metrics")
        assert report.step == 41 and abs(report.last_step_time - progress.rank_file(tmp_path, 0).stat().st_mtime) < 1e-3
        probes, _, _ = combine({}, {"pod-0": report})
        assert probes["pod-0"].step == 41
        trainer = TrainerProbe(step=50)
        assert combine({"pod-0": trainer}, {"pod-0": report})[0]["pod-0"].step == 50, "a trainer's own endpoint wins"

        agent.stdin.close()
        agent.wait(timeout=30)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/readyz", timeout=5)
        assert err.value.code == 503, "no workers: not ready"
    finally:
        server.shutdown()
        agent.kill()


def test_the_bundle_runs_the_launcher_and_the_runner_with_no_project_installed(tmp_path):
    """``python -S``: no site-packages at all, so neither this project nor its
    dependencies can come from anywhere but the bundle; and the script, run by the
    bundled runner, does not have the bundle on its path (a user's own prometheus_client
    must win)."""
    dest = tmp_path / "opt"
    written = bundle.write(dest)
    assert sorted(p.name for p in written) == ["launcher.py", "rdzv_store.py", "script.py"]
    assert not list(dest.rglob("__pycache__")) and not (dest / "lib" / "llmtrain_trainer" / "engines" / "shards").exists()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import importlib.util, sys
        assert not [p for p in sys.path if p.endswith("lib")], f"the bundle's lib is on the script's path: {sys.path}"
        assert importlib.util.find_spec("prometheus_client") is None, "the launcher's dependency leaked to the script"
        raise RuntimeError("the script's own failure")
    """))
    term = tmp_path / "termination-log"
    bare = [sys.executable, "-S"]
    done = subprocess.run([*bare, str(dest / "launcher.py"), "--run-dir", str(tmp_path / "run"), "--termination-log", str(term),
                           "--", *bare, str(dest / "script.py"), str(script)],
                          env={"PATH": os.environ["PATH"], Env.RUN_DIR: str(tmp_path / "run")},
                          capture_output=True, text=True, timeout=60)
    message = json.loads(term.read_text())
    assert done.returncode == 1, done.stderr
    assert message["reason"] == "Crash" and message["message"].startswith("RuntimeError: the script's own failure"), (message, done.stderr)


def test_the_bundle_names_a_missing_package(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle, "PACKAGES", ("llmtrain_trainer", "no_such_package_here"))
    with pytest.raises(SystemExit, match="no_such_package_here is not installed"):
        bundle.write(tmp_path)



def test_a_permanent_exit_ends_torchrun_instead_of_an_endless_in_place_restart(tmp_path):
    """torchrun's own budget is practically unlimited (the operator keeps the job's): a
    rank exiting 65 would be restarted forever. The patched agent stops the group (the
    supervisor's kill is the backstop; whichever ends torchrun first), no second attempt
    starts, and the pod exits 65 with the rank's record (a real torchrun, two ranks, the
    script runner). The backstop alone: test_supervisor."""
    import time

    from llmtrain_contract.command import worker_command

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(65)  # the table's DataError
        time.sleep(120)  # rank 0 would wait for its peer
    """))
    term = tmp_path / "termination-log"
    torchrun = ["--standalone", "--nproc-per-node=2", "--max-restarts=1000", "--monitor-interval=0.5"]
    command = worker_command(sys.executable, str(tmp_path / "run"), torchrun, script_program([str(script)]), str(term))
    began = time.monotonic()
    done = subprocess.run(command, env={**os.environ, Env.RUN_DIR: str(tmp_path / "run")}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 65, done.stderr[-3000:]
    assert time.monotonic() - began < 60, "ended at once, not after attempts piled up"
    message = json.loads(term.read_text())
    assert message["reason"] == "DataError" and message["rank"] == 1 and "exited with code 65" in message["message"]
    run = tmp_path / "run"
    assert exitrecord.latest_attempt(run) == 0 and not list((run / "exit").glob("attempt-1*")), "no attempt after a permanent exit"
    assert [(r["rank"], r["code"]) for r in exitrecord.read_attempt(run, 0)] == [(1, 65)]


def test_a_rank_whose_collective_broke_because_a_peer_died_is_a_victim(tmp_path):
    """Rank 1 dies; rank 0's all_reduce fails with gloo's "Connection closed by peer".
    Rank 0 is recorded as a victim (83), so the attempt's cause in rank 0's pod is a
    victim's, charged nowhere, while rank 1's pod has the crash (a real torchrun)."""
    from llmtrain_contract.command import worker_command
    from llmtrain_trainer.pod.exitrecord import attempt_cause

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import datetime, os, signal, time
        import torch, torch.distributed as dist
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
        if dist.get_rank() == 1:
            time.sleep(1)
            os._exit(9)  # dies without a word, as a SIGKILLed rank does
        # torchrun's monitor, on its own 5 s tick, SIGTERMs the survivor once it sees rank 1
        # gone; a tick landing before gloo reports the closed connection would end rank 0
        # before its record. Its SIGTERM is not what this test is about.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        dist.all_reduce(torch.ones(1))
        dist.all_reduce(torch.ones(1))
    """))
    # In a real job the survivor's pod learns of the loss only through the rendezvous.
    torchrun = ["--standalone", "--nproc-per-node=2", "--max-restarts=0", "--monitor-interval=5"]
    command = worker_command(sys.executable, str(tmp_path / "run"), torchrun, script_program([str(script)]), str(tmp_path / "term"))
    subprocess.run(command, env={**os.environ, Env.RUN_DIR: str(tmp_path / "run")}, capture_output=True, text=True, timeout=120)
    records = {r["rank"]: r for r in exitrecord.read_attempt(tmp_path / "run", 0)}
    assert records[0]["code"] == 83 and records[0]["message"].startswith("victim: a peer failed"), records
    assert 1 not in records, "rank 1 died without a record"
    assert attempt_cause(tmp_path / "run", 0, 2) == "crash", "in the crashed rank's pod it is a crash"
    assert attempt_cause(tmp_path / "run", 0, 1) == "victim", "a pod holding only the survivor: a victim, never charged"


def test_a_script_out_of_gpu_memory_exits_88_named_with_where_it_was_raised(tmp_path):
    """torch's own error, re-raised by a wrapper as engines do: found in the chain."""
    done = _run(tmp_path, """
        import torch
        def step():
            try:
                raise torch.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 79 GiB\\nmore advice")
            except torch.OutOfMemoryError as err:
                raise RuntimeError("the engine's step failed") from err
        step()
    """)
    assert done.returncode == 88, done.stderr
    [record] = exitrecord.read_attempt(tmp_path / "run", 2)
    assert record["code"] == 88 and record["rank"] == 3
    assert record["message"] == (
        "rank 3 ran out of GPU memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
        "capacity of 79 GiB; no CUDA figures (the rank's CUDA allocator is not initialised); lower the micro-batch or the "
        "sequence length, recompute activations (activation checkpointing), or shard the optimizer state and weights (ZeRO, "
        f"FSDP) (at {tmp_path / 'train.py'}:8 in step)")
    code, message = decide(1, [record])
    assert code == 88 and message["reason"] == "GPUOutOfMemory", message
