"""Capture and restore every RNG a training process uses, as plain tensors and numbers:
a checkpoint holds no pickled objects, so loading one can never run code."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def capture() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, JSON-able numbers) of every generator's state."""
    return encode(raw())


Raw = tuple[Any, Any, torch.Tensor, list[torch.Tensor]]


def raw() -> Raw:
    """Every generator's state as the libraries return it: about half of ``capture``'s
    cost (tens of microseconds), for taking it at every step and encoding it only when it
    is saved."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return random.getstate(), np.random.get_state(), torch.random.get_rng_state(), cuda


def encode(state: Raw) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    (version, py_state, gauss), (kind, keys, pos, has_gauss, cached), torch_state, cuda = state
    tensors = {
        "python": torch.tensor(py_state, dtype=torch.int64),
        "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "torch": torch_state,
    }
    for i, s in enumerate(cuda):
        tensors[f"cuda/{i}"] = s
    meta = {"python_version": version, "python_gauss": gauss, "numpy_kind": kind, "numpy_pos": int(pos),
            "numpy_has_gauss": int(has_gauss), "numpy_cached": float(cached)}
    return tensors, meta


def restore(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    random.setstate((int(meta["python_version"]), tuple(int(x) for x in tensors["python"].tolist()), meta["python_gauss"]))
    np.random.set_state((meta["numpy_kind"], tensors["numpy"].numpy().astype(np.uint32), int(meta["numpy_pos"]),
                         int(meta["numpy_has_gauss"]), float(meta["numpy_cached"])))
    torch.random.set_rng_state(tensors["torch"].to(torch.uint8))
    cuda = sorted(k for k in tensors if k.startswith("cuda/"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k].to(torch.uint8) for k in cuda])


def seed_all(seed: int) -> None:
    """Seed every RNG (used when no saved state fits this rank, e.g. a new world size)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def step_seed(seed: int, rank: int, step: int) -> int:
    """A seed for ``rank``'s generators at ``step``, distinct for every pair: a rank
    restarted in process reseeds to what its predecessor would have drawn."""
    digest = hashlib.blake2b(f"{seed}/{rank}/{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # torch.manual_seed takes up to 2**63 - 1 as a signed int
