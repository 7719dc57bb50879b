"""Where the training loop, the engines and checkpointing meet.

- ``Checkpointable``: what checkpointing needs of an engine (a snapshot of its state,
  taken without a copy on the training path, and the names of the files it writes). The
  engines implement it (``engines/``); checkpointing never imports an engine.
- ``Choice`` and ``manifest_files``: what an engine is told when it restores (the step,
  the mode, the files this rank loads) and how it reads a committed step's file list.
- ``Checkpoints``: what the training loop needs of checkpointing. ``CheckpointManager``
  (the tiers) and ``NoCheckpoints`` (``checkpoint.enabled: false``) both implement all of
  it, so the loop chooses once and checks nothing per step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from llmtrain_contract.cadence import SaveCost
from llmtrain_store import manifest as mf
from llmtrain_store.health import Degraded
from llmtrain_store.sources import Source


RngState = tuple[dict[str, torch.Tensor], dict[str, Any]]
"""Every generator's state as tensors and JSON-able numbers (``engines/rng.py``)."""
Gather = Callable[[Any], list[Any]]
"""An all-gather of Python objects across the ranks."""

Mode = Literal["local", "broadcast", "universal"]
"""How a restore reaches a rank: its own copy, a broadcast from another rank, or the
universal form of a sharded state."""


@dataclass
class Choice:
    step: int
    mode: Mode
    samples: int
    saved_world: int
    copy: Any | None
    """This rank's committed copy to read (None when it receives the state by broadcast)."""
    tier: str | None
    """The tier of that copy."""
    source_rank: int = 0
    source_tier: str | None = None
    """The tier the state came from: the source rank's tier for a broadcast, this rank's
    own tier otherwise. Logged and exported, so the message is the same whichever node
    rank 0 lands on."""
    saved_max_steps: int | None = None
    names: list[str] = field(default_factory=list)
    """The files this rank loads (verified during the agreement)."""
    data: dict | None = None
    """The data position the step recorded (None: none)."""
    lineage: list[str] = field(default_factory=list)
    """The owners whose history the step continues: this run adopts them
    (``llmtrain_store.owner``)."""


def manifest_files(folder: Path, allowed: re.Pattern[str]) -> dict[str, mf.FileEntry]:
    """The files of the committed step in ``folder``, as its manifest (checked) lists them."""
    return mf.entries(json.loads((folder / mf.MANIFEST).read_text()), allowed)


class Snapshot(Protocol):
    """The state of one checkpoint, held until it is written."""

    def write(self, folder: Path) -> dict[str, dict[str, Any]]:
        """Write this rank's engine files into ``folder``; their manifest records."""
        ...

    def images(self) -> Mapping[str, Source]:
        """The files' bytes as they would be written, from memory (tier 1 is down). A
        ``Mapping``: an engine's own source type is one (a ``dict`` of it would not be)."""
        ...

    def release(self) -> None:
        """The files are written (or given up): the memory may change again."""
        ...


class FileNaming(Protocol):
    """The files a strategy writes: what a manifest may name, and whose each one is."""

    @staticmethod
    def allowed_names() -> re.Pattern[str]:
        """Every file name this engine writes (a manifest naming anything else is rejected)."""
        ...

    @staticmethod
    def file_rank(name: str) -> int | None:
        """The rank an engine file belongs to; None for files every rank shares."""
        ...


class Checkpointable(FileNaming, Protocol):
    """What checkpointing needs of an engine."""

    def snapshot(self) -> Snapshot | None:
        """Capture this rank's state as of now, without copying it on the training path.
        None when this rank writes no engine file (a replicated state is written by the
        node leader)."""
        ...

    def snapshot_free(self) -> bool:
        """Whether a new snapshot can be taken now (the previous one's memory is free)."""
        ...

    def rescue_snapshot(self, updates: int) -> Snapshot | None:
        """A snapshot for a rescue checkpoint, taken from a thread other than the training
        loop's (which may be blocked in a collective), of the state after exactly
        ``updates`` optimizer steps. None when this engine cannot give one: the state is
        sharded (a peer's part is lost with it), not in host memory, being updated, or
        already past that step."""
        ...

    def replicated_files(self) -> set[str]:
        """Files every rank shares (written once per node, stored once per job)."""
        ...


class Checkpoints(Protocol):
    """What the training loop needs of checkpointing, whether it is on or off."""

    last_committed: dict[str, int]
    """Tier -> the newest step this rank knows committed there."""
    costs: list[SaveCost]
    """Each checkpoint committed to tier 1 by this node leader, in order (the adaptive
    cadence's input)."""

    # -------------------------------------------------------------- restore

    def bind(self, engine: Checkpointable) -> None:
        """The engine whose state is saved (it exists only after the restore point is known)."""
        ...

    def set_data_position(self, wire: dict[str, Any]) -> None:
        """What every later checkpoint records as the data stream's position."""
        ...

    def forget_failed_pulls(self) -> None:
        """Before an agreement on a restore point: earlier pulls' failure notes go."""
        ...

    def restore_point(self, sharded: bool, gather: Gather, excluded: frozenset[tuple[str, int]] = frozenset()) -> Choice | None:
        """The newest step every rank can load (an agreement: every rank calls it); None
        for a fresh start."""
        ...

    def localize(self, choice: Choice, timeout: float) -> Path:
        """Where this rank reads ``choice``'s files (pulled into tier 1 first when they are
        elsewhere)."""
        ...

    def read_rng(self, step: int, name: str, first: Path | None) -> RngState | None:
        """This rank's saved RNG state of ``step``, verified; None when no copy verifies."""
        ...

    def prepare(self, barrier: Callable[[], None], restored_step: int, lineage: list[str], sweep_shared: bool = True) -> None:
        """Adopt the restored step's ``lineage`` (empty for a fresh start: clean-up then
        touches only this run's steps), sweep what a crash left behind and start the
        slower tiers' work."""
        ...

    # -------------------------------------------------------------- save

    def busy(self) -> bool:
        """A snapshot cannot be taken now: the previous one is still being written."""
        ...

    def writing(self) -> bool:
        """This rank is writing a checkpoint in the background (it takes CPU from the steps)."""
        ...

    def tiers_busy(self) -> list[bool]:
        """Per slower tier: this rank is still storing a step into it."""
        ...

    def defer(self) -> None:
        """A checkpoint that fell due waits for the previous one's write."""
        ...

    def wait(self) -> None:
        """Block until the previous save is persisted in tier 1."""
        ...

    def wait_free(self) -> bool:
        """Block until a new snapshot can be taken; False when that takes too long."""
        ...

    def save(self, step: int, samples: int, rng_state: RngState, tiers_busy: list[bool] | None = None,
             sync: bool = False) -> float:
        """Checkpoint the state after optimizer step ``step``; the seconds the caller was blocked."""
        ...

    def rescue(self, step: int, samples: int, updates: int, rng_state: RngState, deadline: float) -> str | None:
        """A rescue checkpoint of ``step`` into tier 1; None when saved, else why not."""
        ...

    # -------------------------------------------------------------- what was saved

    def newest_saved(self) -> int | None:
        """The newest step this rank stored into tier 1."""
        ...

    def newest_local(self) -> int | None:
        """The newest step committed to tier 1, as this rank knows it."""
        ...

    def durable(self, step: int) -> tuple[bool, bool]:
        """(this rank's files of ``step`` are committed in tier 1, a job-wide tier committed it)."""
        ...

    def degraded(self) -> dict[str, Degraded]:
        """Tier -> why it is degraded, for the tiers that are."""
        ...

    def close(self) -> None:
        """Finish or give up the writes in flight; stop the background work."""
        ...
