"""The launcher in a real memory cgroup with a limit (as a container's): a process of its
pod that the kernel's OOM killer ends is counted on its ``/metrics`` with the peak and the
limit, and a pod that ends with such a death says ``OOMKilled`` in its termination message.
The machine's cgroup v1 memory controller (CI runs as root on the same VM type)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.elastic import free_port

from llmtrain_trainer.pod import memcg

LIMIT = 256 << 20
GROW = "h = []\nwhile True:\n    h.append(b'\\x01' * (32 << 20))\n"


@pytest.fixture
def cgroup():
    own = memcg.own()
    assert own is not None and own.version == 1, f"these tests need cgroup v1's memory controller, found {own}"
    group = Path("/sys/fs/cgroup/memory") / f"llmtrain-test-launcher-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(LIMIT))
    yield group
    for _ in range(50):  # its processes may take a moment to be reaped
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def _launcher(group: Path, tmp_path: Path, command: list[str], port: int = 0) -> subprocess.Popen:
    """The launcher as a container's first process: in the cgroup before it starts."""
    launcher = [sys.executable, "-m", "llmtrain_trainer.launch.launcher", "--run-dir", str(tmp_path / "run"),
                "--termination-log", str(tmp_path / "termination-log"), "--health-port", str(port), "--health-host", "127.0.0.1",
                "--", *command]
    return subprocess.Popen(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *launcher],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_pod_whose_process_the_oom_killer_ended_says_oom_killed_with_the_peak_and_the_limit(cgroup, tmp_path):
    proc = _launcher(cgroup, tmp_path, [sys.executable, "-c", GROW])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 137, err
    message = json.loads((tmp_path / "termination-log").read_text())
    assert message["reason"] == "OOMKilled" and message["oom"]["kills"] == 1, message
    assert message["oom"]["limitBytes"] == LIMIT and 200 << 20 <= message["oom"]["peakBytes"] <= LIMIT, message
    assert "of its limit 0.2 GiB" in message["message"] and "resources.limits.memory" in message["message"], message
    assert message["memory"] == {"oomKills": 1, "peakBytes": message["oom"]["peakBytes"], "limitBytes": LIMIT}


def test_a_kill_inside_a_pod_that_goes_on_is_counted_on_the_launchers_page(cgroup, tmp_path):
    # The "agent" starts one process that grows until killed, then lives on (as torchrun
    # restarts its group in place) until the test has read the page.
    agent = ("import subprocess, sys, time\n"
             f"subprocess.run([sys.executable, '-c', {GROW!r}])\n"
             "time.sleep(60)\n")
    port = free_port()
    proc = _launcher(cgroup, tmp_path, [sys.executable, "-c", agent], port)
    try:
        deadline, values = time.monotonic() + 60, {}
        while values.get("llmtrain_launcher_oom_kills_total") != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    page = resp.read().decode()
            except OSError:
                continue
            values = {s.name: s.value for family in text_string_to_metric_families(page) for s in family.samples}
        assert values.get("llmtrain_launcher_oom_kills_total") == 1, values
        assert values["llmtrain_launcher_memory_limit_bytes"] == LIMIT
        assert 200 << 20 <= values["llmtrain_launcher_memory_peak_bytes"] <= LIMIT, values
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
