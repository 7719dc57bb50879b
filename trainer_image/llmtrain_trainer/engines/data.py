"""Deterministic samples addressed by *global sample index*.

The data position is one integer, ``samples_consumed``, not a per-rank iterator state.
Optimizer step ``s`` always consumes samples ``[s*G, (s+1)*G)`` (G = global batch), and
the split of that range over ranks and micro-steps is a pure function of the world
size. So a resume at another world size continues at exactly the same sample.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from llmtrain_contract.config import DataConfig

BUILTIN_SHARD = Path(__file__).with_name("shards") / "tiny_shard.bin"


class DataError(Exception):
    """Training data is missing or unusable (permanent: exit DATA_ERROR)."""


class SampleSource(Protocol):
    seq_len: int

    def batch(self, indices: range) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and next-token targets, each of shape (len(indices), seq_len)."""
        ...


def _mix(*values: int) -> int:
    """A 63-bit hash of integers (splitmix64), stable across processes and versions."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = (x ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 29
    return x & 0x7FFFFFFFFFFFFFFF


class SyntheticSource:
    """Pseudo-random sequences with learnable structure.

    Each sample is an arithmetic progression ``start + stride*t (mod V)`` with a few
    tokens replaced by noise: a model can learn it (the loss visibly falls), and sample
    ``i`` is a pure function of ``(seed, i)``.
    """

    def __init__(self, seq_len: int, vocab_size: int, seed: int):
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.seed = seed
        self._t = np.arange(seq_len + 1, dtype=np.int64)

    def _sample(self, index: int) -> np.ndarray:
        rng = np.random.Generator(np.random.Philox(key=_mix(self.seed, index)))
        start = int(rng.integers(self.vocab_size))
        stride = int(rng.integers(1, 8))
        seq = (start + stride * self._t) % self.vocab_size
        noise = rng.random(self.seq_len + 1) < 0.05
        seq[noise] = rng.integers(self.vocab_size, size=int(noise.sum()))
        return seq

    def batch(self, indices: range) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(np.stack([self._sample(i) for i in indices]))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class ShardSource:
    """nanoGPT-style ``.bin`` shards of uint16 tokens, memory-mapped.

    The token stream (all shards, sorted by name) is cut into non-overlapping windows of
    ``seq_len + 1`` tokens. Epoch ``e`` visits every window once in an order given by an
    affine bijection ``w -> (a*w + b) mod W`` seeded by ``(seed, e)``: shuffled, yet O(1)
    per sample and without any stored permutation.
    """

    def __init__(self, path: str, seq_len: int, seed: int, vocab_limit: int):
        files = self._files(path)
        self.seq_len = seq_len
        self.seed = seed
        self._maps = [np.memmap(f, dtype=np.uint16, mode="r") for f in files]
        self._offsets = np.cumsum([0] + [len(m) for m in self._maps])
        total = int(self._offsets[-1])
        self.windows = (total - 1) // (seq_len + 1)
        if self.windows < 1:
            raise DataError(f"data at {path} holds {total} tokens, fewer than one sample of seqLen+1={seq_len + 1}")
        top = int(max(int(m.max()) for m in self._maps))
        if top >= vocab_limit:
            raise DataError(f"data at {path} has token id {top}, outside the model's vocabulary of {vocab_limit}")

    @staticmethod
    def _files(path: str) -> list[Path]:
        root = Path(path)
        if not root.exists():
            raise DataError(f"data path {path} does not exist")
        files = sorted(root.glob("*.bin")) if root.is_dir() else [root]
        if not files:
            raise DataError(f"data directory {path} holds no .bin shards")
        for f in files:
            if not os.access(f, os.R_OK):
                raise DataError(f"data shard {f} is not readable")
            if f.stat().st_size % 2:
                raise DataError(f"data shard {f} has an odd size; expected uint16 tokens")
        return files

    def _window(self, index: int) -> int:
        epoch, i = divmod(index, self.windows)
        w = self.windows
        a = _mix(self.seed, epoch, 1) % w or 1
        while np.gcd(a, w) != 1:  # a must be coprime with W for a bijection
            a = a + 1 if a + 1 < w else 1
        b = _mix(self.seed, epoch, 2) % w
        return (a * i + b) % w

    def _tokens(self, start: int, length: int) -> np.ndarray:
        out = np.empty(length, dtype=np.int64)
        filled = 0
        while filled < length:
            shard = int(np.searchsorted(self._offsets, start + filled, side="right") - 1)
            local = start + filled - int(self._offsets[shard])
            take = min(length - filled, len(self._maps[shard]) - local)
            out[filled : filled + take] = self._maps[shard][local : local + take]
            filled += take
        return out

    def batch(self, indices: range) -> tuple[torch.Tensor, torch.Tensor]:
        span = self.seq_len + 1
        rows = torch.from_numpy(np.stack([self._tokens(self._window(i) * span, span) for i in indices]))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def build_source(cfg: DataConfig, seed: int, model_vocab: int) -> SampleSource:
    if cfg.source == "synthetic":
        return SyntheticSource(cfg.seq_len, cfg.vocab_size or model_vocab, seed)
    path = cfg.path or ""
    if path == "builtin:tiny":
        path = str(BUILTIN_SHARD)
    return ShardSource(path, cfg.seq_len, seed, model_vocab)


def micro_batch_indices(step: int, micro_step: int, rank: int, world: int, global_batch: int, micro_batch: int) -> range:
    """Global sample indices of one rank's micro-batch.

    Step ``step`` owns ``[step*G, (step+1)*G)``; micro-step ``a`` of it owns the
    ``world*micro_batch`` samples starting at ``a*world*micro_batch``; rank ``r`` takes its
    slice. Together the ranks and micro-steps of one step cover the range exactly once.
    """
    start = step * global_batch + micro_step * world * micro_batch + rank * micro_batch
    return range(start, start + micro_batch)
