"""The mark a prefetch leaves in tier 1 while it pulls a step there (the launcher's
``prefetch.py``), and the wait of a rank's own pull of that step (``pull.py``): the two
never write one step at once."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from . import manifest as mf
from .directory import DirTier

MARK = ".prefetch"


def marker(local: DirTier) -> Path:
    """``.prefetch`` in tier 1, holding the prefetching process's pid and start time: written before the
    pod's ranks start (so that none looks before it is there) and removed when the
    prefetch ends, whichever step it pulled, or none."""
    return local.root / MARK


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat's 22nd
    field); "" where /proc cannot tell. With the pid it names one process: a container's
    launcher is often pid 1, and a mark left by an earlier container's must not pass for
    the running one's."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def mark(local: DirTier) -> Path:
    path = marker(local)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()} {_started(os.getpid())}")
    return path


def _alive(path: Path) -> bool:
    try:
        pid_text, _, started = path.read_text().partition(" ")
        pid = int(pid_text)
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return started.strip() == _started(pid)


def wait_for(local: DirTier, step: int, timeout: float, heartbeat: Callable[[], None] = lambda: None) -> bool:
    """Before a rank's pull of ``step``: wait (at most ``timeout``) while a live process
    prefetches; whether tier 1 holds ``step`` committed now (the prefetch may have pulled
    another step, or none)."""
    path = marker(local)
    deadline = time.monotonic() + timeout
    while path.exists() and _alive(path) and time.monotonic() < deadline:
        heartbeat()
        time.sleep(0.05)
    return (local.final(step) / mf.COMMITTED).exists()
