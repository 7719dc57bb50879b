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

FORMAT_VERSION = 2
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
}
"""Every file name each engine writes, by the manifest's ``strategy`` (DeepSpeed prefixes
its optimizer shards with ``bf16_`` when it trains in bf16, and at ZeRO-3 every rank writes
its own ``zero_pp_rank_<r>_mp_rank_00_model_states.pt``): a manifest naming
anything else is rejected. The trainer's engines answer with these; ``llmtrain
checkpoints`` checks with them, without the trainer."""
PIECE = 64 << 20
"""The largest piece: the bytes hashed as one unit. A node's share of a file is a run of
whole pieces."""
PIECE_MIN = 1 << 20


def piece_size(total: int) -> int:
    """The piece size of a file of ``total`` bytes: about 1/64 of it (so that its shares
    balance over many nodes), between 1 MiB and 64 MiB, a multiple of 4 KiB (pieces end
    on direct-I/O boundaries). Every writer of a file derives the same size from its
    length, so pieces stored by different nodes line up."""
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


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    pieces: tuple[Piece, ...]
    """The file itself (one piece), or its slices in order."""

    @property
    def sliced(self) -> bool:
        """Stored as separate slice objects (not as the file itself)."""
        return any(p.name != self.name for p in self.pieces)

    def stored_sizes(self) -> dict[str, tuple[int, bool]]:
        """Each object holding this file's bytes -> (the bytes it must hold, whether that
        is exact). The file itself must have exactly its size; a slice object at least up
        to its last piece used (a node may have stored more than the copy chosen)."""
        sizes: dict[str, int] = {}
        for p in self.pieces:
            sizes[p.name] = max(sizes.get(p.name, 0), p.at + p.size)
        return {n: ((self.size, True) if n == self.name else (need, False)) for n, need in sizes.items()}


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
    if manifest.get("format") != FORMAT_VERSION:
        raise ManifestRejected(f"format {manifest.get('format')!r}, this trainer reads format {FORMAT_VERSION}")
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
            out[name] = FileEntry(name, size, tuple(pieces))
        else:
            if not isinstance(record.get("hash"), str):
                raise ManifestRejected(f"{name}: no hash")
            out[name] = FileEntry(name, size, (Piece(name, 0, size, record["hash"], 0),))
    return out


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
    """The objects a tier holds for these files."""
    return sorted({p.name for f in files for p in f.pieces})
