"""Starts ``hack/cluster-tools/build.sh`` at the start of a test session that will need
the Go-built tools, at the lowest CPU priority. On a cold machine that build takes about
12 minutes of both cores; started early it uses what the torchrun suites leave idle
instead of adding to the run. The fixtures that need a tool run build.sh themselves,
which waits on the lock of the tool's group (docs/development.md)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "hack" / "cluster-tools" / "build.sh"
LOG = ROOT / ".cache" / "cluster-tools-prebuild.log"

# With autogroup scheduling (Linux's default for desktop and many VM kernels) the CPU is
# shared between sessions first and nice applies only inside a session: the build gets
# a session of its own and lowers that session's weight, so it yields to every test
# process whatever session they run in.
_LOWER = 'echo 19 > /proc/self/autogroup 2>/dev/null; exec "$@"'


def start() -> subprocess.Popen | None:
    if os.environ.get("LLMTRAIN_PREBUILD_TOOLS", "1") == "0":
        return None
    cmd = ["nice", "-n", "19", "bash", str(BUILD)]
    if shutil.which("ionice"):
        cmd = ["ionice", "-c", "3", *cmd]
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("w") as log:
        return subprocess.Popen(["sh", "-c", _LOWER, "prebuild", *cmd], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen | None) -> None:
    """Ends a build still running when the session ends (its group: go and its compilers)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        return  # it ended on its own meanwhile
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
