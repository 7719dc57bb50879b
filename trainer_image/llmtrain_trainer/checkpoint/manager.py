"""Saving and propagating checkpoints across tiers.

Save path (tier 1, node-local):
  1. the training loop blocks only for the in-memory snapshot (DDP) or DeepSpeed's own
     collective save (which has no separate snapshot);
  2. a background thread writes the files, announces this rank's part, and on the node
     leader commits the node's checkpoint and applies retention;
  3. then, on the tier's cadence, it copies the node's files into the slower tiers; the
     job leader (global rank 0) commits those once every rank's part has arrived.

A failing tier (disk full, unreachable mount) degrades: the error is logged and counted
in metrics, training goes on, and nothing already committed is touched.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from .. import rng
from ..dist import DistInfo
from ..engine import Engine, engine_class
from .restore import Choice, find_restore_point
from .tier import CheckpointError, DirTier, describe_files

log = logging.getLogger("llmtrain.checkpoint")

RNG_DIR = "rng"


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank-{rank:05d}.pt"


def file_rank(name: str, engine: Engine | type[Engine]) -> int | None:
    """The rank a checkpoint file belongs to; None for files shared by all ranks."""
    if name.startswith(RNG_DIR + "/rank-"):
        return int(name.rsplit("-", 1)[1].split(".")[0])
    return engine.file_rank(name)


class CheckpointManager:
    """Tiered checkpoints of one rank: the restore agreement, saves, propagation."""

    def __init__(
        self,
        tiers: list[DirTier],
        info: DistInfo,
        interval_steps: int,
        meta: dict[str, Any],
        commit_timeout: float,
        metrics: Any,
        heartbeat: Callable[[], None],
    ):
        self.tiers = tiers
        self.info = info
        self.interval_steps = interval_steps
        self.engine: Engine | None = None
        self.meta = meta
        self.commit_timeout = commit_timeout
        self.metrics = metrics
        self.heartbeat = heartbeat
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer")
        self._pending: Future[None] | None = None
        self._count = 0
        self.last_committed: dict[str, int] = {}
        self._lock = threading.Lock()

    def bind(self, engine: Engine) -> None:
        """The engine whose state is saved (it exists only after the restore point is
        known: a universal restore changes how it is built)."""
        self.engine = engine

    def restore_point(self, strategy: str, sharded: bool, gather: Callable[[Any], list[Any]]) -> Choice | None:
        """The agreed restore point (``restore.find_restore_point``)."""
        engine_cls = engine_class(strategy)
        return find_restore_point(self.tiers, self.info.rank, self.info.world_size, self.meta["config_hash"], strategy,
                                  sharded, lambda name: file_rank(name, engine_cls), gather)

    def due(self, step: int, max_steps: int) -> bool:
        """A regular checkpoint falls at this step (the last step gets the final save)."""
        return step % self.interval_steps == 0 and step < max_steps

    def newest_local(self) -> int | None:
        return self.last_committed.get(self.tiers[0].name)

    def leader_of(self, tier: DirTier) -> bool:
        """Tier 1 is per node (its leader commits); slower tiers are per job (rank 0)."""
        return self.info.is_node_leader if tier is self.tiers[0] else self.info.rank == 0

    def prepare(self, barrier: Callable[[], None]) -> None:
        """Sweep staging folders a crash left behind, before anybody writes again."""
        for tier in self.tiers:
            if self.leader_of(tier):
                tier.root.mkdir(parents=True, exist_ok=True)
                tier.sweep_staging()
        barrier()

    # -------------------------------------------------------------------- save

    def wait(self) -> None:
        """Block until the previous save (and its propagation) finished."""
        if self._pending is not None:
            try:
                self._pending.result()
            finally:
                self._pending = None

    def save(self, step: int, samples: int, sync: bool = False) -> float:
        """Checkpoint the state after optimizer step ``step``. Returns the seconds the
        caller was blocked (the snapshot, or the whole save when synchronous)."""
        started = time.perf_counter()
        self.wait()  # never two saves in flight: a slow tier must not pile up memory
        meta = {
            **self.meta,
            "step": step,
            "samples_consumed": samples,
            "world_size": self.info.world_size,
            "local_world_size": self.info.local_world_size,
            "time": time.time(),
        }
        index = self._count
        self._count += 1
        local = self.tiers[0]
        staging = local.staging(step)
        rng_state = rng.capture()
        snap = self.engine.snapshot()
        written_sync: list[str] | None = None
        if sync or not self.engine.async_capable:
            # Synchronous: write now (DeepSpeed's collective save, SIGTERM, the final step).
            written_sync = self.engine.write_snapshot(snap, staging)
            snap = None
        blocked = time.perf_counter() - started
        job = lambda: self._persist(step, meta, index, snap, written_sync, rng_state)  # noqa: E731
        if sync:
            job()
        else:
            self._pending = self._pool.submit(self._guard, job, step)
        self.metrics.checkpoint_stall(blocked)
        return time.perf_counter() - started if sync else blocked

    def _guard(self, job: Callable[[], None], step: int) -> None:
        try:
            job()
        except Exception as err:  # a tier failure degrades, it never kills training
            log.error("checkpoint of step %d failed: %s", step, err)

    def _persist(
        self, step: int, meta: dict[str, Any], index: int, snap: Any, written: list[str] | None, rng_state: Any
    ) -> None:
        local = self.tiers[0]
        began = time.perf_counter()
        try:
            staging = local.staging(step)
            files = written if written is not None else self.engine.write_snapshot(snap, staging)
            (staging / RNG_DIR).mkdir(exist_ok=True)
            torch.save(rng_state, staging / rng_file(self.info.rank))
            files = [*files, rng_file(self.info.rank)]
            local.write_part(step, self.info.rank, describe_files(staging, files), self.engine.replicated_files())
            if self.info.is_node_leader:
                expected = set(self.info.ranks_on_node())
                committed = local.commit(step, meta, expected, self.commit_timeout, self.heartbeat)
                local.retain()
                self._committed(local, step, time.perf_counter() - began)
                log.info("checkpoint step %d committed to %s (%s)", step, local.name, committed.path)
        except (OSError, CheckpointError, RuntimeError) as err:
            self.metrics.checkpoint_failed(local.name)
            shutil.rmtree(local.staging(step), ignore_errors=True)
            raise CheckpointError(f"{local.name} tier: {err}") from err
        if self.info.is_node_leader:
            for tier in self.tiers[1:]:
                if index % tier.every_checkpoints == 0:
                    self._propagate(local, tier, step, meta)

    def _propagate(self, source: DirTier, tier: DirTier, step: int, meta: dict[str, Any]) -> None:
        """Copy this node's files of ``step`` from ``source`` into ``tier``."""
        began = time.perf_counter()
        try:
            src = source.final(step)
            manifest = next(c.manifest for c in source.list() if c.step == step)
            staging = tier.staging(step)
            replicated = set(self.engine.replicated_files())
            for rank in self.info.ranks_on_node():
                names = [n for n in manifest["files"] if self._owned_by(n, rank, replicated)]
                for name in names:
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src / name, staging / name)
                    self.heartbeat()
                tier.write_part(step, rank, describe_files(staging, names), replicated)
            if self.info.rank == 0:
                tier.commit(step, meta, set(range(self.info.world_size)), self.commit_timeout, self.heartbeat)
                tier.retain()
                self._committed(tier, step, time.perf_counter() - began)
        except (OSError, CheckpointError, StopIteration) as err:
            self.metrics.checkpoint_failed(tier.name)
            log.error("propagating step %d to the %s tier failed: %s", step, tier.name, err)

    def _owned_by(self, name: str, rank: int, replicated: set[str]) -> bool:
        """Which rank's part a file belongs to in a job-wide tier. Replicated files (the
        DDP state, DeepSpeed's model states) are copied once, by rank 0's node."""
        if name in replicated:
            return rank == 0
        return file_rank(name, self.engine) == rank

    def _committed(self, tier: DirTier, step: int, seconds: float) -> None:
        with self._lock:
            self.last_committed[tier.name] = step
        self.metrics.checkpoint_committed(tier.name, step, seconds)

    def close(self) -> None:
        try:
            self.wait()
        except Exception as err:  # noqa: BLE001 - already logged by _guard
            log.debug("pending checkpoint failed at close: %s", err)
        self._pool.shutdown(wait=True)


class NoCheckpoints:
    """Checkpointing off (no tiers): the same interface, no work, so the training loop
    checks nothing (the choice is made once)."""

    last_committed: dict[str, int] = {}

    def bind(self, engine: Engine) -> None:
        return None

    def restore_point(self, strategy: str, sharded: bool, gather: Callable[[Any], list[Any]]) -> None:
        return None

    def prepare(self, barrier: Callable[[], None]) -> None:
        return None

    def due(self, step: int, max_steps: int) -> bool:
        return False

    def save(self, step: int, samples: int, sync: bool = False) -> float:
        return 0.0

    def wait(self) -> None:
        return None

    def newest_local(self) -> None:
        return None

    def close(self) -> None:
        return None
