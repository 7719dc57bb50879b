"""Where training resumes: the restore point every rank agrees on, then loading it.

The agreement (``checkpoint/restore.py``) picks the newest step every rank can load; a
copy that is not where this rank reads it is first pulled into tier 1. A pull that fails
on any rank (a remote copy whose bytes do not match, a tier that went away) excludes that
copy, and the ranks agree again, up to ``RESTORE_ROUNDS`` times. The load verifies every
byte as it is read, then restores this rank's RNG state when the world size is the one
that saved it (else it derives one deterministically).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtrain_contract.config import TrainerConfig
from llmtrain_store.tier import CheckpointError

from llmtrain_trainer.checkpoint.protocol import Checkpoints
from llmtrain_trainer.checkpoint.restore import Choice, NoLoadableCheckpoint
from llmtrain_trainer.checkpoint.rngfiles import rng_file
from llmtrain_trainer.engines import rng
from llmtrain_trainer.engines.base import Engine
from llmtrain_trainer.engines.schedule import lr_at
from llmtrain_trainer.train.agreement import gather
from llmtrain_trainer.world import DistInfo

log = logging.getLogger("llmtrain.trainer")

RESTORE_ROUNDS = 5
"""Agreements tried when pulls of the chosen copy keep failing, before giving up."""
RNG_STEP_STRIDE = 1_000_003
"""Derived RNG seeds: ``seed + stride * step + rank``, distinct per step and rank."""


@dataclass(frozen=True)
class RestorePoint:
    """The agreed step, and where this rank reads its files (None: it receives the state
    from a peer)."""

    choice: Choice
    folder: Path | None


class Resume:
    def __init__(self, cfg: TrainerConfig, info: DistInfo, ckpt: Checkpoints, metrics: Any, sharded: bool):
        self.cfg = cfg
        self.info = info
        self.ckpt = ckpt
        self.metrics = metrics
        self.sharded = sharded

    def agree(self) -> RestorePoint | None:
        """The restore point every rank agrees on, with its files where this rank reads
        them; None for a fresh start (nothing saved, or every copy unusable and
        ``checkpoint.allowFreshStart`` set). A collective."""
        return agree(self.ckpt, self.info, self.sharded, self.cfg.checkpoint.allow_fresh_start,
                     self.cfg.fault_tolerance.collective_timeout_seconds)

    def load(self, engine: Engine, point: RestorePoint, heartbeat: Callable[[], None]) -> int:
        """Load ``point`` into ``engine`` and the RNG state; returns the restored step."""
        choice = point.choice
        began = time.perf_counter()
        engine.restore(choice, point.folder, heartbeat)
        same_world = choice.saved_world == self.info.world_size
        if not (same_world and self._restore_rng(choice, point.folder)):
            # No saved stream fits this rank (a new world size, or none verifies): derive
            # one deterministically.
            rng.seed_all(self.cfg.seed + RNG_STEP_STRIDE * choice.step + self.info.rank)
        expected = choice.step * self.cfg.global_batch_size
        if choice.samples != expected:
            raise RuntimeError(f"checkpoint step {choice.step} records {choice.samples} samples, expected {expected}")
        seconds = time.perf_counter() - began
        tier = choice.source_tier or "unknown"
        self.metrics.restored(tier, choice.step, seconds)
        if self.info.rank == 0:
            self._log_resumed(choice, tier, seconds)
        return choice.step

    def _restore_rng(self, choice: Choice, folder: Path | None) -> bool:
        """This rank's saved RNG state, verified against its manifest first: from the
        copy it loaded, else from any tier holding it (a rank that received the state by
        broadcast). False when none verifies (each refusal is logged)."""
        found = self.ckpt.read_rng(choice.step, rng_file(self.info.rank), folder)
        if found is None:
            log.warning("rank %d: no usable saved RNG state of step %d; deriving one", self.info.rank, choice.step)
            return False
        rng.restore(*found)
        return True

    def _log_resumed(self, choice: Choice, tier: str, seconds: float) -> None:
        via = f" from rank {choice.source_rank}" if choice.mode == "broadcast" else ""
        log.info("resumed from step %d (%s tier, %s%s, saved at world size %d, now %d) in %.2fs",
                    choice.step, tier, choice.mode, via, choice.saved_world, self.info.world_size, seconds)
        saved_max = choice.saved_max_steps
        if saved_max is not None and saved_max != self.cfg.max_steps:
            opt = self.cfg.optimizer
            log.warning(
                "maxSteps changed from %d to %d since step %d was saved: the learning-rate schedule now spans %d "
                "steps, so step %d trains at lr %.3g instead of %.3g (steps already taken and the data order are "
                "unchanged)", saved_max, self.cfg.max_steps, choice.step, self.cfg.max_steps, choice.step + 1,
                lr_at(choice.step, opt, self.cfg.max_steps), lr_at(choice.step, opt, saved_max),
            )


def agree(ckpt: Checkpoints, info: DistInfo, sharded: bool, allow_fresh_start: bool,
          collective_timeout: float) -> RestorePoint | None:
    """The agreement on a restore point (``Resume.agree``; the checkpoint API's too): every
    rank calls it; a pull that fails on any rank excludes that copy and they agree again."""
    pull_timeout = max(600.0, collective_timeout)
    excluded: frozenset[tuple[str, int]] = frozenset()
    ckpt.forget_failed_pulls()
    failures: list[tuple[str, int, str]] = []
    for _ in range(RESTORE_ROUNDS):
        try:
            choice = ckpt.restore_point(sharded, lambda o: gather(info, o), excluded)
        except NoLoadableCheckpoint as err:
            if not allow_fresh_start:
                raise
            log.error("%s; starting from step 0 because checkpoint.allowFreshStart is set", err)
            return None
        if choice is None:
            if info.rank == 0:
                # Said on every start: after a failure it tells that no checkpoint had
                # been committed yet, so the restart redoes every step from the first.
                log.info("starting from step 0: no checkpoint in any tier")
            return None
        folder, failure = None, None
        if not (choice.mode == "broadcast" and info.rank != choice.source_rank):
            try:
                folder = ckpt.localize(choice, pull_timeout)
            except CheckpointError as err:
                failure = (choice.tier or "", choice.step, str(err))
        failures = [f for f in gather(info, failure) if f]
        if not failures:
            return RestorePoint(choice, folder)
        if info.rank == 0:
            for _tier, step, why in failures:
                log.warning("step %d: %s; agreeing on another copy", step, why)
        excluded = excluded | {(t, s) for t, s, _ in failures}
    raise NoLoadableCheckpoint([why for _, _, why in failures])
