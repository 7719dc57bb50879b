"""Stale locks of torch's JIT op builds (DeepSpeed's ops are built at first use).

torch holds ``<build root>/[<python>_<cuda>/]<op>/lock`` while it builds an op, and every
later load of that op, built or not, waits for the lock to go, with no timeout. A build
killed midway (a run SIGKILLed during its first DeepSpeed start) leaves the lock behind,
and every DeepSpeed start on that cache then hangs in start-up, silently. Before DeepSpeed
loads its ops, a lock that is older than any build and that no running build uses (no
process works in its folder, as ninja and the compilers do) is removed, with a warning.
A pod's ``/tmp`` build root is new with each pod; a home cache (``llmtrain run``) is not.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger("llmtrain.deepspeed")

STALE_SECONDS = 600.0
"""A lock older than this, in a folder where no process works, is a killed build's."""


def build_root() -> Path:
    """Where torch builds JIT ops: ``TORCH_EXTENSIONS_DIR``, else its default (as torch's
    own ``_get_build_directory`` decides)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    from torch.utils.cpp_extension import get_default_build_root  # noqa: PLC0415 - torch only without TORCH_EXTENSIONS_DIR

    return Path(get_default_build_root())


def _working_dirs() -> set[Path]:
    """The working directories of this machine's (this PID namespace's) processes."""
    out = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.add(Path(os.readlink(proc / "cwd")))
            except OSError:
                continue  # gone, or not ours to read
    return out


def clear_stale(root: Path, stale_seconds: float = STALE_SECONDS, now: float | None = None) -> list[Path]:
    """Remove the stale build locks under ``root``; returns those removed."""
    now = time.time() if now is None else now
    try:
        # <TORCH_EXTENSIONS_DIR>/<op>/lock, or <default root>/<python>_<cuda>/<op>/lock
        locks = [p for p in [*root.glob("*/lock"), *root.glob("*/*/lock")] if now - p.stat().st_mtime > stale_seconds]
    except OSError:
        return []
    if not locks:
        return []
    busy = _working_dirs()
    removed = []
    for lock in locks:
        if any(d == lock.parent or lock.parent in d.parents for d in busy):
            continue  # a build runs there now
        try:
            age = now - lock.stat().st_mtime
            lock.unlink()
        except FileNotFoundError:
            continue  # another rank removed it first
        except OSError as err:
            log.warning("cannot remove the stale build lock %s (%s): DeepSpeed may wait for it", lock, err)
            continue
        removed.append(lock)
        log.warning("removed a stale build lock, %s (%.0f s old, no build running there): a build killed midway left "
                    "it, and every start would wait for it", lock, age)
    return removed
