"""Storing, reading and collecting content-addressed pieces (``pieces.py`` has the rules
and the protocol's argument): the steps that the directory and S3 tiers share, over the
few object operations each implements (``Objects``)."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

from . import manifest as mf
from . import pieces
from .fileio import HASH, Hasher, fsync_file
from .sources import Source, iter_range
from .tier import CheckpointError, StepUnreadable

log = logging.getLogger("llmtrain.checkpoint")


class Objects(Protocol):
    """What a tier gives the piece store."""

    name: str

    def piece_objects(self) -> dict[str, int]:
        """Every object in the pieces folder -> its size."""
        ...

    def piece_put(self, obj: str, data: bytes) -> None:
        """Store ``obj`` whole and atomically (a reader never sees a part of it)."""
        ...

    def piece_get(self, obj: str) -> bytes:
        """An object of the pieces folder (named relative to it), whole."""
        ...

    def piece_delete(self, obj: str) -> None:
        ...

    def claims(self) -> list[Any]:
        """Every claim record of every write in progress, of any run."""
        ...

    def claim_put(self, step: int, writer: int, record: dict[str, Any]) -> None:
        ...

    def markers(self) -> list[str]:
        """The collections in progress."""
        ...

    def marker_put(self, token: str) -> None:
        ...

    def marker_drop(self, token: str) -> None:
        ...

    def list(self) -> Any:
        ...


@dataclass
class Written:
    """What storing a file's pieces did."""

    records: list[dict[str, Any]] = field(default_factory=list)
    """The manifest's references, in order."""
    written: int = 0
    """Bytes sent to the tier (compressed where a piece was)."""
    reused: int = 0
    """Bytes of pieces the tier already held."""


Held = dict[str, tuple[str | None, int]]
"""The pieces a tier holds: reference -> (codec, stored size)."""


def settle(tier: Objects, step: int, writer: int, refs: set[str], poll: float = 0.2) -> Held:
    """Claim ``refs`` for ``writer``'s part of ``step``, wait out a collection in
    progress, and return the pieces the tier holds now (which no collection can delete
    while the claim stands; ``pieces.py`` has the argument)."""
    tier.claim_put(step, writer, pieces.claim_record(refs))
    # Only a collection marked before the claim was read may have missed it; one that
    # marks itself later reads the claim.
    running = set(tier.markers())
    deadline = time.monotonic() + pieces.WAIT
    while running and time.monotonic() < deadline:
        time.sleep(poll)
        running &= set(tier.markers())
    for token in running:
        # Still there after the wait: a collection that died (it deletes nothing after
        # its window, which ended during the wait).
        log.warning("%s tier: removing the marker of a piece collection that did not finish", tier.name)
        tier.marker_drop(token)
    return held_of(tier.piece_objects())


def held_of(objects: dict[str, int]) -> Held:
    """The pieces ``objects`` hold. A raw object whose size is not its piece's (truncated,
    say) is not taken as held: it is written again, not shared by every later step."""
    held: Held = {}
    for obj, size in objects.items():
        ref = pieces.ref_of_object(obj)
        if ref is None:
            continue
        codec = pieces.CODEC if obj.endswith(pieces.SUFFIX[pieces.CODEC]) else None
        if codec is None and size != int(ref.rsplit("-", 1)[1]):
            continue
        held.setdefault(ref, (codec, size))
    return held


WORKERS = 4
"""Pieces stored at once (an S3 tier: its ``concurrency``, 8 by default): S3 requests and
fsyncs overlap, and hashing and zstd release the GIL. At most this many pieces (64 MiB
each at most, twice when compressed) are in memory."""


def store(tier: Objects, source: Source, run: list[tuple[int, int, str]], held: Held,
          heartbeat: Callable[[], None] = lambda: None) -> Written:
    """Store the pieces (offset, size, hash) of ``source`` the tier does not hold yet,
    ``WORKERS`` at a time, hashing each as it is read (CheckpointError when one does not
    match); the records that refer to all of them. ``held`` (from ``settle``) gains what
    is stored."""
    out = Written()
    run = [p for p in run if p[1] > 0]  # an empty file has no piece (its record: no slices)
    missing: dict[str, tuple[int, int, str]] = {}
    for offset, size, digest in run:
        ref = pieces.ref_of(digest, size)
        if ref in held:
            out.reused += size
        else:
            missing.setdefault(ref, (offset, size, digest))

    def put(piece: tuple[int, int, str]) -> tuple[str | None, int]:
        offset, size, digest = piece
        data = b"".join(iter_range(source, offset, size))
        hasher = Hasher()
        hasher.update(data)
        if len(data) != size or hasher.hexdigest() != digest:
            raise CheckpointError(f"{tier.name} tier: the source does not match its hash at byte {offset}")
        blob, codec = pieces.encode(data)
        tier.piece_put(pieces.object_name(pieces.ref_of(digest, size), codec), blob)
        heartbeat()
        return codec, len(blob)

    workers = max(WORKERS, int(getattr(tier, "concurrency", WORKERS)))  # an S3 tier's parallel requests
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-pieces") as pool:
        for ref, stored in zip(missing, pool.map(put, missing.values())):
            held[ref] = stored
            out.written += stored[1]
    for offset, size, digest in run:
        ref = pieces.ref_of(digest, size)
        out.records.append(_record(ref, offset, size, digest, *held[ref]))
    return out


def _record(ref: str, offset: int, size: int, digest: str, codec: str | None, stored: int) -> dict[str, Any]:
    record: dict[str, Any] = {"ref": ref, "offset": offset, "size": size, "hash": digest}
    if codec is not None:
        record.update(codec=codec, stored=stored)
    return record


def read(tier: Objects, piece: mf.Piece) -> bytes:
    """A content-addressed piece's bytes, decompressed and checked against its size and
    hash; CheckpointError naming the piece otherwise."""
    try:
        assert piece.ref is not None
        blob = tier.piece_get(pieces.object_name(piece.ref, piece.codec))
    except (mf.ManifestRejected, OSError) as err:  # a symlink on the way, a missing file, EIO
        raise CheckpointError(f"{tier.name} tier: piece {piece.name} cannot be read ({err})") from err
    except Exception as err:
        raise CheckpointError(f"{tier.name} tier: piece {piece.name} cannot be read ({type(err).__name__})") from err
    if len(blob) != piece.object_size:
        raise CheckpointError(f"{tier.name} tier: piece {piece.name} has {len(blob)} bytes, the manifest says {piece.object_size}")
    try:
        data = pieces.decode(blob, piece.codec, piece.size)
    except pieces.PieceRejected as err:
        raise CheckpointError(f"{tier.name} tier: piece {piece.name} {err}") from None
    hasher = Hasher()
    hasher.update(data)
    if hasher.hexdigest() != piece.hash:
        raise CheckpointError(f"{tier.name} tier: piece {piece.name} does not match its manifest (its {HASH} check fails)")
    return data


def place(tier: Objects, uses: list[tuple[Path, str, mf.Piece]], step: int,
          heartbeat: Callable[[], None] = lambda: None) -> dict[str, str]:
    """Read one content-addressed piece (``read``) and write it wherever a fetched file
    holds it; {file: why} for the files it could not fill."""
    try:
        data = read(tier, uses[0][2])
    except CheckpointError as err:
        return {name: f"{err} (step {step})" for _, name, _ in uses}
    failed = {}
    for target, name, piece in uses:
        try:
            fd = os.open(target, os.O_WRONLY)
            try:
                if os.pwrite(fd, data, piece.offset) != len(data):
                    raise OSError(f"a short write at byte {piece.offset}")
            finally:
                os.close(fd)
        except OSError as err:
            failed[name] = f"{tier.name} tier: {name} of step {step} cannot be written ({err})"
        heartbeat()
    return failed


def place_all(tier: Objects, shared: dict[str, list[tuple[Path, str, mf.Piece]]], step: int, workers: int,
              heartbeat: Callable[[], None] = lambda: None) -> dict[str, str]:
    """``place`` every piece, ``workers`` at a time, then make each file written durable
    once; {file: why} for the files that could not be filled."""
    failed: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-pieces") as pool:
        for lost in pool.map(lambda uses: place(tier, uses, step, heartbeat), shared.values()):
            failed.update(lost)
    for target in {target for uses in shared.values() for target, _, _ in uses}:
        fsync_file(target)
    return failed


def collect_quietly(tier: Objects) -> list[str]:
    """``collect`` after a retention: a failure to collect leaves pieces for the next
    time (space, never data), and is no failure of the checkpoint just committed."""
    try:
        return collect(tier)
    except Exception as err:  # noqa: BLE001 - logged; the next retention tries again
        log.warning("%s tier: unreferenced pieces not collected this time (%s: %s)", tier.name, type(err).__name__,
                    str(err)[:200])
        return []


class PieceTier:
    """What a tier that stores pieces offers its writers and its retention, over its own
    ``Objects``; each tier says how often a writer looks for a collection's marker."""

    CLAIM_POLL_SECONDS: ClassVar[float] = 0.2

    def claim(self, step: int, writer: int, refs: set[str]) -> Held:
        """Before storing ``writer``'s pieces of ``step``: claim the ones it will refer to;
        the pieces held now (``settle``)."""
        return settle(cast(Objects, self), step, writer, refs, poll=self.CLAIM_POLL_SECONDS)

    def put_pieces(self, source: Source, run: list[tuple[int, int, str]], held: Held,
                   heartbeat: Callable[[], None] = lambda: None) -> Written:
        return store(cast(Objects, self), source, run, held, heartbeat)

    def collect(self) -> list[str]:
        """Delete the pieces nothing refers to (``collect_quietly``)."""
        return collect_quietly(cast(Objects, self))


def collect(tier: Objects, window: float | None = None) -> list[str]:
    """Delete the pieces no committed step and no write in progress refers to; the
    objects deleted. Skipped (nothing deleted) when a listed step cannot be read: its
    references are unknown. The candidates are listed first: a piece stored after that is
    never one, and a tier without pieces (one written whole) costs one listing."""
    window = pieces.WINDOW if window is None else window
    objects = tier.piece_objects()
    if not objects:
        return []
    token = secrets.token_hex(8)
    tier.marker_put(token)
    began = time.monotonic()
    deleted: list[str] = []
    try:
        held: set[str] = set()
        for record in tier.claims():
            held |= pieces.claimed(record)
        try:
            listed = tier.list()
        except StepUnreadable as err:
            log.warning("%s; pieces are not collected until every step can be read", err)
            return []
        for committed in listed:
            held |= pieces.refs_in(committed.manifest)
        for obj in pieces.plan(objects, held).doomed:
            if time.monotonic() - began > window:
                log.info("%s tier: piece collection stopped at its time limit; the rest goes next time", tier.name)
                break
            tier.piece_delete(obj)
            deleted.append(obj)
    finally:
        tier.marker_drop(token)
    return deleted
