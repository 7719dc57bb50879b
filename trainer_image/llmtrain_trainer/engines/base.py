"""What the training loop needs of an engine (a strategy: plain DDP, DeepSpeed ZeRO).

An engine owns the model and the optimizer: it runs one optimizer step over a list of
micro-batches, and its state is checkpointed (``checkpoint.protocol.Checkpointable``: the
one interface where engines and checkpointing meet) and restored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import torch
from llmtrain_contract.config import TrainerConfig

from llmtrain_trainer.checkpoint.protocol import Checkpointable, Choice
from llmtrain_trainer.world import DistInfo

Batch = tuple[torch.Tensor, torch.Tensor]
"""(inputs, targets) of one micro-batch."""


class Engine(Checkpointable, Protocol):
    kind: str

    sync_started: float
    """``time.perf_counter()`` when the last train step began its last micro-batch's
    backward pass, where the first gradient all-reduce (the first wait for the peers)
    happens: the end of the rank's local share of the step."""

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        """Forward/backward every micro-batch, then one optimizer step. Returns this
        rank's mean micro-batch loss (a 0-d tensor, not yet reduced across ranks)."""
        ...

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (this rank's view)."""
        ...

    def updates(self) -> int:
        """How many optimizer steps this engine's state has taken (restored ones included)."""
        ...

    def can_rescue(self) -> bool:
        """Whether this engine can ever give a rescue snapshot: the whole state replicated
        in every rank and kept in host memory."""
        ...

    def restore(self, choice: Choice, folder: Path | None, heartbeat: Callable[[], None]) -> None:
        """Load the agreed restore point. ``folder``: where this rank reads its files
        (verified as they are read); None when it receives the state from a peer
        (``choice.mode == "broadcast"``). A collective: every rank calls it."""
        ...


class Healable(Engine, Protocol):
    """An engine whose whole state any one rank holds and can send to the others: what
    in-process healing needs (``train/heal.py``; DDP)."""

    def unwrap(self) -> None:
        """Let go of everything that holds the default process group (its peer failed)."""
        ...

    def rewrap(self) -> None:
        """Rebuild what binds the engine to the default process group, after a new one
        replaced it. A collective."""
        ...

    def broadcast_from(self, src: int) -> None:
        """Rank ``src``'s whole state into every rank. A collective."""
        ...


class EngineClass(Protocol):
    """An engine's class: it builds the engine once the restore point is known."""

    kind: str

    def create(self, cfg: TrainerConfig, info: DistInfo, restoring_universal: bool) -> Engine:
        """``restoring_universal``: the restore will load a universal checkpoint (another
        world size of a sharded state), which changes how the engine is built."""
        ...

    @staticmethod
    def allowed_names() -> re.Pattern[str]: ...

    @staticmethod
    def file_rank(name: str) -> int | None: ...


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
