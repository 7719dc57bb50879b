"""Each rank's RNG state in a checkpoint: its file name, its bytes, and reading it back
verified from whichever tier holds a copy.

The state is plain tensors and numbers (``engines/rng.py``) in the tensor archive format:
a checkpoint holds no pickled objects, so loading one can never run code.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from llmtrain_store import manifest as mf
from llmtrain_store.archive import ArchiveError, encode_header
from llmtrain_store.directory import DirTier
from llmtrain_store.tier import Tier

from llmtrain_trainer.state.arena import Arena
from llmtrain_trainer.checkpoint.protocol import RngState
from llmtrain_trainer.state.tensorio import ChecksumMismatch, read_tensors

log = logging.getLogger("llmtrain.checkpoint")


def rng_file(rank: int) -> str:
    return f"rng/rank-{rank:05d}.llmt"


def encode_tensor_archive(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> bytes:
    """A small archive's bytes in memory (the RNG state)."""
    arena = Arena.for_tensors(sorted(tensors.items()))
    for name, tensor in tensors.items():
        arena.views[name].copy_(tensor)
    return encode_header(meta, arena.entries) + bytes(arena.memory()[: arena.size])


class RngReader:
    """Reads one rank's saved RNG state of a step, trying each copy in turn."""

    def __init__(self, tiers: list[Tier], rank: int, allowed: re.Pattern[str]):
        self.tiers = tiers
        self.rank = rank
        self.allowed = allowed

    def read(self, step: int, name: str, first: Path | None) -> RngState | None:
        """The RNG archive ``name`` of ``step``, verified: from the folder ``first``, else
        from each tier's copy in turn (fastest first). Each copy that does not verify is
        logged with the reason."""
        tried: set[str] = set()
        if first is not None:
            found = self._from_folder(Path(first), name, "loaded copy", step)
            if found is not None:
                return found
            tried.add(str(first))
        for tier in self.tiers:
            try:
                copies = [c for c in tier.list() if c.step == step and c.location not in tried]
            except Exception as err:  # noqa: BLE001 - another tier may still have it
                log.debug("%s tier: cannot list (%s)", tier.name, type(err).__name__)
                continue
            for copy in copies:
                try:
                    files = mf.entries(copy.manifest, self.allowed)
                    if name not in files:
                        continue
                    if isinstance(tier, DirTier):
                        found = self._from_folder(Path(copy.location), name, f"{tier.name} tier", step)
                    else:
                        with tempfile.TemporaryDirectory(prefix="rng-") as scratch:
                            tier.fetch(copy, [name], Path(scratch), self.allowed)
                            data = (Path(scratch) / name).read_bytes()
                        found = self._decode(data, files[name], f"{tier.name} tier", step)
                except Exception as err:  # noqa: BLE001 - a copy that cannot be read is skipped, with why
                    log.warning("rank %d: its saved RNG state of step %d in the %s tier is not usable (%s)",
                                self.rank, step, tier.name, err)
                    continue
                if found is not None:
                    return found
        return None

    def _from_folder(self, folder: Path, name: str, where: str, step: int) -> RngState | None:
        try:
            files = mf.entries(json.loads((folder / mf.MANIFEST).read_text()), self.allowed)
            if name not in files:
                return None
            return self._decode(mf.inside(folder, name).read_bytes(), files[name], where, step)
        except (OSError, ValueError, mf.ManifestRejected) as err:
            log.warning("rank %d: its saved RNG state of step %d (%s) is not usable (%s)", self.rank, step, where, err)
            return None

    def _decode(self, data: bytes, entry: mf.FileEntry, where: str, step: int) -> RngState | None:
        try:
            return read_tensors(data, [(p.offset, p.size, p.hash) for p in entry.pieces])
        except (ChecksumMismatch, ArchiveError, ValueError) as err:
            log.warning("rank %d: its saved RNG state of step %d (%s) is not usable (%s)", self.rank, step, where, err)
            return None
