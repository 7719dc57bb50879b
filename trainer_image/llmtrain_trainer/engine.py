"""The training engine interface, and the plain-DDP implementation.

An engine owns the model and optimizer and knows how to run one optimizer step over a
list of micro-batches and how its state is saved and restored. ``engine_deepspeed``
implements the same interface with DeepSpeed.

**Zero-copy snapshots (DDP on CPU).** Parameters and optimizer state live in an *arena*
(``checkpoint/arena.py``): page-aligned memory laid out exactly as the checkpoint file's
payload. A checkpoint of step N freezes that arena where it is: it is written to disk by
direct I/O straight from this memory, while training goes on. The state changes only in
the next optimizer step, and that step computes its results into a second, spare arena
instead of in place (``ArenaOptimizer``; the same arithmetic, the same memory traffic),
then the parameters point there. So a checkpoint costs the training loop no copy at
all: the loop never waits for the state to be copied or written (docs/trainer.md).

**On a GPU** the state stays in device memory; a snapshot is a non-blocking
device-to-host copy on a side stream into a pinned arena, and the next optimizer step
waits for that copy (it overlaps the next forward and backward).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Protocol

import torch
import torch.distributed as dist
from llmtrain_contract.config import OptimizerConfig, TrainerConfig
from llmtrain_store.archive import encode_header
from llmtrain_store.manifest import ENGINE_FILES, FileEntry
from llmtrain_store.sources import MemorySource
from torch.nn.parallel import DistributedDataParallel

from .checkpoint.arena import Arena
from .checkpoint.tensorio import read_arena, write_arena
from .dist import DistInfo, device
from .model import GPT, build_model
from .schedule import lr_at, param_groups

Batch = tuple[torch.Tensor, torch.Tensor]

DDP_STATE_FILE = "state.llmt"
BROADCAST_CHUNK = 256 << 20
"""Bytes per broadcast call when a rank sends the whole state to the others."""


class Snapshot(Protocol):
    """The state of one checkpoint, held until it is written."""

    def write(self, folder: Path) -> dict[str, dict[str, Any]]:
        """Write this rank's engine files into ``folder``; their manifest records."""
        ...

    def release(self) -> None:
        """The files are written (or given up): the memory may change again."""
        ...


class Engine(Protocol):
    """What the trainer and the checkpoint manager need from a strategy."""

    kind: str

    @classmethod
    def create(cls, cfg: TrainerConfig, info: DistInfo, restoring_universal: bool) -> "Engine":
        """Build the engine; ``restoring_universal``: the restore will load a universal
        checkpoint (another world size of a sharded state)."""
        ...

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        """Forward/backward every micro-batch, then one optimizer step. Returns this
        rank's mean micro-batch loss (a 0-d tensor, not yet reduced across ranks)."""
        ...

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (this rank's view)."""
        ...

    sync_started: float
    """``time.perf_counter()`` when the last train step began its last micro-batch's
    backward pass, where the first gradient all-reduce (the first wait for the peers)
    happens: the end of the rank's local share of the step."""

    def snapshot(self) -> Snapshot | None:
        """Capture this rank's state as of now, without copying it on the training path.
        None when this rank writes no engine file (a replicated state is written by the
        node leader)."""
        ...

    def snapshot_free(self) -> bool:
        """Whether a new snapshot can be taken now (the previous one's memory is free)."""
        ...

    def updates(self) -> int:
        """How many optimizer steps this engine's state has taken (restored ones included)."""
        ...

    def can_rescue(self) -> bool:
        """Whether this engine can ever give a rescue snapshot: the whole state replicated
        in every rank and kept in host memory."""
        ...

    def rescue_snapshot(self, updates: int) -> Snapshot | None:
        """A snapshot for a rescue checkpoint, taken from a thread other than the training
        loop's (which may be blocked in a collective), of the state after exactly
        ``updates`` optimizer steps. None when this engine cannot give one: the state is
        sharded (a peer's part is lost with it), not in host memory, being updated, or
        already past that step."""
        ...

    def replicated_files(self) -> set[str]:
        """Files every rank shares (written once per node, stored once per job)."""
        ...

    @staticmethod
    def allowed_names() -> re.Pattern[str]:
        """Every file name this engine writes (a manifest naming anything else is rejected)."""
        ...

    @staticmethod
    def file_rank(name: str) -> int | None:
        """The rank an engine file belongs to; None for files every rank shares."""
        ...

    def load(self, folder: Path, files: dict[str, FileEntry], same_world: bool) -> None:
        """Restore from ``folder`` (whose files are checked against ``files`` as they are
        read); ``same_world`` allows a rank-exact restore."""
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


class ArenaOptimizer:
    """AdamW (decoupled weight decay) or SGD with momentum, whose state lives in an
    arena and which can compute a step into another arena (``step(into=...)``).

    The arithmetic is torch's single-tensor AdamW / SGD, operation for operation; the
    out-of-place form (``torch.mul(..., out=)``, ``torch.lerp(..., out=)``) runs the same
    kernels as the in-place one, so both give the same bits."""

    def __init__(self, cfg: OptimizerConfig, named: list[tuple[str, torch.nn.Parameter]], groups: list[dict[str, Any]]):
        self.cfg = cfg
        self.named = named
        self.weight_decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
        self.steps = 0
        self.lr = cfg.lr
        self.momentum_started = False

    def state_names(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"] if self.cfg.name == "adamw" else ["momentum"]

    @torch.no_grad()
    def step(self, arena: Arena, into: Arena | None = None) -> None:
        """One step from the state in ``arena`` into ``into`` (default: in place)."""
        out = into or arena
        self.steps += 1
        adam = self.cfg.name == "adamw"
        b1, b2, eps, lr = self.cfg.beta1, self.cfg.beta2, 1e-8, self.lr
        if adam:
            step_size = lr / (1 - b1 ** self.steps)
            bc2_sqrt = math.sqrt(1 - b2 ** self.steps)
        for name, param in self.named:
            grad = param.grad
            p, p_out = arena.views[f"param/{name}"], out.views[f"param/{name}"]
            wd = self.weight_decay[id(param)]
            if grad is None:
                if into is not None:
                    p_out.copy_(p)
                    for s in self.state_names():
                        out.views[f"{s}/{name}"].copy_(arena.views[f"{s}/{name}"])
                continue
            if adam:
                m, v = arena.views[f"exp_avg/{name}"], arena.views[f"exp_avg_sq/{name}"]
                m_out, v_out = out.views[f"exp_avg/{name}"], out.views[f"exp_avg_sq/{name}"]
                torch.mul(p, 1 - lr * wd, out=p_out)
                torch.lerp(m, grad, 1 - b1, out=m_out)
                torch.mul(v, b2, out=v_out)
                v_out.addcmul_(grad, grad, value=1 - b2)
                denom = (v_out.sqrt() / bc2_sqrt).add_(eps)
                p_out.addcdiv_(m_out, denom, value=-step_size)
            else:
                buf, buf_out = arena.views[f"momentum/{name}"], out.views[f"momentum/{name}"]
                g = grad.add(p, alpha=wd) if wd else grad
                if self.momentum_started:
                    torch.mul(buf, self.cfg.beta1, out=buf_out)
                    buf_out.add_(g)
                else:
                    buf_out.copy_(g)
                torch.add(p, buf_out, alpha=-lr, out=p_out)
        self.momentum_started = True

    def meta(self) -> dict[str, Any]:
        return {"optimizer": self.cfg.name, "steps": self.steps, "momentum_started": self.momentum_started}

    def restore(self, meta: dict[str, Any]) -> None:
        if meta.get("optimizer") != self.cfg.name:
            raise ValueError(f"the checkpoint's optimizer is {meta.get('optimizer')!r}, this run uses {self.cfg.name!r}")
        self.steps = int(meta["steps"])
        self.momentum_started = bool(meta.get("momentum_started", True))


class DeviceState:
    """GPU: the parameters and optimizer state as device tensors, named like an arena's."""

    def __init__(self, views: dict[str, torch.Tensor]):
        self.views = views


class ArenaSnapshot:
    def __init__(self, engine: "DDPEngine", arena: Arena, meta: dict[str, Any]):
        self.engine, self.arena, self.meta = engine, arena, meta

    def write(self, folder: Path) -> dict[str, dict[str, Any]]:
        size, pieces = write_arena(folder / DDP_STATE_FILE, self.arena, self.meta)
        if len(pieces) == 1:
            return {DDP_STATE_FILE: {"size": size, "hash": pieces[0][2]}}
        return {DDP_STATE_FILE: {"size": size, "slices": [{"name": DDP_STATE_FILE, "offset": o, "size": n, "hash": h, "at": o}
                                                          for o, n, h in pieces]}}

    def images(self) -> dict[str, MemorySource]:
        """The file's bytes as they would be written: header and arena, from memory."""
        return {DDP_STATE_FILE: MemorySource([encode_header(self.meta, self.arena.entries), self.arena.memory()[: self.arena.size]])}

    def release(self) -> None:
        self.engine._released(self.arena)


class DeviceSnapshot(ArenaSnapshot):
    def __init__(self, engine: "DDPEngine", arena: Arena, meta: dict[str, Any], copied: Any):
        super().__init__(engine, arena, meta)
        self.copied = copied

    def write(self, folder: Path) -> dict[str, dict[str, Any]]:
        self.copied.synchronize()
        return super().write(folder)


class DDPEngine:
    """Plain DistributedDataParallel. Model and optimizer state are replicated, so any
    one rank's copy restores any world size."""

    kind = "ddp"

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
        seen: set[int] = set()
        self.named: list[tuple[str, torch.nn.Parameter]] = []
        for name, param in model.named_parameters():
            if param.requires_grad and id(param) not in seen:  # tied weights appear twice
                seen.add(id(param))
                self.named.append((name, param))
        self.optimizer = ArenaOptimizer(cfg.optimizer, self.named, param_groups(model, cfg.optimizer.weight_decay))
        specs = [(f"param/{n}", p.detach()) for n, p in self.named]
        specs += [(f"{s}/{n}", p.detach()) for s in self.optimizer.state_names() for n, p in self.named]
        self._spare: Arena | None = None
        self._frozen: Arena | None = None
        """The arena a snapshot is being written from: no step may change it."""
        self._lock = threading.Lock()
        self._released_cond = threading.Condition(self._lock)
        self._updating = False
        """An optimizer step is changing the live arena (a rescue must not read it)."""
        self._prefault: threading.Thread | None = None
        self._copy_done: Any = None
        if self.dev.type == "cpu":
            self.live: Any = Arena.for_tensors(specs)
            for name, param in self.named:
                self.live.views[f"param/{name}"].copy_(param.detach())
                param.data = self.live.views[f"param/{name}"]
            # Only the node leader writes the replicated state, so only it double-buffers.
            if self.info.is_node_leader:
                self._spare = Arena(self.live.entries)
                self._prefault = self._spare.prefault()
            self.staging: Arena | None = None
        else:
            self.live = DeviceState({f"param/{n}": p.data for n, p in self.named}
                                    | {f"{s}/{n}": torch.zeros_like(p) for s in self.optimizer.state_names() for n, p in self.named})
            self.staging = Arena.for_tensors([(name, t.cpu()) for name, t in self.live.views.items()]) if self.info.is_node_leader else None
            if self.staging is not None:
                self.staging.pin()
        self.model = DistributedDataParallel(model) if info.world_size > 1 else model

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    sync_started = 0.0

    # ------------------------------------------------------------------ training

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        self.optimizer.lr = lr_at(step, self.cfg.optimizer, self.cfg.max_steps)
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
            if last:
                self.sync_started = time.perf_counter()  # the first wait for the peers comes next
            (loss / accum).backward()
            total += loss.detach().float()
        if self.cfg.optimizer.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.optimizer.grad_clip)
        self._optimizer_step()
        for _, param in self.named:
            param.grad = None
        return total / accum

    def _optimizer_step(self) -> None:
        if self._copy_done is not None:  # GPU: the snapshot's copy must finish first
            torch.cuda.current_stream().wait_event(self._copy_done)
            self._copy_done = None
        with self._lock:
            frozen = self._frozen is not None and self._frozen is self.live
            while frozen and self._spare is None:
                # No spare arena (it cannot happen on a node leader, which is the only
                # rank that snapshots): never change memory that is being written.
                self._released_cond.wait()
                frozen = self._frozen is not None and self._frozen is self.live
            target, self._spare = (self._spare, None) if frozen else (None, self._spare)
            self._updating = True
        if target is None:
            try:
                self.optimizer.step(self.live)
            finally:
                with self._lock:
                    self._updating = False
            return
        # The live arena is frozen for a checkpoint being written: compute into the spare.
        if self._prefault is not None:
            self._prefault.join()  # its zero-fill must not race with the step's writes
            self._prefault = None
        try:
            self.optimizer.step(self.live, into=target)
        finally:
            with self._lock:
                self._updating = False
        with self._lock:
            old, self.live = self.live, target
            if self._frozen is not old:
                self._spare = old  # its write finished during this step
        for name, param in self.named:
            param.data = self.live.views[f"param/{name}"]

    # ------------------------------------------------------------------ snapshots

    def snapshot_free(self) -> bool:
        with self._lock:
            return self._frozen is None

    def updates(self) -> int:
        return self.optimizer.steps

    def can_rescue(self) -> bool:
        # GPU: the device state is not readable while a kernel may hang.
        return self.staging is None and self.dev.type == "cpu"

    def rescue_snapshot(self, updates: int) -> ArenaSnapshot | None:
        if not self.info.is_node_leader or not self.can_rescue():
            return None
        with self._lock:
            if self._updating or self._frozen is not None or self.optimizer.steps != updates:
                return None
            self._frozen = self.live
        return ArenaSnapshot(self, self.live, self._meta())

    def snapshot(self) -> ArenaSnapshot | None:
        if not self.info.is_node_leader:
            return None
        if self.staging is not None:
            return self._device_snapshot()
        with self._lock:
            if self._frozen is not None:
                raise RuntimeError("a snapshot is still being written")
            self._frozen = self.live
        return ArenaSnapshot(self, self.live, self._meta())

    def _device_snapshot(self) -> ArenaSnapshot:
        """GPU: copy the state into the pinned arena on a side stream; the next optimizer
        step and the writer wait for that copy, the forward and backward do not."""
        with self._lock:
            if self._frozen is not None:
                raise RuntimeError("a snapshot is still being written")
            self._frozen = self.staging
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for name, tensor in self.live.views.items():
                self.staging.views[name].copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        self._copy_done = done
        return DeviceSnapshot(self, self.staging, self._meta(), done)

    def _released(self, arena: Arena) -> None:
        with self._lock:
            self._frozen = None
            if arena is not self.live and arena is not self.staging:
                self._spare = arena  # written while the steps went on in the other arena
            self._released_cond.notify_all()

    def _meta(self) -> dict[str, Any]:
        return {"engine": self.kind, **self.optimizer.meta()}

    # ------------------------------------------------------------------ restore

    def replicated_files(self) -> set[str]:
        return {DDP_STATE_FILE}

    @staticmethod
    def allowed_names() -> re.Pattern[str]:
        return ENGINE_FILES["ddp"]

    @staticmethod
    def file_rank(name: str) -> int | None:
        return None

    def load(self, folder: Path, files: dict[str, FileEntry], same_world: bool) -> None:
        entry = files[DDP_STATE_FILE]
        target = self.staging if self.staging is not None else self.live
        meta = read_arena(folder / DDP_STATE_FILE, target, [(p.offset, p.size, p.hash) for p in entry.pieces])
        self.optimizer.restore(meta)
        if target is not self.live:
            for name, tensor in self.live.views.items():
                tensor.copy_(target.views[name])

    def broadcast_from(self, src: int) -> None:
        """The whole state from rank ``src`` (which loaded it) to every other rank: the
        arena's bytes in a few large broadcasts, and the optimizer's counters as JSON."""
        arena = self.staging if self.staging is not None else self.live
        if not isinstance(arena, Arena):
            arena = Arena.for_tensors([(name, t.cpu()) for name, t in self.live.views.items()])
            for name, tensor in self.live.views.items():
                arena.views[name].copy_(tensor)
        data = arena.as_bytes_tensor()
        for start in range(0, arena.size, BROADCAST_CHUNK):
            dist.broadcast(data[start:start + BROADCAST_CHUNK], src=src)  # received in place
        if arena is not self.live:
            for name, tensor in self.live.views.items():
                tensor.copy_(arena.views[name])
        meta = broadcast_json(self.optimizer.meta() if self.info.rank == src else None, src)
        self.optimizer.restore(meta)


def broadcast_json(value: Any, src: int) -> Any:
    """A JSON-able value from ``src`` to every rank, as bytes (nothing is unpickled)."""
    payload = json.dumps(value).encode() if dist.get_rank() == src else b""
    length = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(length, src=src)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(int(length), dtype=torch.uint8)
    dist.broadcast(data, src=src)
    return json.loads(bytes(data.numpy()).decode())


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
