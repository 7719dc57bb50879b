"""Content-addressed pieces: how the job-wide tiers (a shared filesystem, S3) store a
checkpoint's bytes once, however many steps hold them.

A file is hashed in pieces at fixed offsets while it is written (``manifest.piece_size``).
In a content-addressed tier each piece is an object of its own, named by what it holds,
``pieces/<hash>-<size>`` (``.zst`` when stored compressed), beside the step folders; a
manifest refers to it (``{"ref": "<hash>-<size>", "offset", "size", "hash"}``). A piece
already stored for the job is referenced, not written again: the frozen weights of a
fine-tune, and every piece a step shares with the one before, cost nothing after the
first checkpoint. The hash is xxh3-128 (``fileio.py``): a collision between two pieces
of one job's store is as unlikely as a corrupt piece passing its check, which the store
accepts already; it is not a defence against someone who can write the store.

**Compression** is chosen per piece from a sample (``worth_compressing``): zstd at level 1
(hundreds of MB/s on one core, in the uploading thread, never the training one) when a
sample shrinks by a tenth; the piece is kept compressed only if the whole of it shrank by
at least 5 %. Optimizer moments and trained weights rarely pass; zero-filled buffers,
integer state and padding do. A compressed piece is decompressed with a bound (its size):
a forged object cannot make a reader allocate more.

**Deleting pieces safely** (``piecestore.collect``): a piece may go only when no
committed step and no write in progress refers to it. A writer first *claims* the pieces
it will refer to (a record in its staging area), then looks for a collection in progress
(a marker): if none, any collection that starts later reads its claim; if one runs, the
writer waits for it to end (at most ``WAIT`` = 3 x ``WINDOW`` by its own clock; a marker
still there after that is a collection that died, and is removed) before it trusts which
pieces exist. A collection lists the pieces (its candidates: one stored later is never
one), writes its marker, reads every claim, then every committed manifest, and deletes
unreferenced candidates only within ``WINDOW`` seconds of its marker. So a piece a writer
found and skipped is never deleted under it, and a commit racing a prune loses nothing
(tests/store/test_pieces.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import zstandard

PIECES_DIR = "pieces"
CODEC = "zstd"
SUFFIX = {None: "", CODEC: ".zst"}
REF = re.compile(r"([0-9a-f]{32})-(\d{1,15})")
"""A piece's name: its xxh3-128 hash (hex) and its size."""
OBJECT = re.compile(r"([0-9a-f]{32}-\d{1,15})(\.zst)?")
WINDOW = 10.0
"""Seconds a collection may go on deleting after it wrote its marker."""
WAIT = 3 * WINDOW
"""Seconds a writer waits for a collection in progress to end. The margin over WINDOW
covers a delete request still in flight when its collection's window closes (an S3
tier deletes pieces with one attempt and a 5 s read timeout: ``S3Tier._deleter``)."""
SAMPLE = 64 << 10
SAMPLE_RATIO = 0.9
KEEP_RATIO = 0.95
LEVEL = 1


class PieceRejected(Exception):
    """A stored piece is not what its reference says (size, codec, bytes)."""


def ref_of(digest: str, size: int) -> str:
    return f"{digest}-{size}"


def object_name(ref: str, codec: str | None) -> str:
    """The object holding ``ref`` (relative to the pieces folder or prefix)."""
    return ref + SUFFIX[codec]


def ref_of_object(name: str) -> str | None:
    """The reference an object in the pieces folder holds; None for any other name (a
    temporary file, a stranger's file), which collection never deletes."""
    match = OBJECT.fullmatch(name)
    return match.group(1) if match else None


def worth_compressing(data: memoryview | bytes) -> bool:
    """Whether a sample of ``data`` (its start, middle and end) shrinks by a tenth at
    zstd level 1: a cheap look before compressing up to 64 MiB."""
    view = memoryview(data).cast("B")
    if len(view) <= 3 * SAMPLE:
        sample = bytes(view)
    else:
        middle = len(view) // 2 - SAMPLE // 2
        sample = bytes(view[:SAMPLE]) + bytes(view[middle:middle + SAMPLE]) + bytes(view[-SAMPLE:])
    return len(zstandard.ZstdCompressor(level=LEVEL).compress(sample)) < SAMPLE_RATIO * len(sample)


def encode(data: bytes) -> tuple[bytes, str | None]:
    """What to store for a piece, and its codec (None: as it is)."""
    if not data or not worth_compressing(data):
        return data, None
    packed = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True).compress(data)
    if len(packed) > KEEP_RATIO * len(data):
        return data, None
    return packed, CODEC


def decode(blob: bytes, codec: str | None, size: int) -> bytes:
    """A stored piece's bytes; PieceRejected when the object does not hold exactly
    ``size`` bytes (decompression reads at most one byte more than that)."""
    if codec is None:
        data = blob
    elif codec == CODEC:
        try:
            with zstandard.ZstdDecompressor().stream_reader(blob, read_across_frames=False) as reader:
                data = reader.read(size + 1)
        except zstandard.ZstdError as err:
            raise PieceRejected(f"not a valid {CODEC} frame ({err})") from None
        except MemoryError:
            raise PieceRejected(f"does not fit in memory ({size} bytes)") from None
    else:
        raise PieceRejected(f"unknown codec {codec!r}")
    if len(data) != size:
        raise PieceRejected(f"holds {len(data)}{'+' if len(data) > size else ''} bytes, its reference says {size}")
    return data


def refs_in(manifest: Any) -> set[str]:
    """Every piece reference a manifest's files name, read loosely: collection keeps what
    any committed step might refer to, even one whose manifest a reader would reject."""
    out: set[str] = set()
    files = manifest.get("files") if isinstance(manifest, dict) else None
    for record in files.values() if isinstance(files, dict) else []:
        slices = record.get("slices") if isinstance(record, dict) else None
        for piece in slices if isinstance(slices, list) else []:
            ref = piece.get("ref") if isinstance(piece, dict) else None
            if isinstance(ref, str) and REF.fullmatch(ref):
                out.add(ref)
    return out


def claim_record(refs: Iterable[str]) -> dict[str, Any]:
    return {"refs": sorted(set(refs))}


def claimed(record: Any) -> set[str]:
    """The references a claim record holds (loosely, as ``refs_in``)."""
    refs = record.get("refs") if isinstance(record, dict) else None
    return {r for r in refs if isinstance(r, str) and REF.fullmatch(r)} if isinstance(refs, list) else set()


@dataclass(frozen=True)
class Plan:
    """What a collection deletes: the objects whose reference nothing holds."""

    doomed: list[str]
    kept: int


def plan(objects: Iterable[str], referenced: set[str]) -> Plan:
    """From the names in the pieces folder and the references held (committed manifests
    and claims): the objects to delete. Names that are not piece objects are left."""
    doomed, kept = [], 0
    for name in sorted(objects):
        ref = ref_of_object(name)
        if ref is None:
            continue
        if ref in referenced:
            kept += 1
        else:
            doomed.append(name)
    return Plan(doomed, kept)
