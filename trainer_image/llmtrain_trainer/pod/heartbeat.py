"""Heartbeat files: each rank's progress, readable from outside the rank.

A thread inside the rank cannot watch a rank that is frozen (SIGSTOP, a debugger, a
paused VM) or whose interpreter is held by native code that never releases the GIL: the
thread stops with it. So every rank also publishes its progress in a small memory-mapped
file, ``<run_dir>/heartbeat/local-<r>.hb``, and the launcher's supervisor (a different
process) reads it. A beat is one store into shared memory: no system call per step.

The record says where the rank is, not only when it last moved: a rank waiting inside a
collective (``COLLECTIVE``, or ``TRAIN_STEP``, whose backward pass all-reduces) and using
no CPU is most likely a *victim* of a peer that stopped participating; a rank that went
stale anywhere else, or burns CPU, or is stopped, is the *cause*.
"""

from __future__ import annotations

import contextlib
import enum
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

_LAYOUT = struct.Struct("<4s6iqdddd4xi")
"""magic, version, pid, rank, local rank, attempt, state, step, beat (``clock()``), the
rank's current hang limit (``watchdog.first_step_limit`` until its attempt's first step),
when its first step ended (``clock()``; 0 before), the seconds a rescue checkpoint may take
(0: the rank cannot save one), and the supervisor's rescue request (written by the
supervisor, the one field a reader writes)."""
_MAGIC = b"LTHB"
_VERSION = 3
_SIZE = 128
_STATE_OFFSET = 4 + 5 * 4
_STEP_OFFSET = 4 + 6 * 4
_BEAT_OFFSET = _STEP_OFFSET + 8
_TIMEOUT_OFFSET = _BEAT_OFFSET + 8
_FIRST_STEP_OFFSET = _TIMEOUT_OFFSET + 8
_RESCUE_BUDGET_OFFSET = _FIRST_STEP_OFFSET + 8
_RESCUE_REQUEST_OFFSET = _RESCUE_BUDGET_OFFSET + 8 + 4


def clock() -> float:
    """Seconds since boot, suspend included (``CLOCK_BOOTTIME``): the clock every process of
    the machine shares and that ``/proc/<pid>/stat`` counts process start times in."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class State(enum.IntEnum):
    STARTING = 0
    """Rendezvous, restore: not watched (those waits have their own timeouts)."""
    STEPPING = 1
    """In the training loop, outside any collective (data, fault hooks, checkpoint logic)."""
    TRAIN_STEP = 2
    """Forward and backward: compute, and the gradient all-reduce inside backward."""
    COLLECTIVE = 3
    """A pure collective (the per-step agreement, a barrier)."""
    DONE = 4
    """The training loop is over; nothing left to watch."""
    RESCUING = 5
    """A peer failed and this rank saves its rescue checkpoint before it ends: a victim,
    whatever CPU the write takes."""


WAITING_STATES = (State.TRAIN_STEP, State.COLLECTIVE, State.RESCUING)
"""States in which an idle, stale rank is waiting for its peers (or saving what a peer's
failure left it)."""


def folder(run_dir: Path) -> Path:
    return Path(run_dir) / "heartbeat"


class Heartbeat:
    """The rank's side: create the file, then beat and mark sections."""

    def __init__(self, run_dir: Path, rank: int, local_rank: int, attempt: int, timeout_seconds: float):
        path = folder(run_dir) / f"local-{local_rank}.hb"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(_LAYOUT.pack(_MAGIC, _VERSION, os.getpid(), rank, local_rank, attempt, State.STARTING, 0,
                                     clock(), float(timeout_seconds), 0.0, 0.0, 0).ljust(_SIZE, b"\0"))
        tmp.replace(path)  # a reader never sees a half-written record of a new run
        self.path = path
        with path.open("r+b") as fh:
            self._map = mmap.mmap(fh.fileno(), _SIZE)
        self._state = State.STARTING

    def beat(self, step: int | None = None) -> None:
        with contextlib.suppress(ValueError, TypeError):  # closed by the loop's end while a writer thread beats
            if step is not None:
                struct.pack_into("<q", self._map, _STEP_OFFSET, step)
            struct.pack_into("<d", self._map, _BEAT_OFFSET, clock())

    def set_timeout(self, seconds: float) -> None:
        """Publish the rank's current limit (longer for an attempt's first step)."""
        with contextlib.suppress(ValueError, TypeError):
            struct.pack_into("<d", self._map, _TIMEOUT_OFFSET, float(seconds))

    def mark_first_step(self) -> None:
        """The process's first step is done (the torchrun agent admits waiting nodes only
        then: ``torchrun_agent.admit_after_first_step``)."""
        with contextlib.suppress(ValueError, TypeError):
            struct.pack_into("<d", self._map, _FIRST_STEP_OFFSET, clock())

    def offer_rescue(self, budget_seconds: float) -> None:
        """Tell the supervisor this rank can save a rescue checkpoint when it is judged a
        victim, within ``budget_seconds`` (0 withdraws the offer)."""
        with contextlib.suppress(ValueError, TypeError):
            struct.pack_into("<d", self._map, _RESCUE_BUDGET_OFFSET, float(budget_seconds))

    def rescue_requested(self) -> bool:
        """Whether the supervisor asked this rank for a rescue checkpoint."""
        try:
            return struct.unpack_from("<i", self._map, _RESCUE_REQUEST_OFFSET)[0] != 0
        except (ValueError, TypeError):
            return False

    def set_state(self, state: State) -> State:
        previous, self._state = self._state, state
        with contextlib.suppress(ValueError, TypeError):
            struct.pack_into("<i", self._map, _STATE_OFFSET, int(state))
        return previous

    @property
    def state(self) -> State:
        return self._state

    @contextlib.contextmanager
    def section(self, state: State) -> Iterator[None]:
        previous = self.set_state(state)
        try:
            yield
        finally:
            self.set_state(previous)

    def close(self) -> None:
        self.set_state(State.DONE)
        self._map.close()


@dataclass(frozen=True)
class Beat:
    """What a reader sees of one rank."""

    pid: int
    rank: int
    local_rank: int
    attempt: int
    state: State
    step: int
    beat: float
    timeout: float
    first_step: float = 0.0
    """When the process's first step ended (``clock()``), 0 before."""
    rescue_budget: float = 0.0
    """Seconds the rank may take for a rescue checkpoint; 0: it cannot save one."""
    rescue_requested: bool = False

    def stale_for(self, now: float | None = None) -> float:
        return (clock() if now is None else now) - self.beat


def read(path: Path) -> Beat | None:
    try:
        data = path.read_bytes()[:_LAYOUT.size]
        magic, version, pid, rank, local_rank, attempt, state, step, beat, timeout, first_step, budget, request = _LAYOUT.unpack(data)
    except (OSError, struct.error):
        return None
    if magic != _MAGIC or version != _VERSION:
        return None
    try:
        state = State(state)
    except ValueError:
        return None
    return Beat(pid, rank, local_rank, attempt, state, step, beat, timeout, first_step, budget, request != 0)


def request_rescue(run_dir: Path, beat: Beat) -> bool:
    """The supervisor's side: ask the rank of ``beat`` for a rescue checkpoint (a store into
    its heartbeat file, which the rank maps). False when the file is gone or is another
    process's by now."""
    path = folder(run_dir) / f"local-{beat.local_rank}.hb"
    try:
        with path.open("r+b") as fh:
            current = read(path)
            if current is None or current.pid != beat.pid:
                return False
            fh.seek(_RESCUE_REQUEST_OFFSET)
            fh.write(struct.pack("<i", 1))
        return True
    except OSError:
        return False


def read_all(run_dir: Path) -> list[Beat]:
    beats = (read(p) for p in sorted(folder(run_dir).glob("local-*.hb")))
    return [b for b in beats if b is not None]
