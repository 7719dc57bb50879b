"""``checkpoint.enabled: false``: the ``Checkpoints`` protocol with nothing behind it.

Every method the training loop calls exists and does nothing, so the loop chooses once
(``build_checkpoints``) and never asks per step whether checkpointing is on. A run without
checkpoints starts from step 0 after any restart: that is what it asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmtrain_contract.cadence import SaveCost
from llmtrain_store.health import Degraded

from llmtrain_trainer.checkpoint.protocol import Checkpointable, Gather, RngState
from llmtrain_trainer.checkpoint.protocol import Choice


class NoCheckpoints:
    def __init__(self) -> None:
        self.last_committed: dict[str, int] = {}
        self.costs: list[SaveCost] = []

    def bind(self, engine: Checkpointable) -> None:
        return None

    def set_data_position(self, wire: dict[str, Any]) -> None:
        return None

    def forget_failed_pulls(self) -> None:
        return None

    def restore_point(self, sharded: bool, gather: Gather, excluded: frozenset[tuple[str, int]] = frozenset()) -> Choice | None:
        return None  # nothing was saved: always a fresh start

    def localize(self, choice: Choice, timeout: float) -> Path:
        raise AssertionError("no restore point is ever chosen without checkpoints")

    def read_rng(self, step: int, name: str, first: Path | None) -> RngState | None:
        return None

    def prepare(self, barrier: Callable[[], None], restored_step: int, lineage: list[str], sweep_shared: bool = True) -> None:
        return None

    def busy(self) -> bool:
        return False

    def writing(self) -> bool:
        return False

    def tiers_busy(self) -> list[bool]:
        return []

    def defer(self) -> None:
        return None

    def wait(self) -> None:
        return None

    def wait_free(self) -> bool:
        return True

    def save(self, step: int, samples: int, rng_state: RngState, tiers_busy: list[bool] | None = None,
             sync: bool = False) -> float:
        return 0.0

    def rescue(self, step: int, samples: int, updates: int, rng_state: RngState, deadline: float) -> str | None:
        return "checkpointing is off"

    def newest_saved(self) -> int | None:
        return None

    def newest_local(self) -> int | None:
        return None

    def durable(self, step: int) -> tuple[bool, bool]:
        return True, False  # nothing to save: the run is as durable as it asked to be

    def degraded(self) -> dict[str, Degraded]:
        return {}

    def close(self) -> None:
        return None
