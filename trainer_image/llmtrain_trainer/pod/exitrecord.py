"""Exit records: how a rank tells the launcher (and the operator) why it stopped.

torchrun reports a failed worker group with its own exit code 1, which would hide the
trainer's documented code (hang, preempted, config error ...). So each rank of a pod
writes ``<run_dir>/exit/attempt-<n>/local-<r>.json`` before it exits, and the launcher
turns the most significant record into the pod's exit code and termination message.

``n`` is torchrun's restart count, which grows only on failure restarts; a membership
change (a node joining) restarts the workers under the same count. So every run of a
local rank first marks itself started (``local-<r>.started``), and a record counts only
if it is newer than that mark: a record left by an earlier run under the same count is
never mistaken for the last run's, and a rank that died without a word (a signal) is seen
as exactly that.

Each failed attempt has a *cause* (``attempt_cause``): a rank of this pod crashed or hung
(``crash``, ``hang``), or every rank failed only because a peer elsewhere vanished
(``victim``: exit 83), or a rank ran out of GPU memory (``gpu_oom``: exit 88, a crash named
apart). The operator charges causes to the restart budget, never victims:
a victim's restart is a consequence of a failure charged where it happened.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from pathlib import Path

from llmtrain_contract import oom
from llmtrain_contract.exitcodes import ExitCode, FailureClass, classify_exit
from llmtrain_contract.names import FAILED_ATTEMPT_CAUSES

# When ranks disagree, the code that best explains the failure wins: a permanent error
# over a hang over a preemption over a timeout seen by the survivors of a dead peer.
_SEVERITY = {
    FailureClass.PERMANENT: 4,
    FailureClass.RETRYABLE: 2,
    FailureClass.DISRUPTION: 1,
    FailureClass.SUCCEEDED: 0,
}
CAUSES = FAILED_ATTEMPT_CAUSES
"""What ended a failed attempt, as exported in ``llmtrain_trainer_failed_attempts_total``."""
NEWER_CAUSES = (oom.GPU_CAUSE,)
"""Causes an operator older than them does not know: it refuses a termination message's
counts whole for one, and warns of the label on every page. Reported only once they
happened (``reported``), so a trainer image newer than its operator changes nothing until
one does."""
FAILURES = ("hang", "permanent", oom.GPU_CAUSE, "crash")
"""The causes that are this pod's own failure, the one that best explains an attempt
first: a hung rank explains its local peers' ends, a rank out of GPU memory a peer's
broken collective."""


def _severity(code: int) -> tuple[int, int]:
    klass = classify_exit(code).failure_class
    bonus = 1 if code == ExitCode.HANG else 0  # the hung rank explains the others' timeouts
    return (_SEVERITY[klass] + bonus, code)


def _folder(run_dir: Path, attempt: int) -> Path:
    return Path(run_dir) / "exit" / f"attempt-{attempt}"


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


SUPERSEDED = "superseded"
"""Where a failure record of an earlier run under the same restart count is kept."""


def mark_started(run_dir: Path, attempt: int, local_rank: int) -> None:
    """A run of this local rank begins: records older than this are not its own.

    torchrun restarts a worker group whose peer elsewhere failed (a membership change)
    without counting a restart of its own, so the new run has the attempt number of the
    one it replaces. When that earlier run had failed itself, a hang its supervisor
    judged or a crash, while the agent was already restarting the group for the peer,
    its record would be shadowed here and the failure never counted. Such a record is
    kept aside first (``superseded_causes``); a victim's or a preempted run's is not a
    failure of this pod and stays shadowed."""
    folder = _folder(run_dir, attempt)
    record = _read(folder / f"local-{local_rank}.json")
    started = _read(folder / f"local-{local_rank}.started")
    if record is not None and "code" in record and (started is None or record.get("time", 0) >= started.get("time", 0)):
        if _cause_of(int(record["code"])) in FAILURES:
            _write_json(folder / SUPERSEDED / f"{float(record.get('time', 0)):.6f}-local-{local_rank}.json", record)
    _write_json(folder / f"local-{local_rank}.started", {"time": time.time()})


def superseded_causes(run_dir: Path) -> list[str]:
    """The cause of each failed run that a run under the same restart count replaced."""
    return [_cause_of(int(record["code"])) for path in sorted(Path(run_dir).glob(f"exit/attempt-*/{SUPERSEDED}/*.json"))
            if (record := _read(path)) is not None and "code" in record]


def _cause_of(code: int) -> str:
    if code == ExitCode.HANG:
        return "hang"
    if code == ExitCode.GPU_OUT_OF_MEMORY:
        return oom.GPU_CAUSE
    if classify_exit(code).failure_class == FailureClass.PERMANENT:
        return "permanent"
    if code not in (ExitCode.SUCCESS, ExitCode.COLLECTIVE_TIMEOUT, ExitCode.PREEMPTED):
        return "crash"
    return "victim" if code == ExitCode.COLLECTIVE_TIMEOUT else "preempted"


def write(run_dir: Path, attempt: int, rank: int, local_rank: int, code: int, message: str, step: int | None,
          checkpoints: dict[str, int] | None = None, loss: float | None = None) -> None:
    """``checkpoints``: tier -> the newest step this rank saw committed there; ``loss``: the
    agreed loss of ``step`` (the last step this attempt finished), when it ran one."""
    record = {"rank": rank, "local_rank": local_rank, "code": int(code), "message": message, "step": step, "time": time.time()}
    if checkpoints:
        record["checkpoints"] = dict(checkpoints)
    if loss is not None and math.isfinite(loss):
        record["loss"] = float(loss)
    _write_json(_folder(run_dir, attempt) / f"local-{local_rank}.json", record)


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def read_attempt(run_dir: Path, attempt: int) -> list[dict]:
    """The records of the last run of ``attempt``, one per local rank that wrote one."""
    out = []
    for path in sorted(_folder(run_dir, attempt).glob("local-*.json")):
        record = _read(path)
        started = _read(path.with_suffix(".started"))
        if record is None or "code" not in record:
            continue
        if started is not None and record.get("time", 0) < started.get("time", 0):
            continue  # written by an earlier run under the same restart count
        out.append(record)
    return out


def latest_attempt(run_dir: Path) -> int | None:
    attempts = [int(p.name.split("-")[1]) for p in (Path(run_dir) / "exit").glob("attempt-*")]
    return max(attempts) if attempts else None


def most_significant(records: list[dict]) -> dict | None:
    failing = [r for r in records if r["code"] != 0]
    if not failing:
        return records[0] if records else None
    return max(failing, key=lambda r: _severity(r["code"]))


def attempt_cause(run_dir: Path, attempt: int, local_world_size: int) -> str:
    """Why ``attempt`` (a failed one: torchrun restarted after it) ended."""
    records = read_attempt(run_dir, attempt)
    causes = {_cause_of(int(r["code"])) for r in records}
    for cause in FAILURES:
        if cause in causes:
            return cause
    if len({r.get("local_rank") for r in records}) < local_world_size:
        return "crash"  # a rank of this pod died without a record: killed by a signal
    return "victim" if "victim" in causes else "preempted"


def failed_attempts(run_dir: Path, restart_count: int, local_world_size: int) -> dict[str, int]:
    """Causes of the attempts before ``restart_count`` in this pod (each one failed), and
    of the failed runs a membership change replaced (``mark_started``)."""
    causes = Counter(attempt_cause(run_dir, k, local_world_size) for k in range(restart_count))
    causes.update(superseded_causes(run_dir))
    return reported({cause: causes.get(cause, 0) for cause in CAUSES})


def reported(counts: dict[str, int]) -> dict[str, int]:
    """Every cause's count, the ``NEWER_CAUSES`` only once they are above 0."""
    return {cause: n for cause, n in counts.items() if n or cause not in NEWER_CAUSES}
