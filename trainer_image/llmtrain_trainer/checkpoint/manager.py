"""Saving checkpoints into the tiers, restoring from them, and keeping each tier healthy.

Save path, per rank:
  1. ``save`` takes a snapshot: the engine's state as of now, without copying it on the
     training path (engine.py), and this rank's RNG state. The loop goes on at once.
  2. The writer thread persists the snapshot to tier 1 (node-local disk): the engine
     files by direct I/O, hashed in pieces as they go out, and the RNG archive; it
     announces this rank's part, and the node leader commits the node's checkpoint.
  3. Each slower tier (shared filesystem, S3) that takes this step gets it from tier 1
     in the background (``propagate.py``): its own cadence and retention, balanced
     shares of the replicated state, a busy tier skipping to the newest step.

A failing tier degrades: the reason is logged and exported (``health.py``), training goes
on, and the tier is retried until it works again. If tier 1 itself fails, the snapshot
is held in memory until every slower tier that takes the step had one try at it. Nothing
already committed is touched.

Only one snapshot is in flight per rank: a checkpoint that falls due while the previous
one is still being written (or held for the slower tiers) is deferred to the first step
after it finished; the ranks agree on that, so they all save the same steps, and the
deferral is counted.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from llmtrain_contract.cadence import SaveCost
from llmtrain_store import manifest as mf
from llmtrain_store.directory import DirTier
from llmtrain_store.fileio import PieceHasher
from llmtrain_store.health import Degraded
from llmtrain_store.owner import Scope, adopted
from llmtrain_store.sources import MemorySource, Source
from llmtrain_store.tier import CheckpointError, Tier, file_record

from llmtrain_trainer.checkpoint.health import Health
from llmtrain_trainer.checkpoint.priority import lower_this_thread
from llmtrain_trainer.checkpoint.propagate import Layout, Propagator, Saved
from llmtrain_trainer.checkpoint.protocol import Checkpointable, FileNaming, Gather, RngState, Snapshot
from llmtrain_trainer.checkpoint.pull import Puller
from llmtrain_trainer.checkpoint.restore import Choice, find_restore_point
from llmtrain_trainer.checkpoint.rngfiles import RngReader, encode_tensor_archive, rng_file
from llmtrain_trainer.state.tensorio import write_small
from llmtrain_trainer.world import DistInfo

log = logging.getLogger("llmtrain.checkpoint")


RESCUE_PARTS_WAIT_SECONDS = 2.0
"""How long a node leader's rescue waits for the node's other ranks' parts: a rank of the
node may be the one that failed, and the rescue commits the parts that came."""


def _noop() -> None:
    return None


def file_rank(name: str, naming: FileNaming) -> int | None:
    """The rank a checkpoint file belongs to; None for files shared by all ranks."""
    if mf.RNG_NAME.fullmatch(name):
        return int(name[9:14])
    return naming.file_rank(name)


class CheckpointManager:
    """Tiered checkpoints of one rank (implements ``protocol.Checkpoints``)."""

    def __init__(self, tiers: list[Tier], info: DistInfo, naming: FileNaming, meta: dict[str, Any], commit_timeout: float,
                 metrics: Any, heartbeat: Callable[[], None]):
        """``naming``: the strategy's engine class (which files it writes, whose each is);
        ``meta``: what every manifest records (config hash, strategy, job)."""
        local = tiers[0]
        if not isinstance(local, DirTier):
            raise ValueError("tier 1 must be a directory (node-local disk)")
        self.local: DirTier = local
        self.tiers = tiers
        self.info = info
        self.naming = naming
        self.meta = meta
        self.commit_timeout = commit_timeout
        self.metrics = metrics
        self.heartbeat = heartbeat
        self.engine: Checkpointable | None = None
        self.health = Health(metrics, [t.name for t in tiers])
        self._puller = Puller(local, info, naming.allowed_names(), self.health, metrics, commit_timeout, heartbeat)
        self._rng = RngReader(tiers, info.rank, naming.allowed_names())
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer", initializer=lower_this_thread)
        self._pending: Future[None] | None = None
        self.last_committed: dict[str, int] = {}
        self.costs: list[SaveCost] = []
        """Each checkpoint committed to tier 1 by this node leader: its stall (a
        synchronous one stalls for its whole latency) and its latency (the adaptive
        cadence's input), in order."""
        self.deferred = 0
        self._last_size = 0
        self._stored_local: int | None = None
        self._lock = threading.Lock()
        self._propagators: list[Propagator] = []
        self._last_saved: tuple[Saved, list[Propagator]] | None = None
        """The newest step committed to tier 1, and the slower tiers it was handed to."""

    # ------------------------------------------------------------------ restore

    def bind(self, engine: Checkpointable) -> None:
        self.engine = engine
        layout = Layout(self.info.rank, self.info.world_size, self.info.node_rank, self.info.num_nodes,
                        engine.replicated_files(), lambda name: file_rank(name, self.naming))
        self._propagators = [Propagator(tier, layout, self.local, self.health, self._committed, self.commit_timeout, self.heartbeat)
                             for tier in self.tiers[1:]]

    def set_data_position(self, wire: dict[str, Any]) -> None:
        self.meta["data"] = wire

    def restore_point(self, sharded: bool, gather: Gather, excluded: frozenset[tuple[str, int]] = frozenset()) -> Choice | None:
        # A node leader verifies (and would pull) its whole node's files; the others only theirs.
        node = list(self.info.ranks_on_node()) if self.info.is_node_leader else [self.info.rank]
        return find_restore_point(self.tiers, self.info.rank, self.info.world_size, node,
                                  self.meta["config_hash"], self.meta["strategy"], sharded, self.naming.allowed_names(),
                                  lambda name: file_rank(name, self.naming), gather, on_error=self.health.failed,
                                  excluded=excluded)

    def localize(self, choice: Choice, timeout: float) -> Path:
        return self._puller.localize(choice, timeout)

    def forget_failed_pulls(self) -> None:
        self._puller.forget_failed()

    def read_rng(self, step: int, name: str, first: Path | None) -> RngState | None:
        return self._rng.read(step, name, first)

    def prepare(self, barrier: Callable[[], None], restored_step: int, lineage: list[str], sweep_shared: bool = True) -> None:
        """Adopt the restored step's ``lineage`` (every manifest written from now on
        records it; clean-up touches only its steps), sweep what a crash left behind,
        before anybody writes again, and start the slower tiers' threads (their cadence
        counts from ``restored_step``). ``sweep_shared`` false: a rank restarted into a job
        that goes on (in-process healing) leaves the shared tiers' staging alone, where its
        peers may be writing."""
        owner = str(self.meta.setdefault("owner", "local"))
        scope = Scope.of(owner, lineage)
        self.meta["lineage"] = adopted(owner, lineage)
        for tier in self.tiers:
            tier.scope = scope
        if self.info.is_node_leader:
            try:
                self.local.root.mkdir(parents=True, exist_ok=True)
                self.local.sweep_staging()
            except OSError as err:
                self.health.failed(self.local.name, err)
        if self.info.rank == 0 and sweep_shared:
            for tier in self.tiers[1:]:
                try:
                    tier.sweep_staging()
                except Exception as err:  # noqa: BLE001 - a degraded tier must not stop training
                    self.health.failed(tier.name, err)
        barrier()
        for propagator in self._propagators:
            propagator.start(restored_step)

    # ------------------------------------------------------------------ save

    def busy(self) -> bool:
        """A snapshot cannot be taken now: the previous one is still being written."""
        pending = self._pending is not None and not self._pending.done()
        return pending or (self.engine is not None and not self.engine.snapshot_free())

    def writing(self) -> bool:
        """This rank is writing a checkpoint in the background: into tier 1, or into a
        slower tier. Either takes CPU, memory bandwidth and the GIL from the steps."""
        if self._pending is not None and not self._pending.done():
            return True
        return any(p.busy() for p in self._propagators)

    def tiers_busy(self) -> list[bool]:
        """Per slower tier: this rank is still storing a step into it."""
        return [p.busy() for p in self._propagators]

    def defer(self) -> None:
        self.deferred += 1
        self.metrics.checkpoint_deferred()

    def wait(self) -> None:
        """Block until the previous save is persisted in tier 1 (propagation goes on)."""
        if self._pending is not None:
            try:
                self._pending.result()
            finally:
                self._pending = None

    def wait_free(self) -> bool:
        """Block (feeding the hang watchdog: this is the training thread waiting on a
        checkpoint, not a hang) until a new snapshot can be taken. False when that takes
        longer than the commit timeout."""
        deadline = time.monotonic() + self.commit_timeout
        while self.busy():
            if time.monotonic() >= deadline:
                return False
            if self._pending is not None:
                try:
                    self._pending.result(timeout=0.2)
                except TimeoutError:
                    pass
                except Exception:  # noqa: BLE001 - _guard logs the failure; the write is over
                    pass
            else:
                time.sleep(0.05)
            self.heartbeat()
        self._pending = None
        return True

    def flush(self) -> bool:
        """Block until the previous save is in tier 1 and every slower tier has stored what
        it took; False when a slower tier did not finish within twice the commit timeout."""
        self.wait()
        return all(propagator.flush(self.commit_timeout * 2) for propagator in self._propagators)

    def can_complete(self, step: int) -> bool:
        """Whether ``step`` is this rank's last save and tier 1 committed it (``complete``
        has its files to give)."""
        return self._last_saved is not None and self._last_saved[0].step == step

    def complete(self, step: int) -> bool:
        """Make every slower tier hold ``step``, this rank's last save (a script's final
        checkpoint of the step its loop saved last): a tier that skipped it, still busy
        with an older step, gets it from tier 1 now; blocks until stored. A step is never
        saved twice (tier 1 would commit it again). Every rank calls it: the tiers that
        skipped the step are the same on every rank (their choice was agreed), once every
        rank ``can_complete``. False when ``step`` is not the last save committed to tier 1,
        or a tier did not finish (one that failed is degraded and logged: done)."""
        if not self.flush() or not self.can_complete(step):
            return False
        assert self._last_saved is not None  # can_complete
        saved, took = self._last_saved
        missing = [p for p in self._propagators if p not in took]
        for propagator in missing:
            propagator.claim(step)
        again = Saved(step, saved.meta, saved.records, memory=saved.memory)
        again.hold(len(missing))
        for propagator in missing:
            propagator.deliver(again)
        self._last_saved = (saved, took + missing)
        return all(propagator.flush(self.commit_timeout * 2) for propagator in missing)

    def save(self, step: int, samples: int, rng_state: RngState, tiers_busy: list[bool] | None = None,
             sync: bool = False) -> float:
        """Checkpoint the state after optimizer step ``step``, with ``rng_state`` (every
        generator as of that step's end). ``tiers_busy``: per slower tier, whether any
        rank is still storing into it (agreed by all ranks). Returns the seconds the
        caller was blocked: the snapshot (no copy), or the whole save when
        synchronous (the final checkpoint, the emergency one after SIGTERM), which also
        stores into every slower tier before it returns."""
        started = time.perf_counter()
        if sync:
            self.wait()
            for propagator in self._propagators:
                propagator.flush(self.commit_timeout)
            targets = list(self._propagators)
        else:
            busy = tiers_busy or [False] * len(self._propagators)
            targets = [p for p, b in zip(self._propagators, busy) if not b and p.due(step)]
        for propagator in targets:
            propagator.claim(step)
        meta = {**self.meta, "samples_consumed": samples, "world_size": self.info.world_size,
                "local_world_size": self.info.local_world_size, "time": time.time()}
        snap = self.engine.snapshot() if self.engine is not None else None
        blocked = time.perf_counter() - started
        heartbeat = self.heartbeat if sync else _noop
        job = lambda: self._persist(step, meta, snap, rng_state, started, None if sync else blocked, targets, heartbeat)  # noqa: E731
        if sync:
            job()
            for propagator in targets:
                if not propagator.flush(self.commit_timeout * 2):
                    log.error("%s tier: step %d not stored within %.0fs", propagator.tier.name, step, self.commit_timeout * 2)
        else:
            self._pending = self._writer.submit(self._guard, job, step)
        self.metrics.checkpoint_stall(blocked)
        return time.perf_counter() - started if sync else blocked

    def rescue(self, step: int, samples: int, updates: int, rng_state: RngState, deadline: float) -> str | None:
        """A rescue checkpoint: ``step``'s state, saved into tier 1 only, synchronously,
        after a peer failed (a collective raised, or the supervisor judged this rank a
        victim). ``updates``: the engine's optimizer steps at ``step`` (the state must not
        have moved past it); ``rng_state``: the generators as they were at ``step``'s end;
        ``deadline``: ``time.monotonic()`` by which it must be done. Returns None when
        saved, else why not (no exception: the rank is failing already)."""
        if self.engine is None:
            return "no engine yet"
        if self._pending is not None:  # the periodic write in flight uses the snapshot memory
            try:
                self._pending.result(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return "the write of an earlier checkpoint did not finish within the budget"
            except Exception:  # noqa: BLE001 - _guard logged it; the memory is free again
                pass
            self._pending = None
        snap = self.engine.rescue_snapshot(updates)
        if snap is None and self.info.is_node_leader:
            return "the engine's state cannot be saved from here (sharded, on a device, or past the step)"
        meta = {**self.meta, "samples_consumed": samples, "world_size": self.info.world_size,
                "local_world_size": self.info.local_world_size, "time": time.time(), "rescue": True}
        try:
            self._persist(step, meta, snap, rng_state, time.perf_counter(), None, [], _noop, rescue_deadline=deadline)
        except Exception as err:  # noqa: BLE001 - a failing rank reports, it does not raise again
            return str(err)
        return None

    def newest_saved(self) -> int | None:
        """The newest step this rank stored into tier 1 (its part, or its node's commit)."""
        with self._lock:
            steps = [s for s in (self._stored_local, self.last_committed.get(self.local.name)) if s is not None]
        return max(steps) if steps else None

    def _guard(self, job: Callable[[], None], step: int) -> None:
        try:
            job()
        except Exception as err:  # noqa: BLE001 - a tier failure degrades, it never kills training
            log.error("checkpoint of step %d failed: %s", step, err)

    def _persist(self, step: int, meta: dict[str, Any], snap: Snapshot | None, rng_state: RngState,
                 started: float, blocked: float | None, targets: list[Propagator], heartbeat: Callable[[], None],
                 rescue_deadline: float | None = None) -> None:
        """Write this rank's files into tier 1, then hand the step to ``targets``. If tier
        1 fails, the snapshot goes to ``targets`` from memory; without any, the error is
        raised (the checkpoint exists nowhere). A rescue (``rescue_deadline``) commits the
        node's parts that arrived by then, and is not a sample of the cadence's cost."""
        local = self.local
        records: dict[str, dict[str, Any]] = {}
        began = time.perf_counter()
        try:
            if self.info.is_node_leader and self._last_size:
                local.make_room(self._last_size)
            staging = local.staging(step)
            if snap is not None:
                records.update(snap.write(staging))
            (staging / "rng").mkdir(exist_ok=True)
            rng_bytes = encode_tensor_archive(*rng_state)
            size, pieces = write_small(staging / rng_file(self.info.rank), rng_bytes)
            records[rng_file(self.info.rank)] = file_record(rng_file(self.info.rank), size, pieces)
            local.write_part(step, self.info.rank, {"files": records})
            if not self.info.is_node_leader:
                with self._lock:
                    self._stored_local = step  # the node leader commits it (or reports failure)
            else:
                node = set(self.info.ranks_on_node())
                if rescue_deadline is not None:
                    node = self._rescue_parts(step, node, min(rescue_deadline, time.monotonic() + RESCUE_PARTS_WAIT_SECONDS))
                committed = local.commit(step, meta, node, node, self.commit_timeout, heartbeat)
                local.retain()
                self._last_size = sum(f["size"] for f in committed.manifest["files"].values())
                with self._lock:
                    self._stored_local = step
                self._committed(local.name, step, time.perf_counter() - began, sum(r["size"] for r in records.values()))
                latency = time.perf_counter() - started
                if rescue_deadline is None:
                    self.costs.append(SaveCost(latency if blocked is None else blocked, latency))
                log.debug("checkpoint step %d committed to %s (%s)", step, local.name, committed.location)
            self.health.ok(local.name, step)
        except (OSError, CheckpointError, RuntimeError) as err:
            degraded = self.health.failed(local.name, err)
            if self.info.is_node_leader:  # free what the failed write left, for the next try
                shutil.rmtree(local.staging_path(step), ignore_errors=True)
            if not targets:
                if snap is not None:
                    snap.release()
                raise CheckpointError(f"{local.name} tier: {degraded.message}") from err
            self._from_memory(step, meta, snap, rng_state, targets)
            return
        if snap is not None:
            snap.release()
        saved = Saved(step, meta, records, memory={rng_file(self.info.rank): MemorySource([rng_bytes])})
        self._last_saved = (saved, list(targets))
        saved.hold(len(targets))
        for propagator in targets:
            propagator.deliver(saved)

    def _from_memory(self, step: int, meta: dict[str, Any], snap: Snapshot | None, rng_state: RngState,
                     targets: list[Propagator]) -> None:
        """Tier 1 failed: the slower tiers get this rank's files straight from the
        snapshot, which stays held (the next checkpoint waits) until each had one try."""
        try:
            images: dict[str, Source] = dict(snap.images()) if snap is not None else {}
            images[rng_file(self.info.rank)] = MemorySource([encode_tensor_archive(*rng_state)])
            records = {}
            for name, source in images.items():
                hasher = PieceHasher(mf.piece_size(source.size))
                for start in range(0, source.size, 32 << 20):
                    hasher.update(source.read(start, min(32 << 20, source.size - start)))
                records[name] = file_record(name, source.size, hasher.finish())
        except Exception:
            if snap is not None:
                snap.release()
            for propagator in targets:
                propagator.cancel()
            raise
        saved = Saved(step, meta, records, memory=images, snapshot_held=snap is not None,
                      release=snap.release if snap is not None else _noop)
        saved.hold(len(targets))
        for propagator in targets:
            propagator.deliver(saved)

    def _rescue_parts(self, step: int, node: set[int], until: float) -> set[int]:
        """The node's ranks whose parts of ``step`` are in tier 1 by ``until`` (this
        rank's always is: it wrote it)."""
        parts = self.local.staging(step) / "parts"
        while True:
            present = {int(p.stem.split("-")[1]) for p in parts.glob("rank-*.json")}
            if present >= node or time.monotonic() >= until:
                return (present & node) | {self.info.rank}
            time.sleep(0.02)

    def _committed(self, tier: str, step: int, seconds: float, size: int) -> None:
        with self._lock:
            self.last_committed[tier] = step
        self.metrics.checkpoint_committed(tier, step, seconds, size)

    def newest_local(self) -> int | None:
        return self.last_committed.get(self.local.name)

    def durable(self, step: int) -> tuple[bool, bool]:
        """(this rank's files of ``step`` are committed in tier 1, a job-wide tier
        committed ``step``: known to rank 0 only)."""
        with self._lock:
            local = self._stored_local == step
            shared = any(self.last_committed.get(t.name) == step for t in self.tiers[1:])
        return local, shared

    def degraded(self) -> dict[str, Degraded]:
        """Tier -> why it is degraded, for the tiers that are."""
        return {t.name: d for t in self.tiers if (d := self.health.of(t.name)) is not None}

    def close(self) -> None:
        try:
            self.wait()
        except Exception as err:  # noqa: BLE001 - already logged by _guard
            log.debug("pending checkpoint failed at close: %s", err)
        self._writer.shutdown(wait=True)
        for propagator in self._propagators:
            propagator.stop()
