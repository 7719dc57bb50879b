"""Where a file's bytes come from when a share of it is stored in a job-wide tier: the
tier-1 file, or (when tier 1 failed) the snapshot still in memory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol


class Source(Protocol):
    size: int

    def read(self, offset: int, length: int) -> bytes: ...


class FileSource:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.size = self.path.stat().st_size

    def read(self, offset: int, length: int) -> bytes:
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            return fh.read(length)


class MemorySource:
    """A file's image as consecutive buffers (e.g. an archive header and an arena)."""

    def __init__(self, segments: list[memoryview | bytes]):
        self.segments = [memoryview(s).cast("B") for s in segments]
        self.size = sum(len(s) for s in self.segments)

    def read(self, offset: int, length: int) -> bytes:
        out = bytearray()
        start = 0
        for seg in self.segments:
            end = start + len(seg)
            if offset < end and length > 0:
                lo = max(offset, start) - start
                take = min(len(seg) - lo, length)
                out += seg[lo:lo + take]
                offset += take
                length -= take
            start = end
        return bytes(out)


def iter_range(source: Source, offset: int, length: int, chunk: int = 32 << 20) -> Iterator[bytes]:
    while length > 0:
        block = source.read(offset, min(chunk, length))
        if not block:
            return
        yield block
        offset += len(block)
        length -= len(block)
