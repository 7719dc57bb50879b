"""Process-group setup with explicit timeouts.

torch's defaults (NCCL 10 min, gloo 30 min) make a dead peer look like a hang: a
survivor blocks in ``init_process_group`` or ``all_reduce`` until the timeout. Every
group here is created with ``collectiveTimeoutSeconds``.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist
from llmtrain_contract.names import Env

from llmtrain_trainer.world import DistInfo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_error_handling_env() -> None:
    # Make NCCL surface errors and timeouts as exceptions instead of hanging forever.
    # Harmless on CPU/gloo; set before the first process group exists.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_NCCL_ENABLE_MONITORING", "1")


def init(collective_timeout_seconds: float) -> DistInfo:
    """Initialise the default process group from torchrun's environment.

    Outside torchrun (no ``RANK``), sets up a world of one on loopback so that the
    trainer also runs as a plain process (tests, benchmarks).
    """
    if "RANK" not in os.environ:
        os.environ.update(
            {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0"}
        )
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = backend_name()
    prepare_backend(backend)
    timeout = datetime.timedelta(seconds=collective_timeout_seconds)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend_spec(backend), timeout=timeout)
    return DistInfo.of(dist.get_rank(), dist.get_world_size(), backend, os.environ)


def backend_name() -> str:
    """``LLMTRAIN_DIST_BACKEND``, else NCCL on a GPU and gloo on CPU. NCCL wants one GPU
    per rank; gloo lets several ranks share one GPU, for tests of the multi-rank paths on
    a single device."""
    return os.environ.get(Env.DIST_BACKEND) or ("nccl" if torch.cuda.is_available() else "gloo")


def prepare_backend(backend: str) -> None:
    """What must be set before a process group of ``backend`` exists."""
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"{Env.DIST_BACKEND}={backend!r}: the trainer runs on 'nccl' or 'gloo'")
    _set_error_handling_env()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def backend_spec(backend: str) -> str:
    """What ``init_process_group`` is given. Under NCCL, gloo beside it for CPU tensors:
    the per-step agreement, the restore's choice and broadcasts of host state are
    collectives on CPU tensors, which NCCL alone refuses ("No backend type associated with
    device type cpu") once the world has two ranks."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
