"""The pod's failed attempts, as the launcher sees them: the moment torchrun starts the
next worker group, not once the restarted trainer is up.

The trainer exports ``failed_attempts_total{cause}`` itself, but only after its restart
has imported torch, joined the process group and opened its metrics endpoint: seconds
after the supervisor (or a crash) ended the attempt. The launcher outlives every in-place
restart, so it serves the same counts on its own endpoint (``/metrics`` beside
``/healthz``) and the operator records the failure that much sooner.

Which attempt the worker group is in is read from outside: torchrun gives each worker it
spawns ``TORCHELASTIC_RESTART_COUNT`` (and ``LOCAL_WORLD_SIZE``) in its environment, which
``/proc/<pid>/environ`` shows from the moment the process exists. An attempt counts as
failed only once the next one has started, exactly as in the trainer's own counter: an
attempt that ends the pod is the pod's failure, reported by its exit code, and must not be
counted twice. Both counts come from the same exit records (``exitrecord.attempt_cause``),
so they agree; the operator takes the larger of the two per cause.

One exception makes a hang visible seconds sooner: the supervisor's (or a watchdog's)
HANG record is final (nothing outranks it in ``attempt_cause``), and with restarts left
(``--max-restarts``) torchrun restarts the group it belongs to. So the current attempt
counts as a ``hang`` the moment such a record exists, not once the next attempt has
gathered its rendezvous and started. Should the pod end with that attempt after all (its
agent failed), the launcher says so in its termination message
(``Termination.COUNTED_IN_PLACE``), and the operator does not charge the exit again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from llmtrain_contract.exitcodes import ExitCode

from llmtrain_trainer.pod import exitrecord

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def environ(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` was started with, or None when it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
    return {key: value for key, value in pairs}


def worker_group(agent_pid: int) -> tuple[int, int] | None:
    """(restart count, local world size) of the torchrun agent's live workers, or None
    while it has none (between attempts, before the first)."""
    best: tuple[int, int] | None = None
    for pid in children(agent_pid):
        env = environ(pid) or {}
        try:
            group = (int(env[RESTART_COUNT]), int(env.get(LOCAL_WORLD_SIZE, "1")))
        except (KeyError, ValueError):
            continue  # not a worker (torchrun starts nothing else, but a wrapper might)
        best = group if best is None else max(best, group)
    return best


@dataclass
class AttemptTracker:
    run_dir: Path
    agent_pid: int | None = None
    attempt: int = 0
    """The newest attempt seen started: every attempt before it failed."""
    local_world_size: int = 1
    max_restarts: int | None = None
    """torchrun's ``--max-restarts`` (None: unknown, nothing counts early)."""
    early: int | None = None
    """The newest attempt counted as a hang while it was still the current one (once the
    next starts, its exit records give the same cause)."""
    _causes: dict[int, str] = field(default_factory=dict)
    """attempt -> why it ended; final once a later attempt has started."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def failed_attempts(self) -> dict[str, int]:
        """cause -> failed attempts of this pod so far (every cause present, maybe 0, but
        the newer ones only once above 0: ``exitrecord.reported``)."""
        with self._lock:
            group = worker_group(self.agent_pid) if self.agent_pid is not None else None
            if group is not None and group[0] >= self.attempt:
                self.attempt, self.local_world_size = group
            for k in range(self.attempt):
                if k not in self._causes:
                    self._causes[k] = exitrecord.attempt_cause(self.run_dir, k, self.local_world_size)
            hung = self._hung_with_restarts_left(self.attempt)
            if self.early != self.attempt and hung:
                self.early = self.attempt
            counts = {cause: 0 for cause in exitrecord.CAUSES}
            for k in range(self.attempt):
                counts[self._causes[k]] += 1
            for cause in exitrecord.superseded_causes(self.run_dir):
                counts[cause] += 1
            if self.early == self.attempt and hung:
                # The current attempt, hung: torchrun restarts it. (Once a membership
                # change restarts it instead, the record is kept aside and counted there.)
                counts["hang"] += 1
            return exitrecord.reported(counts)

    def workers_running(self) -> bool:
        """Whether torchrun has live workers now (not between attempts, nor before the first)."""
        return self.agent_pid is not None and worker_group(self.agent_pid) is not None

    def counted_early(self, attempt: int) -> bool:
        """Whether ``attempt`` (the pod's last, at exit) was counted while it ran."""
        return self.early == attempt

    def _hung_with_restarts_left(self, attempt: int) -> bool:
        if self.max_restarts is None or attempt >= self.max_restarts:
            return False
        return any(int(r["code"]) == ExitCode.HANG for r in exitrecord.read_attempt(self.run_dir, attempt))
