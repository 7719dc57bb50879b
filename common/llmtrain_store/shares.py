"""How a replicated file is split between the nodes of a job for a job-wide tier: each
node stores a run of whole pieces, the runs balanced by bytes, so that persisting the
file once per job takes each node 1/N of the time."""

from __future__ import annotations

import hashlib
from typing import Any

from .manifest import slice_name


def split(pieces: list[tuple[int, int, str]], nodes: int) -> list[list[tuple[int, int, str]]]:
    """Contiguous runs of ``pieces`` (offset, size, hash), one per node (possibly empty
    when there are fewer pieces than nodes), as even in bytes as whole pieces allow."""
    total = sum(size for _, size, _ in pieces)
    runs: list[list[tuple[int, int, str]]] = [[] for _ in range(nodes)]
    node, done = 0, 0
    for piece in pieces:
        # Move on once this node has its fair share (by the start of the piece).
        while node < nodes - 1 and done >= total * (node + 1) / nodes:
            node += 1
        runs[node].append(piece)
        done += piece[1]
    return runs


def share_record(name: str, index: int, count: int, run: list[tuple[int, int, str]]) -> list[dict[str, Any]]:
    """The manifest pieces of node ``index``'s share stored as one object."""
    obj = slice_name(name, index, count)
    out: list[dict[str, Any]] = []
    at = 0
    for offset, size, digest in run:
        out.append({"name": obj, "offset": offset, "size": size, "hash": digest, "at": at})
        at += size
    return out


def fingerprint(pieces: list[tuple[int, int, str]]) -> str:
    """One digest of a whole file's piece list. The nodes' copies of a replicated file
    must be byte-identical for their shares to compose one file: a commit compares the
    fingerprints each node reports of its own whole copy."""
    listing = ";".join(f"{offset}:{size}:{digest}" for offset, size, digest in pieces)
    return hashlib.sha256(listing.encode()).hexdigest()[:32]
