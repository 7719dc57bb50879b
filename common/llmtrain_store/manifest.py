"""A checkpoint's manifest, and the checks every entry passes before a byte is read.

    {"format": 2, "step": 120, "samples_consumed": ..., "world_size": 2, "ranks": [0, 1],
     "config_hash": ..., "strategy": "ddp", "max_steps": ..., "hash": "xxh3-128",
     "files": {"state.llmt": {"size": ..., "hash": ...},
               "rng/rank-00000.llmt": {...}}}

A file is hashed in pieces (``piece_size``: at most ``PIECE`` bytes) while it is written:
``slices: [{"name", "offset", "size", "hash", "at"}]``, contiguous from offset 0 to ``size``;
``name`` is the object holding the piece and ``at`` where in it. In tier 1 every piece is
in the file itself (``at`` = ``offset``). A job-wide tier keeps replicated state once per
job: each node stores its share, a run of whole pieces, as one object
(``<file>.part-<i>-of-<n>``), with the same hashes. So copying or uploading a share needs
no new hash, and a file pulled back together needs none either.

In a content-addressed tier (format 3, ``pieces.py``) a piece is instead a reference,
``{"ref": "<hash>-<size>", "offset", "size", "hash"}`` (with ``"codec": "zstd", "stored":
<bytes>`` when stored compressed), to an object beside the step folders that every step
holding those bytes shares. A reference names no path: the object's name is derived from
the hash and size, checked to be exactly that.

``COMMITTED`` (the manifest's hash) is written last, so a torn checkpoint is never listed.
It guards against torn writes, not tampering: so every name is also checked before use
(relative, no ``..``, no symlink, one of the names the engine writes) and every byte read is
hashed against the manifest.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from . import pieces

FORMAT_VERSION = 2
FORMAT_PIECES = 3
"""A manifest whose pieces are references to content-addressed objects (``pieces.py``)."""
FORMATS = (FORMAT_VERSION, FORMAT_PIECES)
MANIFEST = "manifest.json"
COMMITTED = "COMMITTED"
STEP_PREFIX = "step-"
STAGING_PREFIX = ".staging-"

RNG_NAME = re.compile(r"rng/rank-\d{5}\.llmt")
_SLICED = r"(\.part-\d{3}-of-\d{3})?"
ENGINE_FILES = {
    "ddp": re.compile(rf"(state\.llmt{_SLICED}|rng/rank-\d{{5}}\.llmt)"),
    "deepspeed": re.compile(r"(ds/((zero_pp_rank_\d+_)?mp_rank_00_model_states\.pt"
                            rf"|(bf16_)?zero_pp_rank_\d+_mp_rank_00_optim_states\.pt){_SLICED}"
                            r"|rng/rank-\d{5}\.llmt)"),
    "script": re.compile(rf"(script-state\.pt{_SLICED}|script-rank-\d{{5}}\.pt{_SLICED}|rng/rank-\d{{5}}\.llmt)"),
}
"""Every file name each engine writes, by the manifest's ``strategy`` (DeepSpeed prefixes
its optimizer shards with ``bf16_`` when it trains in bf16, and at ZeRO-3 every rank writes
its own ``zero_pp_rank_<r>_mp_rank_00_model_states.pt``; a script's state through the
checkpoint API is one replicated file or a file per rank): a manifest naming
anything else is rejected. The trainer's engines answer with these; ``llmtrain
checkpoints`` checks with them, without the trainer."""
PIECE = 64 << 20
"""The largest piece: the bytes hashed as one unit. A node's share of a file is a run of
whole pieces."""
PIECE_MIN = 4 << 20
"""The smallest piece size (a smaller file is one piece). A content-addressed tier stores
each piece as one object and reads it back with one request, whose cost (a few ms of CPU
in boto3 here on loopback, and a round trip to a remote S3) outweighed a 1 MiB piece's
bytes: restores of a 70-80 MB state from S3 took 1.6-1.8x as long by content as whole
at 1 MiB, about the same at 4 MiB (docs/benchmarks.md). The price is a coarser
deduplication of small states only: a changed byte rewrites its 4 MiB."""


def piece_size(total: int) -> int:
    """The piece size of a file of ``total`` bytes: about 1/64 of it (so that the shares
    of a file of 256 MiB or more balance over up to 64 nodes; a smaller one has fewer
    pieces than that, and some nodes store none of it), between 4 MiB and 64 MiB, a
    multiple of 4 KiB (pieces end on direct-I/O boundaries). Every writer of a file
    derives the same size from its length, so pieces stored by different nodes line up;
    writers of two versions of this rule (an image changed mid-run reaches new pods only)
    cannot share a job-wide commit, which says so (``tier.merge_parts``). A checkpoint
    written with other sizes stays readable (its manifest says its pieces); a
    content-addressed tier stores its pieces again at the new size once, the old ones
    going with the steps that hold them."""
    want = -(-total // 64)
    return max(PIECE_MIN, min(PIECE, -(-want // 4096) * 4096))
SLICE_SUFFIX = re.compile(r"\.part-(\d{3})-of-(\d{3})$")


def step_of(name: str) -> int | None:
    """The step a ``step-NNNNNNNN`` folder or prefix names; None for any other name."""
    tail = name[len(STEP_PREFIX):] if name.startswith(STEP_PREFIX) else ""
    return int(tail) if tail.isascii() and tail.isdigit() else None


def step_dir(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def staging_dir(step: int, owner_token: str | None = None) -> str:
    """The staging folder of ``step``, keyed by its writer's owner token (``owner.py``)
    so that two runs writing one step number never fill one folder."""
    return f"{STAGING_PREFIX}{step:08d}" + (f".{owner_token}" if owner_token else "")


def staged(name: str) -> tuple[int, str | None] | None:
    """(step, owner token or None) of a staging folder's name; None for any other name."""
    tail = name[len(STAGING_PREFIX):] if name.startswith(STAGING_PREFIX) else ""
    number, _, key = tail.partition(".")
    if not (number.isascii() and number.isdigit()) or (key and not (key.isascii() and key.isalnum())):
        return None
    return int(number), key or None


def slice_name(name: str, index: int, count: int) -> str:
    return f"{name}.part-{index:03d}-of-{count:03d}"


class ManifestRejected(Exception):
    """A manifest (or a file it lists) cannot be trusted; the message says why."""


@dataclass(frozen=True)
class Piece:
    """``size`` bytes of a file, from ``offset``, with their hash, stored in the object
    ``name`` (the file itself or one of its slice objects) at byte ``at``."""

    name: str
    offset: int
    size: int
    hash: str
    at: int
    ref: str | None = None
    """A content-addressed piece: ``name`` is then its object in the tier's pieces folder
    (``pieces/<ref>`` or ``pieces/<ref>.zst``), not in the step's folder, and ``at`` 0."""
    codec: str | None = None
    stored: int | None = None
    """The object's size when compressed (else ``size``)."""

    @property
    def object_size(self) -> int:
        return self.stored if self.stored is not None else self.size


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    pieces: tuple[Piece, ...]
    """The file itself (one piece), or its slices in order."""

    @property
    def sliced(self) -> bool:
        """Stored as separate slice objects or pieces (not as the file itself)."""
        return any(p.name != self.name for p in self.pieces)

    @property
    def referenced(self) -> bool:
        """Stored as content-addressed pieces (``pieces.py``)."""
        return any(p.ref is not None for p in self.pieces)

    def stored_sizes(self) -> dict[str, tuple[int, bool]]:
        """Each object in the step's folder holding this file's bytes -> (the bytes it
        must hold, whether that is exact). The file itself must have exactly its size; a
        slice object at least up to its last piece used (a node may have stored more than
        the copy chosen). Content-addressed pieces are not in the step's folder: see
        ``piece_sizes``."""
        sizes: dict[str, int] = {}
        for p in self.pieces:
            if p.ref is None:
                sizes[p.name] = max(sizes.get(p.name, 0), p.at + p.size)
        return {n: ((self.size, True) if n == self.name else (need, False)) for n, need in sizes.items()}

    def piece_sizes(self) -> dict[str, int]:
        """Each content-addressed object (relative to the tier's root) -> its exact size."""
        return {p.name: p.object_size for p in self.pieces if p.ref is not None}


def _safe_name(name: Any, allowed: re.Pattern[str]) -> str:
    if not isinstance(name, str) or not name:
        raise ManifestRejected(f"a file name is not a string: {name!r}")
    if "\\" in name or "\0" in name:
        raise ManifestRejected(f"{name!r}: forbidden character in the name")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise ManifestRejected(f"{name!r} is an absolute path")
    if any(part in ("..", ".", "") for part in name.split("/")):
        raise ManifestRejected(f"{name!r} leaves the checkpoint folder or is not a plain relative name")
    if not allowed.fullmatch(name):
        raise ManifestRejected(f"{name!r} is not a file this engine writes")
    return name


def entries(manifest: dict[str, Any], allowed: re.Pattern[str]) -> dict[str, FileEntry]:
    """The manifest's files, each checked: a safe name the engine writes, a size, a hash,
    and slices that tile the file exactly. Raises ManifestRejected naming the first
    problem."""
    if manifest.get("format") not in FORMATS:
        raise ManifestRejected(f"format {manifest.get('format')!r}, this trainer reads formats {', '.join(map(str, FORMATS))}")
    by_ref = manifest.get("format") == FORMAT_PIECES
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ManifestRejected("the manifest lists no files")
    out: dict[str, FileEntry] = {}
    for name, record in files.items():
        _safe_name(name, allowed)
        if not isinstance(record, dict) or not isinstance(record.get("size"), int) or record["size"] < 0:
            raise ManifestRejected(f"{name}: no valid size")
        size = record["size"]
        if "slices" in record:
            pieces, offset = [], 0
            ends: dict[str, int] = {}
            for piece in record["slices"] if isinstance(record["slices"], list) else [None]:
                if not isinstance(piece, dict):
                    raise ManifestRejected(f"{name}: a slice is not a record")
                if "ref" in piece:
                    if not by_ref:
                        raise ManifestRejected(f"{name}: a piece reference in a format {manifest.get('format')} manifest")
                    pieces.append(_referenced(name, piece, offset))
                    offset += piece["size"]
                    continue
                pname = _safe_name(piece.get("name"), allowed)
                if pname != name and not (SLICE_SUFFIX.search(pname) and pname.startswith(name + ".")):
                    raise ManifestRejected(f"{name}: slice {pname!r} is not one of its slices")
                if piece.get("offset") != offset or not isinstance(piece.get("size"), int) or piece["size"] < 0:
                    raise ManifestRejected(f"{name}: a piece in {pname} does not continue at byte {offset}")
                if not isinstance(piece.get("hash"), str):
                    raise ManifestRejected(f"{name}: a piece in {pname} has no hash")
                at = piece.get("at", offset if pname == name else ends.get(pname, 0))
                if not isinstance(at, int) or (at != offset if pname == name else at < ends.get(pname, 0)):
                    raise ManifestRejected(f"{name}: the pieces of {pname} are not stored in order")
                pieces.append(Piece(pname, offset, piece["size"], piece["hash"], at))
                ends[pname] = at + piece["size"]
                offset += piece["size"]
            if offset != size:
                raise ManifestRejected(f"{name}: its pieces hold {offset} bytes, the file has {size}")
            if name in ends and len(ends) > 1:
                raise ManifestRejected(f"{name}: mixes pieces of the file with slice objects")
            if ends and any(p.ref is not None for p in pieces):
                raise ManifestRejected(f"{name}: mixes piece references with stored objects")
            out[name] = FileEntry(name, size, tuple(pieces))
        else:
            if not isinstance(record.get("hash"), str):
                raise ManifestRejected(f"{name}: no hash")
            out[name] = FileEntry(name, size, (Piece(name, 0, size, record["hash"], 0),))
    return out


def _referenced(name: str, piece: dict[str, Any], offset: int) -> Piece:
    """A content-addressed piece's record, checked: its reference is exactly its hash and
    size (so it names no path but its own object), its codec known, its stored size sane."""
    ref, size, digest = piece.get("ref"), piece.get("size"), piece.get("hash")
    if piece.get("offset") != offset or not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ManifestRejected(f"{name}: a piece reference does not continue at byte {offset}")
    if size > PIECE:  # a reader holds a piece in memory: never more than the largest one
        raise ManifestRejected(f"{name}: a piece of {size} bytes is larger than any piece ({PIECE})")
    if not isinstance(digest, str) or not isinstance(ref, str) or ref != pieces.ref_of(digest, size) \
            or not pieces.REF.fullmatch(ref):
        raise ManifestRejected(f"{name}: piece reference {str(ref)[:80]!r} is not the hash and size of its piece")
    if "name" in piece or "at" in piece:
        raise ManifestRejected(f"{name}: piece reference {ref} also names an object")
    codec = piece.get("codec")
    if not isinstance(codec, (str, type(None))) or codec not in pieces.SUFFIX:
        raise ManifestRejected(f"{name}: piece {ref} has an unknown codec {str(codec)[:40]!r}")
    stored = piece.get("stored", size if codec is None else None)
    if not isinstance(stored, int) or isinstance(stored, bool) or stored <= 0 or (codec is None and stored != size) \
            or stored > size + (size >> 7) + (1 << 17):
        raise ManifestRejected(f"{name}: piece {ref} has no plausible stored size")
    return Piece(f"{pieces.PIECES_DIR}/{pieces.object_name(ref, codec)}", offset, size, digest, 0, ref, codec,
                 stored if codec is not None else None)


def inside(folder: Path, name: str) -> Path:
    """The path of ``name`` in ``folder``, refusing symlinks anywhere on the way and any
    path that resolves outside the folder."""
    path = folder / name
    current = folder
    for part in PurePosixPath(name).parts:
        current = current / part
        if current.is_symlink():
            raise ManifestRejected(f"{name}: {current.relative_to(folder)} is a symlink")
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        raise ManifestRejected(f"{name} resolves outside the checkpoint folder") from None
    return path


def stored_names(files: Iterable[FileEntry]) -> list[str]:
    """The objects a tier holds for these files in the step's folder."""
    return sorted({p.name for f in files for p in f.pieces if p.ref is None})
