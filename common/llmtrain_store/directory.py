"""Checkpoint tiers backed by a directory: node-local disk (tier 1) or a shared
filesystem mount (tier 2). Both implement ``tier.Tier``, as the S3 tier (``s3.py``) does.

Layout of one tier::

    <root>/step-00000120/           a committed checkpoint (renamed into place atomically)
        manifest.json               step, world size, ranks covered, files (size, hash, slices)
        COMMITTED                   the manifest's hash; written last
        state.llmt | ds/...         engine files (or, in a job-wide tier, their slices)
        rng/rank-00000.llmt         per-rank RNG states
    <root>/.staging-00000120.<owner>/   being written (keyed by the writer's owner
                                    token, ``owner.py``); ignored by readers, swept on start
        parts/rank-00000.json       one writer's files, written when that writer is done
    <root>/.pins/step-00000120.rank-00001   a reader (an upload to a slower tier) holds
                                    that step: retention leaves it until it is done

A content-addressed tier (``content_addressed``: the shared filesystem tier) keeps each
piece once (``pieces.py``): its step folders hold the manifest and ``COMMITTED`` only::

    <root>/pieces/<hash>-<size>[.zst]   a piece, shared by every step that holds it
    <root>/.staging-.../claims/rank-00000.json   the pieces a writer will refer to
    <root>/.collecting/<token>          a piece collection in progress

Several writers (the ranks of a node, or the nodes of a job for a shared tier) fill one
staging folder; each announces its files with a part record; a single committer waits
for every expected part, writes the manifest and COMMITTED, and renames the folder. A
reader trusts a folder only if COMMITTED matches the manifest; and it reads a file only
after the file's name passed the manifest checks and its bytes matched their hash.

A root may hold steps of other runs (a re-created job, a shared subPath): retention,
room-making and sweeping touch only the steps of ``scope``'s lineage (``owner.py``).
"""

from __future__ import annotations

import builtins
import errno
import json
import logging
import os
import re
import shutil
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import manifest as mf
from . import pieces, piecestore
from .fileio import HASH, Hasher, fsync_dir, fsync_file, hash_file, iter_file
from .sources import Source, iter_range
from .health import absent
from .owner import Scope, mine, my_token
from .tier import (CheckpointError, Committed, StepUnreadable, allocate, digest_bytes, finish_fetch, merge_parts, new_manifest,
                   wait_for_parts, write_json_durably)


log = logging.getLogger("llmtrain.checkpoint")
PINS_DIR = ".pins"
DELETING_PREFIX = ".deleting-"
COLLECTING_DIR = ".collecting"
CLAIMS_DIR = "claims"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class DirTier(piecestore.PieceTier):
    """One directory-backed tier."""

    name: str
    root: Path
    keep: int = 2
    interval_steps: int = 0
    """Least number of steps between two checkpoints in this tier (0: every one)."""
    scope: Scope | None = None
    """The run writing this tier (set once its restore is agreed): clean-up touches only
    its lineage's steps. None (a tool acting by hand): every step."""
    content_addressed: bool = False
    """Store pieces by content, once for every step that holds them (``pieces.py``)."""
    _verified: dict[tuple[int, tuple[str, ...]], str | None] = field(default_factory=dict, repr=False)

    kind = "dir"

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    # ------------------------------------------------------------------ writing

    def staging(self, step: int) -> Path:
        folder = self.staging_path(step)
        (folder / "parts").mkdir(parents=True, exist_ok=True)
        return folder

    def staging_path(self, step: int) -> Path:
        """Where ``step`` is staged, without creating it (a cleanup on a read-only or full
        filesystem must not fail the way the write did)."""
        return self.root / mf.staging_dir(step, self.scope.token if self.scope else None)

    def final(self, step: int) -> Path:
        return self.root / mf.step_dir(step)

    def write_part(self, step: int, writer: int, part: dict[str, Any]) -> None:
        """Announce that ``writer``'s files (and slices) of ``step`` are durable in the
        staging folder: ``{"files": {name: {size, hash}}, "slices": {name: {size, pieces}}}``."""
        write_json_durably(self.staging(step) / "parts" / f"rank-{writer:05d}.json", part)

    def put_share(self, step: int, name: str, source: Source, pieces: list[tuple[int, int, str]],
                  heartbeat: Callable[[], None] = lambda: None) -> None:
        """Store the contiguous ``pieces`` (offset, size, hash) of ``source`` in the
        staging folder as ``name``, hashing them as they are read; raises CheckpointError
        when a piece does not match its hash."""
        target = mf.inside(self.staging(step), name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as out:
            for offset, size, expected in pieces:
                hasher = Hasher()
                for block in iter_range(source, offset, size):
                    hasher.update(block)
                    out.write(block)
                    heartbeat()
                if hasher.hexdigest() != expected:
                    raise CheckpointError(f"{self.name} tier: {name} of step {step}: the source does not match its hash at byte {offset}")
            out.flush()
            os.fsync(out.fileno())

    # ------------------------------------------------------------------ pieces (content_addressed)

    def piece_objects(self) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            with os.scandir(self.root / pieces.PIECES_DIR) as listing:
                for entry in listing:
                    if entry.is_file(follow_symlinks=False):
                        out[entry.name] = entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            pass
        return out

    def piece_put(self, obj: str, data: bytes) -> None:
        folder = self.root / pieces.PIECES_DIR
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{secrets.token_hex(8)}"  # unique across nodes (pids repeat in containers)
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(folder / obj)
        fsync_dir(folder)

    def piece_get(self, obj: str) -> bytes:
        return mf.inside(self.root, f"{pieces.PIECES_DIR}/{obj}").read_bytes()

    def piece_delete(self, obj: str) -> None:
        (self.root / pieces.PIECES_DIR / obj).unlink(missing_ok=True)

    def claims(self) -> builtins.list[Any]:
        out = []
        for path in self.root.glob(f"{mf.STAGING_PREFIX}*/{CLAIMS_DIR}/*.json"):
            try:
                out.append(json.loads(path.read_bytes()))
            except FileNotFoundError:
                continue  # committed or swept meanwhile: its manifest (if any) is read next
            except (OSError, ValueError) as err:
                raise CheckpointError(f"{self.name} tier: claim {path.name} cannot be read ({err}); no piece is collected") from err
        return out

    def claim_put(self, step: int, writer: int, record: dict[str, Any]) -> None:
        folder = self.staging(step) / CLAIMS_DIR
        folder.mkdir(exist_ok=True)
        write_json_durably(folder / f"rank-{writer:05d}.json", record)
        fsync_dir(folder)

    def markers(self) -> builtins.list[str]:
        folder = self.root / COLLECTING_DIR
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def marker_put(self, token: str) -> None:
        folder = self.root / COLLECTING_DIR
        folder.mkdir(parents=True, exist_ok=True)
        (folder / token).write_text(str(os.getpid()))
        fsync_dir(folder)

    def marker_drop(self, token: str) -> None:
        (self.root / COLLECTING_DIR / token).unlink(missing_ok=True)

    # ------------------------------------------------------------------ committing

    def commit(self, step: int, meta: dict[str, Any], expected: set[int], ranks: set[int], timeout: float,
               heartbeat: Callable[[], None] = lambda: None) -> Committed:
        """Wait for every expected writer's part, then write the manifest and COMMITTED and
        rename the staging folder into place. Only one process per tier calls this.
        ``ranks``: the ranks whose state the checkpoint covers."""
        folder, manifest = self._seal(step, meta, expected, ranks, timeout, heartbeat)
        final = self.final(step)
        if final.exists():  # re-saving a step after a restore: replace the old copy
            shutil.rmtree(final)
        folder.replace(final)
        return self._placed(step, manifest)

    def commit_unless_present(self, step: int, meta: dict[str, Any], expected: set[int], ranks: set[int],
                              timeout: float) -> Committed | None:
        """``commit``, except that a committed copy of ``step`` already there stays (the
        staged one is dropped, None returned): for a writer racing another over one step
        (a prefetch and a rank's pull), so that no copy is removed under a reader."""
        folder, manifest = self._seal(step, meta, expected, ranks, timeout, lambda: None)
        try:
            os.rename(folder, self.final(step))  # fails on a non-empty folder: no clobbering
        except OSError as err:
            shutil.rmtree(folder, ignore_errors=True)
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST) and (self.final(step) / mf.COMMITTED).exists():
                return None
            raise CheckpointError(f"{self.name} tier: step {step} could not be put in place ({err})") from err
        return self._placed(step, manifest)

    def _seal(self, step: int, meta: dict[str, Any], expected: set[int], ranks: set[int], timeout: float,
              heartbeat: Callable[[], None]) -> tuple[Path, dict[str, Any]]:
        """The staging folder made whole: every part in, the manifest and COMMITTED written."""
        folder = self.staging(step)
        parts_dir = folder / "parts"
        wait_for_parts(self.name, step, expected, lambda: {int(p.stem.split("-")[1]) for p in parts_dir.glob("rank-*.json")},
                       timeout, heartbeat, poll=0.02)
        parts = [json.loads((parts_dir / f"rank-{w:05d}.json").read_text()) for w in sorted(expected)]
        manifest = new_manifest(step, meta, ranks, merge_parts(parts))
        text = write_json_durably(folder / mf.MANIFEST, manifest)
        shutil.rmtree(parts_dir, ignore_errors=True)
        (folder / mf.COMMITTED).write_text(digest_bytes(text) + "\n")
        fsync_file(folder / mf.COMMITTED)
        return folder, manifest

    def _placed(self, step: int, manifest: dict[str, Any]) -> Committed:
        final = self.final(step)
        fsync_dir(self.root)
        # The manifest holds the pieces now; the claims held them until it did.
        shutil.rmtree(final / CLAIMS_DIR, ignore_errors=True)
        self._verified = {k: v for k, v in self._verified.items() if k[0] != step}
        return Committed(self, step, str(final), manifest)

    def retain(self, keep: int | None = None) -> list[int]:
        """Delete committed checkpoints beyond ``keep`` (default: the tier's), oldest
        first, except those a reader has pinned (they go on a later call). Returns the
        steps deleted. Staging folders of steps older than the newest commit are swept too.
        Only ``scope``'s steps and staging folders count or go."""
        try:
            listed = self.list()
        except StepUnreadable as err:  # counted among the readable steps only, never deleted
            log.warning("%s: retention keeps it and counts the readable steps", err)
            listed = err.listed
        steps = sorted(c.step for c in listed if mine(self.scope, c.manifest))
        excess = steps[: max(0, len(steps) - (self.keep if keep is None else keep))]
        doomed = [step for step in excess if not self._pinned(step)]
        for step in doomed:
            self.delete(step)
        if steps:
            for stale in self.root.glob(mf.STAGING_PREFIX + "*"):
                staged = mf.staged(stale.name)
                if staged is not None and staged[0] < steps[-1] and my_token(self.scope, staged[1]):
                    shutil.rmtree(stale, ignore_errors=True)
        self.collect()
        return doomed

    def make_room(self, need: int) -> list[int]:
        """Before writing a checkpoint of about ``need`` bytes: when the filesystem has
        less free space, delete committed checkpoints older than the newest one (oldest
        first) until it fits. A tier that cannot hold ``keep`` + 1 checkpoints keeps
        fewer, instead of failing every later checkpoint; the newest committed one is
        never deleted for room, nor another run's step (``scope``). Returns the steps
        deleted."""
        deleted: list[int] = []
        while shutil.disk_usage(self.root).free < need:
            try:
                listed = self.list()
            except StepUnreadable as err:  # room is made from the readable steps only
                listed = err.listed
            older = sorted(c.step for c in listed if mine(self.scope, c.manifest))[:-1]
            older = [s for s in older if not self._pinned(s)]
            if not older:
                break
            self.delete(older[0])
            deleted.append(older[0])
            self.collect()  # a content-addressed step frees its space only with its pieces
        return deleted

    def delete(self, step: int) -> None:
        """Remove a committed step: renamed out of the listing first (atomic), then removed."""
        final = self.final(step)
        doomed = self.root / f"{DELETING_PREFIX}{mf.step_dir(step)}"
        try:
            final.replace(doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def sweep_staging(self) -> None:
        """Remove staging and half-deleted folders left by a crash. Called before the
        first save. Another run's staging folders stay (it may be writing them); a
        half-deleted folder is out of every listing, whoever began deleting it."""
        stale = [p for p in self.root.glob(mf.STAGING_PREFIX + "*")
                 if (staged := mf.staged(p.name)) is not None and my_token(self.scope, staged[1])]
        for folder in [*stale, *self.root.glob(DELETING_PREFIX + "*")]:
            shutil.rmtree(folder, ignore_errors=True)
        # A piece's temporary file left by a writer that died mid-write (any run's: one
        # an hour old is no write in progress).
        for tmp in (self.root / pieces.PIECES_DIR).glob(".tmp-*"):
            try:
                if time.time() - tmp.stat().st_mtime > 3600:
                    tmp.unlink()
            except OSError:
                continue

    # ------------------------------------------------------------------ pins

    def pin(self, step: int, owner: str) -> Path | None:
        """Keep ``step`` from retention while ``owner`` (a process of this node) reads it,
        e.g. to upload it to a slower tier. None when the step is gone already. A pin of a
        process that no longer runs is ignored (and removed)."""
        pins = self.root / PINS_DIR
        pins.mkdir(parents=True, exist_ok=True)
        marker = pins / f"{mf.step_dir(step)}.{owner}"
        marker.write_text(str(os.getpid()))
        if not (self.final(step) / mf.COMMITTED).exists():
            marker.unlink(missing_ok=True)
            return None
        return marker

    def _pinned(self, step: int) -> bool:
        for marker in (self.root / PINS_DIR).glob(f"{mf.step_dir(step)}.*"):
            try:
                pid = int(marker.read_text())
            except (OSError, ValueError):
                continue
            if _alive(pid):
                return True
            marker.unlink(missing_ok=True)
        return False

    # ------------------------------------------------------------------ reading

    def list(self) -> list[Committed]:
        """Committed checkpoints whose COMMITTED marker matches the manifest, newest first.
        A folder without them (not committed, being deleted), with a marker that does not
        match, or a symlink is left out; one that cannot be read for another reason (EIO,
        ESTALE, EACCES) raises StepUnreadable (``tier.py``): a listing without it could
        make a job start over beside its committed progress."""
        out: list[Committed] = []
        if not self.root.is_dir():
            return out
        unreadable: list[tuple[int | None, BaseException]] = []
        for folder in self.root.glob(mf.STEP_PREFIX + "*"):
            try:
                if folder.is_symlink() or (folder / mf.MANIFEST).is_symlink():
                    continue
                text = (folder / mf.MANIFEST).read_bytes()
                marker = (folder / mf.COMMITTED).read_bytes()
            except OSError as err:
                if not absent(err):
                    unreadable.append((mf.step_of(folder.name), err))
                continue
            if marker.decode(errors="replace").strip() != digest_bytes(text):
                continue
            try:
                manifest = json.loads(text)
                out.append(Committed(self, int(manifest["step"]), str(folder), manifest))
            except (ValueError, KeyError, TypeError):
                continue
        listed = sorted(out, key=lambda c: c.step, reverse=True)
        if unreadable:
            raise StepUnreadable(self.name, [s for s, _ in unreadable], unreadable[0][1], listed) from unreadable[0][1]
        return listed

    def verify(self, committed: Committed, names: builtins.list[str] | None, allowed: re.Pattern[str]) -> str | None:
        """None if the named files (default: all) are safe to read and match the manifest
        byte for byte; else why not. Cached per step and names (hashing is not free)."""
        key = (committed.step, tuple(names) if names is not None else ())
        if key not in self._verified:
            self._verified[key] = self._verify(committed, names, allowed)
        return self._verified[key]

    def _verify(self, committed: Committed, names: builtins.list[str] | None, allowed: re.Pattern[str]) -> str | None:
        try:
            files = mf.entries(committed.manifest, allowed)
            folder = Path(committed.location)
            for name in names if names is not None else list(files):
                if name not in files:
                    return f"{name} is not in the manifest"
                entry = files[name]
                for stored, (expected, exact) in entry.stored_sizes().items():
                    try:
                        size = mf.inside(folder, stored).stat().st_size
                    except OSError:
                        return f"{stored} is missing"
                    if size != expected if exact else size < expected:
                        return f"{stored} has {size} bytes, the manifest says {'' if exact else 'at least '}{expected}"
                for piece in entry.pieces:
                    if piece.ref is not None:
                        try:
                            piecestore.read(self, piece)
                        except CheckpointError as err:
                            return str(err)
                    elif hash_file(mf.inside(folder, piece.name), piece.at, piece.size)[1] != piece.hash:
                        return f"{piece.name} fails its {HASH} check at bytes {piece.at}..{piece.at + piece.size}"
        except mf.ManifestRejected as err:
            return f"manifest rejected: {err}"
        return None

    def path(self, committed: Committed, name: str) -> Path:
        """Where a whole (not sliced) file of a checkpoint is, to read it in place."""
        return mf.inside(Path(committed.location), name)

    def fetch(self, committed: Committed, names: builtins.list[str], dest: Path, allowed: re.Pattern[str],
              heartbeat: Callable[[], None] = lambda: None, workers: int = 4,
              optional: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
        """Copy the named files (slices reassembled) into ``dest``, in parallel, hashing
        every piece as it is copied; returns their records ``{name: {size, hash}}``.
        Raises CheckpointError when a piece does not match the manifest, except for the
        ``optional`` files, which are left out instead (``dropped``)."""
        files = mf.entries(committed.manifest, allowed)
        folder = Path(committed.location)
        jobs = []
        shared: dict[str, list[tuple[Path, str, mf.Piece]]] = {}
        for name in names:
            entry = files[name]
            target = allocate(dest, name, entry.size)
            for piece in entry.pieces:
                if piece.ref is None:
                    jobs.append((target, name, piece))
                else:  # read once, however many places hold it
                    shared.setdefault(piece.name, []).append((target, name, piece))

        def copy(job: tuple[Path, str, mf.Piece]) -> str | None:
            target, name, piece = job
            hasher, done = Hasher(), 0
            try:
                source = mf.inside(folder, piece.name)
                fd = os.open(target, os.O_WRONLY)
                try:
                    for block in iter_file(source, piece.at, piece.size):
                        hasher.update(block)
                        os.pwrite(fd, block, piece.offset + done)
                        done += len(block)
                        heartbeat()
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except (OSError, mf.ManifestRejected) as err:
                return f"{self.name} tier: {piece.name} of step {committed.step} cannot be read ({err})"
            if done != piece.size or hasher.hexdigest() != piece.hash:
                return f"{self.name} tier: {piece.name} of step {committed.step} does not match its manifest"
            return None

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-fetch") as pool:
            failed = {job[1]: why for job, why in zip(jobs, pool.map(copy, jobs)) if why is not None}
        failed.update(piecestore.place_all(self, shared, committed.step, workers, heartbeat))
        return finish_fetch(files, names, dest, failed, optional)


