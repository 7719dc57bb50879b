"""The training engine interface, and the plain-DDP implementation.

An engine owns the model and optimizer and knows how to run one optimizer step over a
list of micro-batches and how its state is saved and restored. ``engine_deepspeed``
implements the same interface with DeepSpeed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from llmtrain_contract.config import TrainerConfig
from .dist import DistInfo, device
from .model import GPT, build_model
from .schedule import lr_at, param_groups

Batch = tuple[torch.Tensor, torch.Tensor]

DDP_STATE_FILE = "state.pt"


class Engine(Protocol):
    """What the trainer and the checkpoint manager need from a strategy."""

    kind: str

    @classmethod
    def create(cls, cfg: TrainerConfig, info: DistInfo, restoring_universal: bool) -> "Engine":
        """Build the engine; ``restoring_universal``: the restore will load a universal
        checkpoint (another world size of a sharded state)."""
        ...
    # False when snapshot() cannot copy state off the training path (DeepSpeed writes
    # straight from its partitioned buffers), so a save must write synchronously.
    async_capable: bool

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        """Forward/backward every micro-batch, then one optimizer step. Returns this
        rank's mean micro-batch loss (a 0-d tensor, not yet reduced across ranks)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """In-memory copy of the state this rank must persist (for async writes)."""
        ...

    def write_snapshot(self, snap: Any, folder: Path) -> list[str]:
        """Write this rank's files into ``folder``; returns their relative names."""
        ...

    def replicated_files(self) -> set[str]:
        """Files every rank shares (written once per node, copied once per job)."""
        ...

    @staticmethod
    def file_rank(name: str) -> int | None:
        """The rank an engine file belongs to; None for files every rank shares."""
        ...

    def load(self, folder: Path, same_world: bool) -> None:
        """Restore from ``folder``; ``same_world`` allows a rank-exact restore."""
        ...


def engine_class(kind: str) -> Any:
    """The engine of a strategy, the one place that chooses it. DeepSpeed is imported
    only when chosen: it is heavy, and a DDP job never needs it."""
    if kind == "deepspeed":
        from .engine_deepspeed import DeepSpeedEngine  # noqa: PLC0415 - heavy, and engine_deepspeed imports this module

        return DeepSpeedEngine
    return DDPEngine


def _dtype(cfg: TrainerConfig) -> torch.dtype:
    if cfg.model.dtype == "bfloat16" or (
        cfg.model.dtype == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    ):
        return torch.bfloat16
    return torch.float32


def make_model(cfg: TrainerConfig) -> GPT:
    shape = cfg.model.shape(cfg.data.seq_len)
    return build_model(shape, cfg.model.dropout, cfg.model.activation_checkpointing, cfg.seed)


def _clone_to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _clone_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_to_cpu(v) for v in obj)
    return obj


class DDPEngine:
    """Plain DistributedDataParallel. Model and optimizer state are replicated, so any
    one rank's copy restores any world size."""

    kind = "ddp"
    async_capable = True

    @classmethod
    def create(cls, cfg: TrainerConfig, info: DistInfo, restoring_universal: bool) -> "DDPEngine":
        # The state is replicated: any copy restores any world size, there is no universal form.
        return cls(cfg, info)

    def __init__(self, cfg: TrainerConfig, info: DistInfo):
        self.cfg = cfg
        self.info = info
        self.dev = device()
        self.autocast_dtype = _dtype(cfg)
        model = make_model(cfg).to(self.dev)
        self.module = model
        self.model = DistributedDataParallel(model) if info.world_size > 1 else model
        opt = cfg.optimizer
        groups = param_groups(model, opt.weight_decay)
        if opt.name == "sgd":
            self.optimizer = torch.optim.SGD(groups, lr=opt.lr, momentum=opt.beta1)
        else:
            self.optimizer = torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=1e-8)

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        lr = lr_at(step, self.cfg.optimizer, self.cfg.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        total = torch.zeros((), device=self.dev)
        accum = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            x, y = x.to(self.dev, non_blocking=True), y.to(self.dev, non_blocking=True)
            last = i == accum - 1
            # Skip the gradient all-reduce on all but the last micro-batch.
            sync = self.model.no_sync() if (not last and isinstance(self.model, DistributedDataParallel)) else _null()
            with sync, torch.autocast(self.dev.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype != torch.float32):
                loss = self.model(x, y)
            (loss / accum).backward()
            total += loss.detach().float()
        if self.cfg.optimizer.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.optimizer.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total / accum

    def snapshot(self) -> dict[str, Any]:
        return {
            "model": _clone_to_cpu(self.module.state_dict()),
            "optimizer": _clone_to_cpu(self.optimizer.state_dict()),
        }

    def write_snapshot(self, snap: dict[str, Any], folder: Path) -> list[str]:
        """Persist this rank's share. State is replicated, so only a node leader writes it."""
        if not self.info.is_node_leader:
            return []
        torch.save(snap, folder / DDP_STATE_FILE)
        return [DDP_STATE_FILE]

    def replicated_files(self) -> set[str]:
        return {DDP_STATE_FILE}

    @staticmethod
    def file_rank(name: str) -> int | None:
        return None

    def load(self, folder: Path, same_world: bool) -> None:
        self.load_state(torch.load(folder / DDP_STATE_FILE, map_location=self.dev, weights_only=True))

    def load_state(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def all_reduce_mean(value: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1:
        dist.all_reduce(value)
        value /= world_size
    return value
