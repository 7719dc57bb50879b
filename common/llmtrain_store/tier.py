"""What every checkpoint tier is, and what the two kinds share.

``Tier`` is the protocol that the directory tiers (``directory.py``: node-local disk, a
shared filesystem) and S3 (``s3.py``) implement; ``build.py`` makes the configured ones.
The commit protocol is the same in both: writers store their files and announce them
with a part record; one committer waits for every expected part, merges them into the
manifest and writes ``COMMITTED`` (the manifest's hash) last. A reader trusts a step only
if ``COMMITTED`` matches its manifest, and reads a file only after the file's name passed
the manifest checks and its bytes matched their hash.
"""

from __future__ import annotations

import builtins
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from . import manifest as mf
from .fileio import HASH, Hasher, fsync_file
from .owner import Scope
from .sources import Source

log = logging.getLogger("llmtrain.checkpoint")


class Tier(Protocol):
    """One checkpoint tier: where a step is written (by several writers, committed by
    one), listed, verified and fetched."""

    name: str
    keep: int
    """How many committed steps it keeps."""
    interval_steps: int
    """Least number of steps between two checkpoints in this tier (0: every one)."""
    scope: Scope | None
    """The run writing the tier: clean-up touches only its lineage's steps (``owner.py``)."""

    @property
    def kind(self) -> str:
        """``dir`` or ``s3``."""
        ...

    def write_part(self, step: int, writer: int, part: dict[str, Any]) -> None:
        """Announce that ``writer``'s files (and slices) of ``step`` are stored."""
        ...

    def put_share(self, step: int, name: str, source: Source, pieces: list[tuple[int, int, str]],
                  heartbeat: Callable[[], None] = ...) -> None:
        """Store the contiguous ``pieces`` (offset, size, hash) of ``source`` as ``name``,
        hashing them as they are read; CheckpointError when a piece does not match."""
        ...

    content_addressed: bool
    """Pieces are stored by content, once (``pieces.py``): writers ``claim`` and
    ``put_pieces`` instead of ``put_share``."""

    def claim(self, step: int, writer: int, refs: set[str]) -> dict[str, tuple[str | None, int]]:
        """Claim the pieces ``writer`` will refer to in ``step``; the pieces held now."""
        ...

    def put_pieces(self, source: Source, run: list[tuple[int, int, str]], held: dict[str, tuple[str | None, int]],
                   heartbeat: Callable[[], None] = ...) -> Any:
        """Store the pieces of ``run`` not ``held``; a ``piecestore.Written``."""
        ...

    def commit(self, step: int, meta: dict[str, Any], expected: set[int], ranks: set[int], timeout: float,
               heartbeat: Callable[[], None] = ...) -> Committed:
        """Wait for every expected writer's part, then make the step exist for readers.
        ``ranks``: the ranks whose state the step covers."""
        ...

    def retain(self) -> list[int]:
        """Delete committed steps beyond ``keep``, oldest first; the steps deleted."""
        ...

    def delete(self, step: int) -> None:
        """Remove a committed step (out of the listing first)."""
        ...

    def sweep_staging(self) -> None:
        """Remove what an interrupted write left behind."""
        ...

    def list(self) -> list[Committed]:
        """Committed steps whose ``COMMITTED`` matches the manifest, newest first; an
        unreadable entry is skipped, never raised."""
        ...

    # ``builtins.list``: below ``def list`` the name means the method in this class's body.
    def verify(self, committed: Committed, names: builtins.list[str] | None, allowed: re.Pattern[str]) -> str | None:
        """None if the named files (default: all) are safe to read and match the
        manifest; else why not."""
        ...

    def fetch(self, committed: Committed, names: builtins.list[str], dest: Path, allowed: re.Pattern[str],
              heartbeat: Callable[[], None] = ..., workers: int = 4,
              optional: frozenset[str] = frozenset()) -> dict[str, dict[str, Any]]:
        """Copy the named files into ``dest``, verifying every piece; their records. A
        failed ``optional`` file is left out, a failed required one raises CheckpointError."""
        ...


class CheckpointError(Exception):
    """A checkpoint could not be written or read (the tier degrades; training goes on)."""


class StepUnreadable(CheckpointError):
    """Steps the tier lists but cannot read for a reason other than their absence (access
    refused, an I/O error, a 5xx): ``list()`` raises this instead of leaving them out,
    since a listing without them could make a job start over beside committed progress,
    and retention then delete that progress as older. ``listed`` holds the steps that
    were read (newest first): a restore and retention may use those, never touching the
    unreadable ones. The first cause is chained (``__cause__``)."""

    def __init__(self, tier: str, steps: list[int | None], cause: BaseException, listed: list[Committed] | None = None):
        shown = ", ".join("?" if s is None else str(s) for s in steps[:5]) + (" ..." if len(steps) > 5 else "")
        said = f"step {shown} is" if len(steps) == 1 else f"steps {shown} are"
        super().__init__(f"{tier} tier: {said} listed but cannot be read ({type(cause).__name__})")
        self.tier, self.steps, self.listed, self.what = tier, steps, listed or [], f"{said} listed but cannot be read"


def write_json_durably(path: Path, data: Any) -> bytes:
    tmp = path.with_name("." + path.name + ".tmp")
    text = json.dumps(data, indent=1, sort_keys=True).encode()
    tmp.write_bytes(text)
    fsync_file(tmp)
    tmp.replace(path)
    return text


def digest_bytes(data: bytes) -> str:
    hasher = Hasher()
    hasher.update(data)
    return hasher.hexdigest()


@dataclass
class Committed:
    """A committed checkpoint in one tier, as listed (its files not yet verified)."""

    tier: Tier
    """The tier holding it (a DirTier or an S3Tier)."""
    step: int
    location: str
    """The folder (a directory tier) or the key prefix (S3)."""
    manifest: dict[str, Any]

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])

    @property
    def ranks(self) -> set[int]:
        return {int(r) for r in self.manifest["ranks"]}

    @property
    def complete(self) -> bool:
        """Holds the files of every rank of the world that saved it."""
        return self.ranks == set(range(self.world_size))


def wait_for_parts(tier: str, step: int, expected: set[int], present: Callable[[], set[int]], timeout: float,
                   heartbeat: Callable[[], None], poll: float) -> None:
    """Before a commit: wait until every expected writer's part record is in (``present``
    lists them), feeding ``heartbeat``; CheckpointError naming the missing writers after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        have = present()
        if expected <= have:
            return
        if time.monotonic() > deadline:
            raise CheckpointError(f"{tier} tier: step {step} incomplete after {timeout:.0f}s; "
                                  f"missing parts of writers {sorted(expected - have)}")
        heartbeat()
        time.sleep(poll)


def merge_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``files`` from the writers' part records: whole files as they are,
    and each shared file from the pieces the writers stored. Every writer hashes pieces at
    the same boundaries, so where two stored the same piece (a node that had to store its
    whole file next to nodes that stored their share), one copy is chosen. Raises
    CheckpointError when the pieces do not cover a file, or when the writers' copies of it
    differ (shares of different files never make one)."""
    files: dict[str, Any] = {}
    offered: dict[str, list[dict[str, Any]]] = {}
    sizes: dict[str, int] = {}
    copies: dict[str, set[tuple[int, str | None]]] = {}
    cuts: dict[str, set[int]] = {}
    for part in parts:
        files.update(part.get("files", {}))
        for name, record in part.get("slices", {}).items():
            sizes[name] = int(record["size"])
            copies.setdefault(name, set()).add((int(record["size"]), record.get("whole")))
            offered.setdefault(name, []).extend(record["pieces"])
            # The piece size a writer cut at: every piece but the file's last has it.
            cuts.setdefault(name, set()).update(int(p["size"]) for p in record["pieces"]
                                                if int(p["offset"]) + int(p["size"]) < int(record["size"]))
    for name, seen in copies.items():
        if len(seen) > 1 and len(cuts.get(name, ())) > 1:
            raise CheckpointError(f"{name}: the writers cut it in pieces of different sizes ({sorted(cuts[name])} bytes): "
                                  f"their trainers are of different versions (an image changed while the job ran reaches "
                                  f"new pods only); a job-wide tier commits it once every pod runs one version")
        if len(seen) > 1:
            raise CheckpointError(f"{name}: the writers' copies differ ({len(seen)} versions: sizes "
                                  f"{sorted({size for size, _ in seen})}); a file stored in shares must be byte-identical on every node")
    for name, pieces in offered.items():
        chosen: list[dict[str, Any]] = []
        covered = 0
        by_offset: dict[int, list[dict[str, Any]]] = {}
        for piece in pieces:
            by_offset.setdefault(int(piece["offset"]), []).append(piece)
        while covered < sizes[name]:
            options = by_offset.get(covered)
            if not options:
                raise CheckpointError(f"{name}: no writer stored the bytes from {covered}")
            # Prefer the object that already holds the previous piece (fewer objects).
            previous = chosen[-1].get("name") if chosen else None
            pick = next((o for o in options if previous is not None and o.get("name") == previous),
                        sorted(options, key=lambda o: str(o.get("name") or o.get("ref")))[0])
            chosen.append(pick)
            covered += int(pick["size"])
        files[name] = {"size": sizes[name], "slices": chosen}
    return files


def new_manifest(step: int, meta: dict[str, Any], ranks: set[int], files: dict[str, Any]) -> dict[str, Any]:
    """Format 3 when a piece is a reference to a content-addressed object (``pieces.py``),
    so that a reader that knows only format 2 refuses it by name."""
    by_ref = any("ref" in piece for record in files.values() for piece in record.get("slices", []))
    return {**meta, "format": mf.FORMAT_PIECES if by_ref else mf.FORMAT_VERSION, "step": step, "ranks": sorted(ranks),
            "hash": HASH, "files": files}


def allocate(dest: Path, name: str, size: int) -> Path:
    """Where a fetched file goes, ``dest/name`` (checked like a manifest's name), created at
    its full size: its pieces are written into it at their offsets, in any order."""
    target = mf.inside(dest, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as fh:
        fh.truncate(size)
    return target


def finish_fetch(files: dict[str, mf.FileEntry], names: list[str], dest: Path, failed: dict[str, str],
                 optional: frozenset[str]) -> dict[str, dict[str, Any]]:
    """The records of the fetched files; a failed optional file is removed and left out,
    a failed required one raises CheckpointError."""
    required = {name: why for name, why in failed.items() if name not in optional}
    if required:
        raise CheckpointError(next(iter(required.values())))
    for name, why in failed.items():
        log.warning("%s; left out", why)
        (dest / name).unlink(missing_ok=True)
    return records_of(files, [n for n in names if n not in failed])


def records_of(files: dict[str, mf.FileEntry], names: list[str]) -> dict[str, dict[str, Any]]:
    """The records of files fetched whole into a folder: their pieces become ranges of
    the files themselves, with the same hashes (nothing is hashed again)."""
    return {name: file_record(name, files[name].size, [(p.offset, p.size, p.hash) for p in files[name].pieces]) for name in names}


def file_record(name: str, size: int, pieces: list[tuple[int, int, str]]) -> dict[str, Any]:
    """A whole file's manifest record from its pieces (offset, size, hash)."""
    if len(pieces) == 1:
        return {"size": size, "hash": pieces[0][2]}
    return {"size": size, "slices": [{"name": name, "offset": o, "size": n, "hash": h, "at": o} for o, n, h in pieces]}
