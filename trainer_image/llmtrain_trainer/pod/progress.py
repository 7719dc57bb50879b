"""Progress of a user's script, as its launcher reads it (the contract in
docs/custom-scripts.md).

A script reports progress, if it wants to, by writing its step as a decimal number to
the file named in ``LLMTRAIN_PROGRESS_FILE``: one line a step, nothing else. No
library, no port, no format to learn. The launcher reads every such file of its pod (one
per local rank under the script runner, ``script.py``; one per pod otherwise) and serves
the largest step, and when a file last changed, on its ``/metrics``; the operator turns
that into ``status.step`` and its progress timeout, as it does for the built-in trainer.
A script that never writes the file runs all the same, without a progress timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FOLDER = "progress"
POD_FILE = "pod"
"""The pod-wide file (``LLMTRAIN_PROGRESS_FILE`` as the pod's environment sets it)."""


def folder(run_dir: Path | str) -> Path:
    return Path(run_dir) / FOLDER


def pod_file(run_dir: Path | str) -> Path:
    return folder(run_dir) / POD_FILE


def rank_file(run_dir: Path | str, local_rank: int) -> Path:
    """Each local rank's own file, so that ranks writing at once never tear one file."""
    return folder(run_dir) / f"local-{local_rank}"


@dataclass(frozen=True)
class Progress:
    step: int
    """The largest step any local rank reported."""
    updated: float
    """When a progress file last changed (seconds since the epoch): when a step ended."""


def read(run_dir: Path | str) -> Progress | None:
    """The pod's progress, or None while no file holds a step. A file caught mid-write
    (empty, or a partial number) is skipped: the next read sees it whole."""
    best: Progress | None = None
    try:
        paths = list(folder(run_dir).iterdir())
    except OSError:
        return None
    for path in paths:
        try:
            text = path.read_text().strip()
            updated = path.stat().st_mtime
        except OSError:
            continue
        line = text.splitlines()[-1].strip() if text else ""
        if not line.isdigit():
            continue
        step = int(line)
        if best is None:
            best = Progress(step, updated)
        else:
            best = Progress(max(best.step, step), max(best.updated, updated))
    return best
