"""The plain-DDP engine (``base.Engine``): the model and optimizer state replicated in
every rank, so that any one rank's copy restores any world size.

**Zero-copy snapshots (DDP on CPU).** Parameters and optimizer state live in an *arena*
(``state/arena.py``): page-aligned memory laid out exactly as the checkpoint file's
payload. A checkpoint of step N freezes that arena where it is: it is written to disk by
direct I/O straight from this memory, while training goes on. The state changes only in
the next optimizer step, and that step computes its results into a second, spare arena
instead of in place (``ArenaOptimizer``; the same arithmetic, the same memory traffic),
then the parameters point there. So a checkpoint costs the training loop no copy at
all: the loop never waits for the state to be copied or written (docs/trainer.md).

**On a GPU** the state stays in device memory; a snapshot is a non-blocking
device-to-host copy on a side stream into a pinned arena, and the next optimizer step
waits for that copy (it overlaps the next forward and backward).

**Frozen parameters** (``freeze``, ``lora``) are in the arena too, so that a checkpoint
restores the whole model by itself (``frozen/<name>``, no optimizer state), and they come
first, in one contiguous run, before every trainable parameter and moment. The store
hashes a file in fixed pieces at absolute offsets and keeps a piece it already holds
once: bytes that never change, at the same offsets in every checkpoint, are the same
pieces each time, so a fine-tune's checkpoints store the frozen model once. Without
frozen parameters the layout is what it always was (``param/``, then the moments).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from llmtrain_contract.config import TrainerConfig
from llmtrain_store.archive import encode_header
from llmtrain_store.manifest import ENGINE_FILES, FileEntry
from llmtrain_store.sources import MemorySource
from torch.nn.parallel import DistributedDataParallel

from llmtrain_trainer.state.arena import Arena
from llmtrain_trainer.checkpoint.protocol import Choice, manifest_files
from llmtrain_trainer.state.tensorio import read_arena, write_arena
from llmtrain_trainer.engines.base import Batch, device
from llmtrain_trainer.engines.model import make_model
from llmtrain_trainer.engines.optim import ArenaOptimizer
from llmtrain_trainer.engines.schedule import lr_at, param_groups
from llmtrain_trainer.world import DistInfo

DDP_STATE_FILE = "state.llmt"
FROZEN = "frozen/"
"""The arena's prefix of the frozen parameters (trainable ones are ``param/``)."""
Named = list[tuple[str, torch.nn.Parameter]]
BROADCAST_CHUNK = 256 << 20
"""Bytes per broadcast call when a rank sends the whole state to the others."""


def _dtype(cfg: TrainerConfig) -> torch.dtype:
    if cfg.model.dtype == "bfloat16" or (
        cfg.model.dtype == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    ):
        return torch.bfloat16
    return torch.float32


class DeviceState:
    """GPU: the parameters and optimizer state as device tensors, named like an arena's."""

    def __init__(self, views: dict[str, torch.Tensor]):
        self.views = views


class ArenaSnapshot:
    def __init__(self, engine: DDPEngine, arena: Arena, meta: dict[str, Any]):
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
    def __init__(self, engine: DDPEngine, arena: Arena, meta: dict[str, Any], copied: Any):
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
    def create(cls, cfg: TrainerConfig, info: DistInfo, restoring_universal: bool) -> DDPEngine:
        # The state is replicated: any copy restores any world size, there is no universal form.
        return cls(cfg, info)

    def __init__(self, cfg: TrainerConfig, info: DistInfo):
        self.cfg = cfg
        self.info = info
        self.dev = device()
        self.autocast_dtype = _dtype(cfg)
        model = make_model(cfg).to(self.dev)
        self.module = model
        self.named, self.frozen_named = split_parameters(model)
        """The trainable parameters (what the optimizer steps) and the frozen ones."""
        self.optimizer = ArenaOptimizer(cfg.optimizer, self.named, param_groups(model, cfg.optimizer.weight_decay))
        specs = [(FROZEN + n, p.detach()) for n, p in self.frozen_named]  # first: see the module's docstring
        specs += [(f"param/{n}", p.detach()) for n, p in self.named]
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
        self._frozen_copied: set[int] = set()
        """The arenas (by id) whose frozen entries hold the model's frozen values: the live
        state always; another arena once they were copied into it (``_sync_frozen``)."""
        if self.dev.type == "cpu":
            self.live: Any = Arena.for_tensors(specs)
            for name, param in self._arena_params():
                self.live.views[name].copy_(param.detach())
                param.data = self.live.views[name]
            self._frozen_copied = {id(self.live)}
            # Only the node leader writes the replicated state, so only it double-buffers.
            if self.info.is_node_leader:
                self._spare = Arena(self.live.entries)
                self._prefault = self._spare.prefault()
            self.staging: Arena | None = None
        else:
            self.live = DeviceState({FROZEN + n: p.data for n, p in self.frozen_named}
                                    | {f"param/{n}": p.data for n, p in self.named}
                                    | {f"{s}/{n}": torch.zeros_like(p) for s in self.optimizer.state_names() for n, p in self.named})
            self.staging = Arena.for_tensors(list(self.live.views.items())) if self.info.is_node_leader else None
            if self.staging is not None:
                self.staging.pin()
        # In-process healing: no broadcast of rank 0's parameters here. A rank restarted
        # into a job that goes on builds this with its survivors, who only re-wrap
        # (``rewrap``), and gets the state from them after; every other start builds the
        # same model from the seed and restores the same step.
        self._init_sync = not cfg.fault_tolerance.in_process_healing
        self.model: torch.nn.Module = model
        if info.world_size > 1:
            self._wrap()

    def unwrap(self) -> None:
        """Let go of the DDP wrapper, and with it of the process group it holds."""
        self.model = self.module

    def rewrap(self) -> None:
        """A new default process group (in-process healing): the DDP wrapper on it. Its
        construction is a collective (DDP checks the parameters' shapes across ranks),
        matched by a replacement rank's ``__init__``. The failed step's gradients go:
        the step runs again from its start."""
        self.module.zero_grad(set_to_none=True)
        if self.info.world_size > 1:
            self._wrap()

    def _wrap(self) -> None:
        """The DDP wrapper, with the gradient buckets it would have after its first step.

        DDP starts with one bucket of every parameter and, at its second forward, rebuilds
        its buckets once in the order the first backward produced the gradients. From
        three ranks on, where an element falls in its bucket decides the order of the
        additions of its ring all-reduce, so a run that wrapped anew (a restart, a heal)
        would sum its next step's gradients otherwise than a run that went on (measured:
        4 ranks' losses differed by 1e-7 after a heal; 3 and 4 ranks' parameters after a
        re-wrap alone). A backward of a zero loss on two tokens here gives DDP that order,
        and the first real forward rebuilds the buckets, as every wrap does now: every
        step, the first included, sums in the same layout. It costs one all-reduce of zeros
        (all ranks wrap together: ``__init__`` of a replacement matches its survivors'
        ``rewrap``) and leaves the generators as they were. With two ranks a + b = b + a:
        not done."""
        self.model = DistributedDataParallel(self.module, init_sync=self._init_sync)
        if self.info.world_size < 3:
            return
        tokens = torch.zeros((1, 2), dtype=torch.long, device=self.dev)
        with torch.random.fork_rng(devices=[self.dev] if self.dev.type == "cuda" else []):
            with torch.autocast(self.dev.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype != torch.float32):
                loss = self.model(tokens, tokens)
            (loss * 0).backward()
        self.module.zero_grad(set_to_none=True)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def _arena_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """Every parameter with the name of its arena entry."""
        return [(FROZEN + n, p) for n, p in self.frozen_named] + [(f"param/{n}", p) for n, p in self.named]

    def _sync_frozen(self, arena: Arena) -> None:
        """Copy the frozen entries into ``arena`` unless it holds them already. Nothing
        changes them but a restore, so this copies once per arena, not per step (a
        step into the spare arena writes only what the optimizer steps)."""
        if id(arena) in self._frozen_copied:
            return
        for name, param in self.frozen_named:
            arena.views[FROZEN + name].copy_(param.detach())
        self._frozen_copied.add(id(arena))

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
            sync = self.model.no_sync() if (not last and isinstance(self.model, DistributedDataParallel)) else contextlib.nullcontext()
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
                if self.dev.type == "cuda" and self.cfg.optimizer.name == "adamw":
                    self.optimizer.step_fused(self.live.views)
                else:
                    self.optimizer.step(self.live)
            finally:
                with self._lock:
                    self._updating = False
            return
        # The live arena is frozen for a checkpoint being written: compute into the spare.
        if self._prefault is not None:
            self._prefault.join()  # its zero-fill must not race with the step's writes
            self._prefault = None
        self._sync_frozen(target)  # the step writes only the trainable state into it
        try:
            self.optimizer.step(self.live, into=target)
        finally:
            with self._lock:
                self._updating = False
        with self._lock:
            old, self.live = self.live, target
            if self._frozen is not old:
                self._spare = old  # its write finished during this step
        for name, param in self._arena_params():
            param.data = self.live.views[name]

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
            return self._device_snapshot(self.staging)
        with self._lock:
            if self._frozen is not None:
                raise RuntimeError("a snapshot is still being written")
            self._frozen = self.live
        return ArenaSnapshot(self, self.live, self._meta())

    def _device_snapshot(self, staging: Arena) -> ArenaSnapshot:
        """GPU: copy the state into the pinned arena (``self.staging``) on a side stream;
        the next optimizer step and the writer wait for that copy, the forward and backward
        do not."""
        with self._lock:
            if self._frozen is not None:
                raise RuntimeError("a snapshot is still being written")
            self._frozen = staging
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # Frozen parameters too: the staging arena is the checkpoint's payload.
            for name, tensor in self.live.views.items():
                staging.views[name].copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        self._copy_done = done
        return DeviceSnapshot(self, staging, self._meta(), done)

    def _released(self, arena: Arena) -> None:
        with self._lock:
            self._frozen = None
            if arena is not self.live and arena is not self.staging:
                self._spare = arena  # written while the steps went on in the other arena
            self._released_cond.notify_all()

    def _meta(self) -> dict[str, Any]:
        # The adapters' settings, for what reads the file without the job's config (an
        # export that merges them into the weights needs alpha / rank).
        lora = {"lora": self.cfg.lora.model_dump(mode="json")} if self.cfg.lora is not None else {}
        return {"engine": self.kind, **self.optimizer.meta(), **lora}

    # ------------------------------------------------------------------ restore

    def replicated_files(self) -> set[str]:
        return {DDP_STATE_FILE}

    @staticmethod
    def allowed_names() -> re.Pattern[str]:
        return ENGINE_FILES["ddp"]

    @staticmethod
    def file_rank(name: str) -> int | None:
        return None

    def restore(self, choice: Choice, folder: Path | None, heartbeat: Callable[[], None]) -> None:
        """The state is replicated: a rank holding a verified copy loads it, and a
        ``broadcast`` restore then sends it from ``choice.source_rank`` to every rank
        that has none (a replacement node with an empty disk)."""
        if folder is not None:
            self.load(folder, manifest_files(folder, self.allowed_names()))
        if choice.mode == "broadcast":
            self.broadcast_from(choice.source_rank)

    def load(self, folder: Path, files: dict[str, FileEntry]) -> None:
        entry = files[DDP_STATE_FILE]
        target = self.staging if self.staging is not None else self.live
        if not isinstance(target, Arena):
            # A GPU rank that is not its node's leader has no staging arena: a host buffer
            # for this read only (every rank restores; only the leader snapshots).
            target = Arena.for_tensors(list(self.live.views.items()))
        meta = read_arena(folder / DDP_STATE_FILE, target, [(p.offset, p.size, p.hash) for p in entry.pieces])
        self.optimizer.restore(meta)
        if target is not self.live:
            for name, tensor in self.live.views.items():
                tensor.copy_(target.views[name])
        self._frozen_copied = {id(self.live)}  # restored: another arena's copy may be stale

    def broadcast_from(self, src: int) -> None:
        """The whole state from rank ``src`` (which loaded it) to every other rank: the
        arena's bytes in a few large broadcasts, and the optimizer's counters as JSON."""
        arena = self.staging if self.staging is not None else self.live
        if not isinstance(arena, Arena):
            arena = Arena.for_tensors(list(self.live.views.items()))  # the layout only: no copy
            for name, tensor in self.live.views.items():
                arena.views[name].copy_(tensor)
        data = arena.as_bytes_tensor()
        for start in range(0, arena.size, BROADCAST_CHUNK):
            dist.broadcast(data[start:start + BROADCAST_CHUNK], src=src)  # received in place
        if arena is not self.live:
            for name, tensor in self.live.views.items():
                tensor.copy_(arena.views[name])
        self._frozen_copied = {id(self.live)}  # received: another arena's copy may be stale
        meta = broadcast_json(self.optimizer.meta() if self.info.rank == src else None, src)
        self.optimizer.restore(meta)


def split_parameters(model: torch.nn.Module) -> tuple[Named, Named]:
    """(trainable, frozen) parameters with their names, each in the model's order; a tied
    weight once, under its first name."""
    seen: set[int] = set()
    trainable: Named = []
    frozen: Named = []
    for name, param in model.named_parameters():
        if id(param) not in seen:
            seen.add(id(param))
            (trainable if param.requires_grad else frozen).append((name, param))
    return trainable, frozen


def broadcast_json(value: Any, src: int) -> Any:
    """A JSON-able value from ``src`` to every rank, as bytes (nothing is unpickled)."""
    payload = json.dumps(value).encode() if dist.get_rank() == src else b""
    length = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(length, src=src)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(int(length), dtype=torch.uint8)
    dist.broadcast(data, src=src)
    return json.loads(bytes(data.numpy()).decode())
