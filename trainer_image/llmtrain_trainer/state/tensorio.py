"""Tensors to checkpoint files and back, through the store's archive format.

Every write hashes its bytes in pieces as they go out (``PieceHasher``); every read
hashes them as they come in and compares with the manifest before anything is used.
Nothing is pickled, except in DeepSpeed's own files (``HashingFile`` gives ``torch.save``
a file object that hashes what it writes), which are verified before DeepSpeed reads
them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from llmtrain_store.archive import ALIGN, ArchiveError, decode_header, encode_header, header_block_size
from llmtrain_store.fileio import FileWriter, PieceHasher, Segments, allocate, read_pieces, write_segments
from llmtrain_store.manifest import PIECE, piece_size

from llmtrain_trainer.state.arena import Arena

Pieces = list[tuple[int, int, str]]


class ChecksumMismatch(Exception):
    """What was read does not match the manifest's hashes."""


def write_arena(path: Path, arena: Arena, meta: dict[str, Any], direct: bool = True) -> tuple[int, Pieces]:
    """Header, then the arena's memory by direct I/O, two pieces at a time: no copy of the
    payload at all. Returns (file size, pieces)."""
    header = encode_header(meta, arena.entries)
    head = allocate(len(header))
    head[: len(header)] = header
    data = Segments([memoryview(head)[: len(header)], arena.memory()[: arena.size]])
    pieces = write_segments(path, data, piece_size(data.size), direct=direct)
    return data.size, pieces


def read_arena(path: Path, arena: Arena, expected: Pieces) -> dict[str, Any]:
    """Read an archive's payload straight into ``arena`` (direct I/O, two pieces at a
    time), checking its layout and every piece's hash; returns the header's meta."""
    with open(path, "rb") as fh:
        size = header_block_size(fh.read(16))
        fh.seek(0)
        prefix = fh.read(size)
    header = decode_header(prefix, file_size=sum(p[1] for p in expected))
    mine = [(e.name, e.dtype, list(e.shape), e.offset, e.nbytes) for e in arena.entries]
    theirs = [(e.name, e.dtype, list(e.shape), e.offset, e.nbytes) for e in header.tensors]
    if mine != theirs or header.payload_size != arena.size:
        raise ArchiveError(f"{path.name}: its tensors do not match this model's (another model or optimizer)")
    head = allocate(header.payload_offset)
    problem = read_pieces(path, Segments([memoryview(head)[: header.payload_offset], arena.memory()[: arena.size]]),
                          [(offset, size, digest) for offset, size, digest in expected])
    if problem is not None:
        raise ChecksumMismatch(problem)
    if bytes(head[: len(prefix)]) != prefix:  # the header decoded above is the one verified
        raise ChecksumMismatch(f"{path.name}: the header changed while it was read")
    return header.meta


def write_small(path: Path, data: bytes | memoryview) -> tuple[int, Pieces]:
    """A small file (an RNG archive) already encoded in memory, hashed as written."""
    writer = FileWriter(path, piece_size(len(data)), direct=False)
    try:
        writer.write(data)
        pieces = writer.close()
    except BaseException:
        writer.abort()
        raise
    return writer.size, pieces


def verify(data: bytes, expected: Pieces, what: str = "an archive") -> None:
    """Raise ChecksumMismatch unless ``data`` hashes to the manifest's pieces."""
    hasher = PieceHasher(_piece_of(expected))
    hasher.update(data)
    if hasher.finish() != [tuple(p) for p in expected]:
        raise ChecksumMismatch(f"{what} does not match the manifest's hashes")


def read_tensors(data: bytes, expected: Pieces) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and meta of a small archive already in memory, after checking its hashes."""
    verify(data, expected)
    header = decode_header(data, file_size=len(data))
    buffer = bytearray(data[header.payload_offset:])
    out = {}
    for e in header.tensors:
        dtype = getattr(torch, e.dtype)
        count = e.nbytes // torch.empty((), dtype=dtype).element_size()
        out[e.name] = torch.frombuffer(buffer, dtype=dtype, count=count, offset=e.offset).view(e.shape).clone()
    return out, header.meta


def _piece_of(expected: Pieces) -> int:
    """The piece size the manifest's pieces were cut at (every piece but the last has it)."""
    return max(1, expected[0][1]) if expected else PIECE


class HashingFile(io.RawIOBase):
    """A file ``torch.save`` writes through: buffered, hashed in pieces as written."""

    def __init__(self, path: Path):
        self._writer = FileWriter(path, PIECE, direct=False)
        self.pieces: Pieces = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._writer.write(view)
        return len(view)

    def tell(self) -> int:
        return self._writer.size

    def close(self) -> None:
        if not self.closed:
            self.pieces = self._writer.close()
        super().close()


def file_pieces(path: Path) -> tuple[int, Pieces]:
    """Size and pieces of a file written by someone else (DeepSpeed's converter)."""
    hasher = PieceHasher(PIECE)
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(32 << 20):
            hasher.update(block)
            size += len(block)
    return size, hasher.finish()


assert PIECE % ALIGN == 0, "pieces must end on aligned offsets"
