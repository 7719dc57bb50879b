"""The tensor archive: how a checkpoint's state is laid out on disk.

    "LLMTARC1" | header length (8 bytes, little endian) | header JSON | padding to 4 KiB
    | the payload: every tensor's bytes, each at a 4 KiB-aligned offset

The header holds JSON metadata and, per tensor, its name, dtype, shape, offset (from the
start of the payload) and length. Nothing is pickled, so reading an archive can never run
code (unlike ``torch.load`` with ``weights_only=False``), and every byte of the payload can
be written with direct I/O straight from page-aligned memory: the trainer keeps its state
in such memory (an *arena*) so that a checkpoint needs no copy at all.

Torch-free: a payload is a buffer; the trainer turns tensors into buffers and back.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

MAGIC = b"LLMTARC1"
ALIGN = 4096
"""Direct I/O wants offsets, lengths and memory aligned to the logical block size;
4 KiB covers every common device."""
MAX_HEADER = 64 << 20
"""An archive header larger than this is refused as corrupt (a real one is kilobytes)."""


class ArchiveError(Exception):
    """A file is not a readable archive; the message says why."""


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    """A torch dtype name without the ``torch.`` prefix, e.g. ``float32``."""
    shape: tuple[int, ...]
    offset: int
    """From the start of the payload; a multiple of ``ALIGN``."""
    nbytes: int


@dataclass(frozen=True)
class Header:
    meta: dict[str, Any]
    tensors: tuple[TensorEntry, ...]
    payload_offset: int
    """Where the payload starts in the file (a multiple of ``ALIGN``)."""
    payload_size: int
    """The payload's length, padding included (a multiple of ``ALIGN``)."""

    @property
    def file_size(self) -> int:
        return self.payload_offset + self.payload_size

    def entry(self, name: str) -> TensorEntry:
        for entry in self.tensors:
            if entry.name == name:
                return entry
        raise ArchiveError(f"no tensor {name!r} in the archive")


def layout(specs: list[tuple[str, str, tuple[int, ...], int]]) -> list[TensorEntry]:
    """Offsets for tensors (name, dtype, shape, nbytes) packed at aligned offsets, in order."""
    out, offset = [], 0
    for name, dtype, shape, nbytes in specs:
        out.append(TensorEntry(name, dtype, tuple(shape), offset, nbytes))
        offset += aligned(max(nbytes, 1))
    return out


def payload_size(entries: list[TensorEntry] | tuple[TensorEntry, ...]) -> int:
    return max((e.offset + aligned(max(e.nbytes, 1)) for e in entries), default=0)


META_ROOM = 8 << 10
"""Bytes of the header kept for its metadata (step counts, settings: a few hundred)."""


def encode_header(meta: dict[str, Any], entries: list[TensorEntry] | tuple[TensorEntry, ...]) -> bytes:
    """The header block, padded so that the payload starts aligned. The JSON is padded
    with spaces to a length set by the tensors alone (plus ``META_ROOM``), so that the
    payload starts at the same offset in every checkpoint of a run whatever its metadata
    says: a step count gaining a digit must not shift every tensor by 4 KiB, or none of
    the pieces a content-addressed tier already holds (``pieces.py``) would match."""
    doc = {
        "meta": meta,
        "payload_size": payload_size(entries),
        "tensors": [{"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "offset": e.offset, "nbytes": e.nbytes}
                    for e in entries],
    }
    body = json.dumps(doc, sort_keys=True).encode()
    room = aligned(16 + len(json.dumps({**doc, "meta": {}}, sort_keys=True)) + META_ROOM) - 16
    body += b" " * max(0, room - len(body))  # JSON allows trailing whitespace
    head = MAGIC + struct.pack("<Q", len(body)) + body
    return head + b"\0" * (aligned(len(head)) - len(head))


def decode_header(prefix: bytes, file_size: int | None = None) -> Header:
    """Parse a header from the file's first bytes (at least the whole header block).
    Every offset and length is checked against the payload and, given ``file_size``,
    against the file: a corrupt header fails here, not while loading."""
    if len(prefix) < 16 or prefix[:8] != MAGIC:
        raise ArchiveError("not an llmtrain tensor archive (bad magic)")
    (length,) = struct.unpack("<Q", prefix[8:16])
    if length > MAX_HEADER:
        raise ArchiveError(f"header length {length} is implausible")
    if len(prefix) < 16 + length:
        raise ArchiveError("the header is truncated")
    try:
        doc = json.loads(prefix[16:16 + length])
        tensors = tuple(TensorEntry(t["name"], t["dtype"], tuple(int(x) for x in t["shape"]), int(t["offset"]), int(t["nbytes"]))
                        for t in doc["tensors"])
        size = int(doc["payload_size"])
        meta = doc["meta"]
    except (ValueError, KeyError, TypeError) as err:
        raise ArchiveError(f"the header is not valid: {err}") from None
    start = aligned(16 + length)
    for t in tensors:
        if t.offset % ALIGN or t.offset < 0 or t.nbytes < 0 or t.offset + t.nbytes > size:
            raise ArchiveError(f"tensor {t.name!r} lies outside the payload")
    if size % ALIGN:
        raise ArchiveError("the payload size is not aligned")
    if file_size is not None and start + size != file_size:
        raise ArchiveError(f"the file has {file_size} bytes, the header describes {start + size}")
    return Header(meta if isinstance(meta, dict) else {}, tensors, start, size)


def header_block_size(prefix: bytes) -> int:
    """How many bytes the header block takes, from the file's first 16 bytes."""
    if len(prefix) < 16 or prefix[:8] != MAGIC:
        raise ArchiveError("not an llmtrain tensor archive (bad magic)")
    (length,) = struct.unpack("<Q", prefix[8:16])
    if length > MAX_HEADER:
        raise ArchiveError(f"header length {length} is implausible")
    return aligned(16 + length)
