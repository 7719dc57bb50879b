"""Write checkpoints into a tier the way the trainer does, without torch: files hashed in
pieces as written, one part per writer, one commit."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from llmtrain_store import manifest as mf
from llmtrain_store import shares
from llmtrain_store.fileio import FileWriter
from llmtrain_store.sources import MemorySource
from llmtrain_store.tier import file_record

ALLOWED = re.compile(r"(state\.llmt(\.part-\d{3}-of-\d{3})?|rng/rank-\d{5}\.llmt)")
META = {"config_hash": "h", "strategy": "ddp", "world_size": 1, "samples_consumed": 0}


def write_file(folder: Path, name: str, data: bytes, piece: int = mf.PIECE) -> dict[str, Any]:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = FileWriter(path, piece, direct=False)
    writer.write(data)
    return file_record(name, writer.size, writer.close())


def save_dir(tier: Any, step: int, files: dict[str, bytes], world: int = 1, ranks: set[int] | None = None) -> Any:
    """One writer (rank 0) holding every file whole; committed."""
    staging = tier.staging(step)
    records = {}
    for name, data in files.items():
        records[name] = write_file(staging, name, data)
    tier.write_part(step, 0, {"files": records})
    ranks = ranks if ranks is not None else set(range(world))
    return tier.commit(step, {**META, "world_size": world, "samples_consumed": step * 8}, {0}, ranks, timeout=5)


def pieces_of(data: bytes, piece: int = mf.PIECE) -> list[tuple[int, int, str]]:
    from llmtrain_store.fileio import PieceHasher

    hasher = PieceHasher(piece)
    hasher.update(data)
    return hasher.finish()


def save_shared(tier: Any, step: int, state: bytes, nodes: int, piece: int = mf.PIECE, rng: bytes = b"rng",
                meta: dict[str, Any] | None = None) -> Any:
    """``nodes`` writers, each storing its share of the replicated ``state.llmt`` and its
    own RNG file, then rank 0's commit (``meta`` added to its manifest): what the
    propagators of a job do."""
    pieces = pieces_of(state, piece)
    runs = shares.split(pieces, nodes)
    for node in range(nodes):
        part: dict[str, Any] = {"files": {}, "slices": {}}
        if runs[node]:
            tier.put_share(step, mf.slice_name("state.llmt", node, nodes), MemorySource([state]), runs[node])
        part["slices"]["state.llmt"] = {"size": len(state), "whole": shares.fingerprint(pieces),
                                        "pieces": shares.share_record("state.llmt", node, nodes, runs[node])}
        name = f"rng/rank-{node:05d}.llmt"
        rng_pieces = pieces_of(rng + bytes([node]))
        tier.put_share(step, name, MemorySource([rng + bytes([node])]), rng_pieces)
        part["files"][name] = file_record(name, len(rng) + 1, rng_pieces)
        tier.write_part(step, node, part)
    ranks = set(range(nodes))
    return tier.commit(step, {**META, **(meta or {}), "world_size": nodes, "samples_consumed": step * 8}, ranks, ranks,
                       timeout=10)


def flip_byte(path: Path, offset: int | None = None) -> None:
    with open(path, "r+b") as fh:
        size = os.fstat(fh.fileno()).st_size
        at = size // 2 if offset is None else offset
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))


def save_pieces(tier: Any, step: int, files: dict[str, bytes], nodes: int = 1, piece: int = mf.PIECE,
                replicated: frozenset[str] = frozenset({"state.llmt"})) -> tuple[Any, int]:
    """What the propagators of a job do with a content-addressed tier: each of ``nodes``
    writers claims its pieces (its share of each replicated file; the other files go to
    writer 0), stores the ones the tier lacks and announces the references; rank 0
    commits. Returns the committed step and the bytes the writers sent."""
    sent = 0
    for node in range(nodes):
        runs = {}
        for name, data in files.items():
            every = pieces_of(data, piece)
            if name in replicated:
                runs[name] = shares.split(every, nodes)[node]
            elif node == 0:
                runs[name] = every
        held = tier.claim(step, node, {f"{h}-{n}" for run in runs.values() for _, n, h in run})
        part: dict[str, Any] = {"files": {}, "slices": {}}
        for name, run in runs.items():
            stored = tier.put_pieces(MemorySource([files[name]]), run, held)
            sent += stored.written
            part["slices"][name] = {"size": len(files[name]), "whole": shares.fingerprint(pieces_of(files[name], piece)),
                                    "pieces": stored.records}
        tier.write_part(step, node, part)
    ranks = set(range(nodes))
    committed = tier.commit(step, {**META, "world_size": nodes, "samples_consumed": step * 8}, ranks, ranks, timeout=10)
    return committed, sent
