"""Exit records: how a rank tells the launcher (and the operator) why it stopped.

torchrun reports a failed worker group with its own exit code 1, which would hide the
trainer's documented code (hang, preempted, config error ...). So each rank writes
``<run_dir>/exit/attempt-<n>/rank-<r>.json`` before it exits, and the launcher turns the
most significant record into the pod's exit code and termination message.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .exitcodes import ExitCode, FailureClass, classify_exit

# When ranks disagree, the code that best explains the failure wins: a permanent error
# over a hang over a preemption over a timeout seen by the survivors of a dead peer.
_SEVERITY = {
    FailureClass.PERMANENT: 4,
    FailureClass.RETRYABLE: 2,
    FailureClass.DISRUPTION: 1,
    FailureClass.SUCCEEDED: 0,
}


def _severity(code: int) -> tuple[int, int]:
    klass = classify_exit(code).failure_class
    bonus = 1 if code == ExitCode.HANG else 0  # the hung rank explains the others' timeouts
    return (_SEVERITY[klass] + bonus, code)


def write(run_dir: Path, attempt: int, rank: int, code: int, message: str, step: int | None) -> None:
    folder = Path(run_dir) / "exit" / f"attempt-{attempt}"
    folder.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "code": int(code), "message": message, "step": step, "time": time.time()}
    tmp = folder / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(folder / f"rank-{rank}.json")


def read_attempt(run_dir: Path, attempt: int) -> list[dict]:
    folder = Path(run_dir) / "exit" / f"attempt-{attempt}"
    out = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def latest_attempt(run_dir: Path) -> int | None:
    attempts = [int(p.name.split("-")[1]) for p in (Path(run_dir) / "exit").glob("attempt-*")]
    return max(attempts) if attempts else None


def most_significant(records: list[dict]) -> dict | None:
    failing = [r for r in records if r["code"] != 0]
    if not failing:
        return records[0] if records else None
    return max(failing, key=lambda r: _severity(r["code"]))


def count_code(run_dir: Path, code: int) -> int:
    """How many attempts in this run dir ended with ``code`` on some rank (for metrics)."""
    total = 0
    for folder in (Path(run_dir) / "exit").glob("attempt-*"):
        records = read_attempt(run_dir, int(folder.name.split("-")[1]))
        total += any(r["code"] == code for r in records)
    return total
