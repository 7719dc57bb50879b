"""Storing checkpoints into one slower tier (shared filesystem, S3), in the background.

Every rank stores its own files; the node leaders store the replicated state in balanced
shares (node i of N stores the i-th N-th of the file's pieces), so a job-wide copy is
written once per job and each node writes 1/N of it; rank 0 commits the step once every
rank's part is in.

**Which steps.** A tier takes the first checkpoint at or after each multiple of its
``interval_steps``, and only when no rank is still storing the previous one into it (the
trainer's per-step agreement carries every propagator's busy flag), so all ranks store the
same steps and a commit never waits for a part that will not come. A slow tier thus
skips to the newest checkpoint instead of piling up work or memory.

**Failures** degrade the tier (``Health``); the step is retried with backoff unless a
newer one arrives first. A step read from tier 1 is pinned there while it is read, so
tier-1 retention cannot delete it mid-upload.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtrain_store import manifest as mf
from llmtrain_store import shares
from llmtrain_store.pieces import ref_of as piece_ref
from llmtrain_store.sources import FileSource, Source
from llmtrain_store.tier import CheckpointError

from llmtrain_trainer.checkpoint.priority import lower_this_thread

log = logging.getLogger("llmtrain.checkpoint")

RETRY_MIN, RETRY_MAX = 2.0, 60.0
"""Backoff of a degraded tier's retries, seconds."""


def pieces_of(record: dict[str, Any]) -> list[tuple[int, int, str]]:
    if "slices" in record:
        return [(p["offset"], p["size"], p["hash"]) for p in record["slices"]]
    return [(0, record["size"], record["hash"])]


@dataclass
class Saved:
    """One rank's files of one step, to be stored into slower tiers."""

    step: int
    meta: dict[str, Any]
    records: dict[str, dict[str, Any]]
    """This rank's files (name -> record)."""
    memory: dict[str, Source] = field(default_factory=dict)
    """Files served from memory: the RNG state always (it is small, and so a rank never
    waits for its node's tier-1 commit to store it); everything when tier 1 failed. The
    rest is read from tier 1's committed folder."""
    snapshot_held: bool = False
    """``memory`` holds the engine's snapshot (tier 1 failed): the next checkpoint waits
    until every tier had one try at it, so it is not retried."""
    release: Callable[[], None] = lambda: None
    """Called once every tier it was offered to is done with it."""
    _holders: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, count: int) -> None:
        self._holders = count
        if count == 0:
            self.release()

    def done(self) -> None:
        with self._lock:
            self._holders -= 1
            last = self._holders == 0
        if last:
            self.release()


@dataclass(frozen=True)
class Layout:
    """How this rank's files go into a job-wide tier."""

    rank: int
    world_size: int
    node: int
    nodes: int
    replicated: set[str]
    """Files every node holds whole and stores a share of."""
    file_rank: Callable[[str], int | None]
    """The rank a file belongs to; None for a shared file (stored by rank 0 alone unless
    replicated)."""


class Propagator:
    def __init__(self, tier: Any, layout: Layout, local: Any, health: Any, committed: Callable[[str, int, float, int], None],
                 commit_timeout: float, heartbeat: Callable[[], None]):
        """``heartbeat`` feeds the hang watchdog, and only from the training thread (in
        ``flush``): the tier's own thread never beats it, or an upload in progress would
        hide a training loop that hangs."""
        self.tier = tier
        self.layout = layout
        self.local = local
        self.health = health
        self.committed = committed
        self.commit_timeout = commit_timeout
        self.heartbeat = heartbeat
        self._bucket = 0
        self._pending: Saved | None = None
        self._failed_step: int | None = None
        self._retry_at = 0.0
        self._backoff = RETRY_MIN
        self._busy = False
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"ckpt-{tier.name}", daemon=True)

    # ------------------------------------------------------------------ the training thread

    def start(self, restored_step: int) -> None:
        self._bucket = self._bucket_of(restored_step)
        self._thread.start()

    def _bucket_of(self, step: int) -> int:
        interval = getattr(self.tier, "interval_steps", 0) or 0
        return step // interval if interval else step

    def busy(self) -> bool:
        """Storing (or about to store) a step: a new one must not be offered (every rank
        checks the same agreed flag)."""
        with self._cond:
            return self._busy

    def due(self, step: int) -> bool:
        return self._bucket_of(step) > self._bucket

    def claim(self, step: int) -> None:
        """This tier will get ``step`` (delivered when tier 1 has it)."""
        with self._cond:
            self._busy = True
            self._bucket = self._bucket_of(step)

    def deliver(self, saved: Saved) -> None:
        with self._cond:
            self._pending = saved
            self._cond.notify_all()

    def cancel(self) -> None:
        """A claimed step will not come (tier 1 failed and memory could not serve)."""
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until nothing is being stored (a synchronous save); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy or (self._pending is not None and self._failed_step is None):
                if time.monotonic() > deadline:
                    return False
                self._cond.wait(timeout=0.2)
                self.heartbeat()
        return True

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ the tier's thread

    def _next(self) -> Saved | None:
        with self._cond:
            while not self._stop:
                pending = self._pending
                if pending is not None and (pending.step != self._failed_step or time.monotonic() >= self._retry_at):
                    self._pending, self._busy = None, True
                    return pending
                wait = max(0.05, self._retry_at - time.monotonic()) if pending is not None else None
                self._cond.wait(timeout=wait)
            return None

    def _run(self) -> None:
        lower_this_thread()
        while (saved := self._next()) is not None:
            try:
                if self._store(saved):
                    self.health.ok(self.tier.name, saved.step)
                self._failed_step, self._backoff = None, RETRY_MIN
            except Exception as err:  # noqa: BLE001 - degrade, retry later (or with a newer step)
                self.health.failed(self.tier.name, err, retry_in=None if saved.snapshot_held else self._backoff)
                with self._cond:
                    if not saved.snapshot_held and self._pending is None:
                        self._pending, self._failed_step = saved, saved.step
                        self._retry_at = time.monotonic() + self._backoff
                        self._backoff = min(RETRY_MAX, self._backoff * 2)
                    if saved.snapshot_held:
                        log.warning("%s tier: step %d from memory not stored; the next checkpoint tries again",
                                    self.tier.name, saved.step)
            finally:
                if self._pending is not saved:
                    saved.done()
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _store(self, saved: Saved) -> bool:
        """Store this rank's part of ``saved``; False when its tier-1 copy is gone (a
        newer step superseded it before it could be read)."""
        layout, tier = self.layout, self.tier
        began = time.perf_counter()
        pin = None
        sources = dict(saved.memory)
        on_disk = [name for name in saved.records if name not in sources]
        if on_disk:
            folder = self._wait_local(saved.step)
            pin = self.local.pin(saved.step, f"rank-{layout.rank:05d}")
            if pin is None:
                log.info("%s tier: step %d left tier 1 before it was stored; the next one will be", tier.name, saved.step)
                return False
            sources.update({name: FileSource(mf.inside(folder, name)) for name in on_disk})
        try:
            stored = self._put(saved, sources)
        finally:
            if pin is not None:
                pin.unlink(missing_ok=True)
        if layout.rank == 0:
            ranks = set(range(layout.world_size))
            tier.commit(saved.step, saved.meta, ranks, ranks, self.commit_timeout)
            tier.retain()
        self.committed(tier.name, saved.step, time.perf_counter() - began, stored)
        return True

    def _put(self, saved: Saved, sources: dict[str, Source]) -> int:
        if getattr(self.tier, "content_addressed", False):
            return self._put_pieces(saved, sources)
        layout, tier = self.layout, self.tier
        part: dict[str, Any] = {"files": {}, "slices": {}}
        stored = 0
        for name, record in saved.records.items():
            pieces = pieces_of(record)
            if name in layout.replicated:
                run = shares.split(pieces, layout.nodes)[layout.node]
                if run:
                    tier.put_share(saved.step, mf.slice_name(name, layout.node, layout.nodes), sources[name], run)
                    stored += sum(p[1] for p in run)
                part["slices"][name] = {"size": record["size"], "whole": shares.fingerprint(pieces),
                                        "pieces": shares.share_record(name, layout.node, layout.nodes, run)}
            elif layout.file_rank(name) is None and layout.rank != 0:
                continue  # a shared file that is not sliced: rank 0 stores it
            else:
                tier.put_share(saved.step, name, sources[name], pieces)
                part["files"][name] = record
                stored += record["size"]
        tier.write_part(saved.step, layout.rank, part)
        return stored

    def _runs(self, saved: Saved) -> dict[str, list[tuple[int, int, str]]]:
        """The pieces of each file this rank stores: its share of a replicated file, a
        shared file's whole (rank 0), its own files whole."""
        layout = self.layout
        runs = {}
        for name, record in saved.records.items():
            pieces = pieces_of(record)
            if name in layout.replicated:
                runs[name] = shares.split(pieces, layout.nodes)[layout.node]
            elif layout.file_rank(name) is not None or layout.rank == 0:
                runs[name] = pieces
        return runs

    def _put_pieces(self, saved: Saved, sources: dict[str, Source]) -> int:
        """A content-addressed tier: claim every piece this rank will refer to, store the
        ones the tier lacks, and announce the references. Every file goes in as pieces,
        so a replicated file's shares and a rank's own files are alike."""
        tier = self.tier
        runs = self._runs(saved)
        held = tier.claim(saved.step, self.layout.rank,
                          {piece_ref(h, n) for run in runs.values() for _, n, h in run})
        part: dict[str, Any] = {"files": {}, "slices": {}}
        written = 0
        for name, run in runs.items():
            record = saved.records[name]
            stored = tier.put_pieces(sources[name], run, held)
            written += stored.written
            part["slices"][name] = {"size": record["size"], "whole": shares.fingerprint(pieces_of(record)),
                                    "pieces": stored.records}
        tier.write_part(saved.step, self.layout.rank, part)
        return written

    def _wait_local(self, step: int) -> Path:
        """The node leader commits the node's tier-1 copy; the node's other ranks wait."""
        deadline = time.monotonic() + self.commit_timeout
        folder = self.local.final(step)
        while not (folder / mf.COMMITTED).exists():
            if time.monotonic() > deadline:
                raise CheckpointError(f"step {step} never committed in tier 1")
            time.sleep(0.05)
        return folder
