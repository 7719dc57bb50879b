"""The checkpoint API for a user's own training script: the built-in trainer's tiered
store (node-local disk, the shared filesystem, S3), its background persistence, verified
restores, retention and ``llmtrain checkpoints``, for any state dict.

::

    import torch.distributed as dist
    from llmtrain_trainer import checkpoints

    dist.init_process_group()                       # first: restoring is an agreement
    store = checkpoints.open()                      # the job's tiers, from the operator
    step, state = store.restore()                   # (0, None) on a fresh start
    if state is not None:
        model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"])
    for step in range(step + 1, steps + 1):
        ...
        if step % 50 == 0:
            store.save(step, {"model": model.state_dict(), "optimizer": opt.state_dict()})
    store.close()

Every rank calls ``restore`` and ``save`` at the same steps (both are collectives).
``open(sharded=False)`` (the default) is for a state every rank holds alike (DDP): each
node's first rank writes it, once per node in tier 1 and once per job in the slower tiers,
and a rank whose node holds no copy (a replacement node) receives it by broadcast.
``open(sharded=True)`` is for a state each rank holds its own part of (FSDP, ZeRO): every
rank writes its own file, restored at the same world size only (``ReshardNeeded``).

``save`` returns once the state is serialised in host memory (``torch.save``: the one
copy on the training path); tier 1 is written in the background and each slower tier gets
the step on its own cadence (``intervalSteps``), with pieces it already holds referenced,
not written again. A save that falls due while the previous one is still being written
waits for it. The ranks agree on every save: when one cannot (its previous write hung,
``torch.save`` failed, or, at the first save, the state holds a type a ``weights_only``
load refuses), every rank raises ``CheckpointRefused`` with each rank's reason. A step is
written once: ``save(..., sync=True)`` (the last one) of the step saved last hands it to
the slower tiers that skipped it, and returns once every tier has stored it (or failed,
degraded and logged); ``close`` finishes the slower tiers likewise. ``restore`` verifies
every byte against the manifest, falls back to an older step or a slower tier when a copy
does not verify, and loads with ``torch.load(weights_only=True)``: a forged file runs
nothing. A rank whose node holds no copy receives it from one that does, in pieces. Each
rank's RNG state (Python, NumPy, torch, CUDA) is saved with the step and restored at the
same world size.

The tiers come from ``LLMTRAIN_CHECKPOINT_TIERS`` (the operator sets it for a script job
with ``checkpoint.enabled``), or, outside the operator, ``LLMTRAIN_CHECKPOINT_DIR`` alone.
The API needs this project in the script's image (the trainer image has it); the bundle
an image without it gets (``launch/bundle.py``) carries the launcher, not this.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import re
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from llmtrain_contract.config import CheckpointTierConfig
from llmtrain_contract.names import Env
from llmtrain_store import manifest as mf
from llmtrain_store.build import build_tiers
from llmtrain_store.sources import MemorySource
from llmtrain_store.tier import CheckpointError, file_record

from llmtrain_trainer.checkpoint.manager import CheckpointManager
from llmtrain_trainer.checkpoint.protocol import manifest_files
from llmtrain_trainer.checkpoint.rngfiles import rng_file
from llmtrain_trainer.engines import rng
from llmtrain_trainer.state.tensorio import verify, write_small
from llmtrain_trainer.train.agreement import gather
from llmtrain_trainer.train.metrics import NullMetrics
from llmtrain_trainer.train.resume import RNG_STEP_STRIDE, agree
from llmtrain_trainer.world import DistInfo

log = logging.getLogger("llmtrain.checkpoints")

STRATEGY = "script"
"""The manifests' strategy: the store checks names against ``ENGINE_FILES["script"]``."""
STATE = "script-state.pt"
"""A replicated state's file."""
SHARD = "script-rank-{rank:05d}.pt"
"""A sharded state's file of one rank."""
_SHARD = re.compile(r"script-rank-(\d{5})\.pt")
COMMIT_TIMEOUT = 600.0
"""How long a node's first rank waits for the node's other parts of a step."""


BROADCAST_CHUNK = 64 << 20
"""A broadcast restore sends the state's bytes in pieces this large (on a GPU under NCCL,
one piece at a time on the device, not the whole state)."""


class CheckpointRefused(RuntimeError):
    """A save every rank gave up: why, from each rank that could not."""


def broadcast_bytes(data: bytes | memoryview | None, src: int) -> bytes:
    """``data`` from rank ``src`` to every rank, in ``BROADCAST_CHUNK`` pieces on the
    process group's device."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    total = int(size.item())
    source = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data is not None and total else None
    out = bytearray(total)
    for start in range(0, total, BROADCAST_CHUNK):
        length = min(BROADCAST_CHUNK, total - start)
        piece = (source[start:start + length].to(device) if source is not None
                 else torch.empty(length, dtype=torch.uint8, device=device))
        dist.broadcast(piece, src=src)
        out[start:start + length] = piece.cpu().numpy().tobytes()
    return bytes(out)


class ReshardNeeded(RuntimeError):
    """A sharded state saved at another world size: each rank's file is its own part."""


class UnusableCheckpoint(RuntimeError):
    """A committed step whose file verified but does not load as a state (a forged or
    foreign pickle, refused by ``weights_only``)."""


class ScriptFiles:
    """The files a script's state is written to (``protocol.FileNaming``)."""

    @staticmethod
    def allowed_names() -> re.Pattern[str]:
        return mf.ENGINE_FILES[STRATEGY]

    @staticmethod
    def file_rank(name: str) -> int | None:
        found = _SHARD.fullmatch(name)
        return int(found.group(1)) if found else None


class _Snapshot:
    """One rank's serialised state, held until the writer thread has written it."""

    def __init__(self, name: str, data: memoryview, owner: _ScriptState):
        self.name, self.data, self.owner = name, data, owner

    def write(self, folder: Path) -> dict[str, dict[str, Any]]:
        size, pieces = write_small(folder / self.name, self.data)
        return {self.name: file_record(self.name, size, pieces)}

    def images(self) -> dict[str, MemorySource]:
        return {self.name: MemorySource([self.data])}

    def release(self) -> None:
        self.owner.pending = None


class _ScriptState(ScriptFiles):
    """The state a script handed to ``save``, as the manager's engine (``Checkpointable``)."""

    def __init__(self, info: DistInfo, sharded: bool):
        self.info, self.sharded = info, sharded
        self.pending: _Snapshot | None = None

    def file_name(self) -> str:
        return SHARD.format(rank=self.info.rank) if self.sharded else STATE

    def writes(self) -> bool:
        """Whether this rank writes a file: every rank of a sharded state, a node's first
        rank of a replicated one."""
        return self.sharded or self.info.is_node_leader

    def hold(self, data: memoryview) -> None:
        self.pending = _Snapshot(self.file_name(), data, self)

    def snapshot(self) -> _Snapshot | None:
        return self.pending if self.writes() else None

    def snapshot_free(self) -> bool:
        return self.pending is None

    def rescue_snapshot(self, updates: int) -> None:
        return None

    def replicated_files(self) -> set[str]:
        return set() if self.sharded else {STATE}


def tiers_from_env(environ: dict[str, str] | None = None) -> list[CheckpointTierConfig]:
    """The job's tiers: ``LLMTRAIN_CHECKPOINT_TIERS`` (JSON), else tier 1 alone from
    ``LLMTRAIN_CHECKPOINT_DIR``. ValueError naming the variable when neither is usable."""
    env = os.environ if environ is None else environ
    text = env.get(Env.CHECKPOINT_TIERS)
    if text:
        try:
            raw = json.loads(text)
            if not isinstance(raw, list) or not raw:
                raise ValueError("not a non-empty list")
            return [CheckpointTierConfig.model_validate(item) for item in raw]
        except ValueError as err:
            raise ValueError(f"{Env.CHECKPOINT_TIERS}: {err}") from None
    local = env.get(Env.CHECKPOINT_DIR)
    if local:
        return [CheckpointTierConfig(name="local", uri=local)]
    raise ValueError(f"no checkpoint tiers: neither {Env.CHECKPOINT_TIERS} nor {Env.CHECKPOINT_DIR} is set "
                     "(the job needs checkpoint.enabled)")


def dist_info() -> DistInfo:
    """This rank, from the process group (or a world of one without one) and torchrun's
    environment."""
    initialised = dist.is_available() and dist.is_initialized()
    if not initialised and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError("checkpoints.open() needs the process group: call torch.distributed.init_process_group() first "
                           f"(WORLD_SIZE is {os.environ['WORLD_SIZE']})")
    if initialised and dist.get_world_size() > 1 and "LOCAL_WORLD_SIZE" not in os.environ:
        raise RuntimeError("checkpoints.open() needs torchrun's LOCAL_WORLD_SIZE (how many ranks share a node's disk)")
    if not initialised:
        return DistInfo.of(0, 1, "none", {})
    return DistInfo.of(dist.get_rank(), dist.get_world_size(), dist.get_backend(), os.environ)


def open(sharded: bool = False, compat: str = "", allow_fresh_start: bool = False,
         timeout: float = COMMIT_TIMEOUT) -> ScriptCheckpoints:
    """The job's tiers for this rank. ``compat``: a string that changes when a saved state
    would no longer load (another model size, say): a step saved under another one is
    never restored. ``allow_fresh_start``: start over when steps exist but none verifies
    (else ``restore`` raises, naming why each was refused)."""
    return ScriptCheckpoints(tiers_from_env(), dist_info(), sharded, compat, allow_fresh_start, timeout)


class ScriptCheckpoints:
    def __init__(self, tiers: list[CheckpointTierConfig], info: DistInfo, sharded: bool, compat: str,
                 allow_fresh_start: bool, timeout: float = COMMIT_TIMEOUT):
        if not tiers:
            raise ValueError("no checkpoint tiers")
        self.info, self.sharded, self.allow_fresh_start, self.timeout = info, sharded, allow_fresh_start, timeout
        self.state = _ScriptState(info, sharded)
        job = os.environ.get(Env.JOB, "local")
        # The layout is part of what must match: a replicated state has no file per rank.
        meta = {"config_hash": f"{STRATEGY}:{'sharded' if sharded else 'replicated'}:{compat}", "strategy": STRATEGY, "job": job,
                "owner": os.environ.get(Env.JOB_UID) or job}
        self.manager = CheckpointManager(build_tiers(tiers), info, ScriptFiles(), meta, commit_timeout=timeout,
                                         metrics=NullMetrics(), heartbeat=lambda: None)
        self.manager.bind(self.state)
        self.restored: int | None = None
        self.saved: int | None = None
        """The newest step handed to ``save``."""
        self._checked = False
        """The first save's state was checked to load back with ``weights_only``."""

    # ------------------------------------------------------------------ restore

    def restore(self) -> tuple[int, Any | None]:
        """(the agreed step, this rank's state) or (0, None) for a fresh start. A
        collective: every rank calls it once, before the first ``save``."""
        if self.restored is not None:
            raise RuntimeError("restore() is called once, before the first save()")
        point = agree(self.manager, self.info, self.sharded, self.allow_fresh_start, self.timeout)
        if point is None:
            self.restored = 0
            self.manager.prepare(self._barrier, 0, [])
            return 0, None
        choice = point.choice
        if choice.mode == "universal":
            raise ReshardNeeded(f"step {choice.step} holds each rank's own part of a sharded state saved at world size "
                                f"{choice.saved_world}; this run has {self.info.world_size} ranks: restore it at "
                                f"{choice.saved_world} ranks (replicas.min = replicas.max), or reshard it yourself")
        # Each failure below is agreed: a rank that raised alone would leave the others
        # waiting in the broadcast or the tiers' barrier.
        data, problem = None, None
        if point.folder is not None:
            try:
                data = self._read(point.folder, choice.step)
            except Exception as err:  # noqa: BLE001 - agreed below, so that no rank raises alone
                problem = f"rank {self.info.rank}: {type(err).__name__}: {err}"
        self._agreed(problem)
        if choice.mode == "broadcast":
            data = broadcast_bytes(data if self.info.rank == choice.source_rank else None, choice.source_rank)
        assert data is not None  # a local copy, or the broadcast's
        state, problem = None, None
        try:
            state = self._load(data, choice.step)
        except UnusableCheckpoint as err:
            problem = f"rank {self.info.rank}: {err}"
        self._agreed(problem)
        if choice.saved_world == self.info.world_size:
            found = self.manager.read_rng(choice.step, rng_file(self.info.rank), point.folder)
            if found is not None:
                rng.restore(*found)
        else:
            rng.seed_all(RNG_STEP_STRIDE * choice.step + self.info.rank)
        self.restored = choice.step
        self.manager.prepare(self._barrier, choice.step, list(choice.lineage))
        if self.info.rank == 0:
            log.info("restored step %d (%s tier, %s, saved at world size %d, now %d)", choice.step, choice.source_tier,
                     choice.mode, choice.saved_world, self.info.world_size)
        return choice.step, state

    def _agreed(self, problem: str | None) -> None:
        """Raise on every rank when any rank has a problem, naming each."""
        problems = [p for p in gather(self.info, problem) if p]
        if problems:
            raise UnusableCheckpoint("; ".join(problems[:4]))

    def _read(self, folder: Path, step: int) -> bytes:
        name = self.state.file_name()
        entry = manifest_files(folder, mf.ENGINE_FILES[STRATEGY]).get(name)
        if entry is None:
            raise UnusableCheckpoint(f"step {step}: its manifest in {folder} lists no {name}")
        data = (folder / name).read_bytes()
        verify(data, [(p.offset, p.size, p.hash) for p in entry.pieces], what=str(folder / name))
        return data

    @staticmethod
    def _load(data: bytes, step: int) -> Any:
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, ValueError, EOFError) as err:
            raise UnusableCheckpoint(f"step {step}: the state verifies against its manifest but does not load as a state "
                                     f"dict (weights_only): {str(err)[:2000]}") from None

    def _barrier(self) -> None:
        if self.info.world_size > 1:
            dist.barrier()

    # ------------------------------------------------------------------ save

    def save(self, step: int, state: Any, sync: bool = False) -> float:
        """Checkpoint ``state`` as of ``step`` (every rank, the same steps); the seconds
        the caller was blocked. ``CheckpointRefused`` on every rank when any rank could
        not (``_serialise``); ``ValueError`` for a step older than the last one saved."""
        if self.restored is None:
            raise RuntimeError("restore() first: it agrees on the step the job resumes from, and prepares the tiers")
        if self.saved is not None and step < self.saved:
            raise ValueError(f"step {step} is older than the last saved step {self.saved}")
        if step == self.saved:
            # Saved already (the loop's last periodic save, then the final one): a step is
            # written once; a final one gives it to the slower tiers that skipped it, on
            # every rank or none (a node whose tier 1 failed has no copy to give).
            began = time.perf_counter()
            if sync:
                self.manager.wait()  # tier 1 only: a rank uploading must not keep the others in the gather
                if all(gather(self.info, self.manager.can_complete(step))):
                    if not self.manager.complete(step):
                        log.error("step %d: not stored into every slower tier (see the tiers' errors above)", step)
                else:
                    log.error("step %d: tier 1 did not commit it on every node: the slower tiers keep what they took", step)
            return time.perf_counter() - began
        began = time.perf_counter()
        problem = None
        if not self.manager.wait_free():
            problem = f"rank {self.info.rank}: the previous checkpoint was not written within {self.timeout:.0f}s"
        elif self.state.writes():
            problem = self._serialise(step, state)
        # One agreement: every rank saves this step, or every rank raises (a rank that
        # raised alone would leave the others waiting in the next collective).
        answers = gather(self.info, (problem, self.manager.tiers_busy()))
        problems = [p for p, _ in answers if p]
        if problems:
            self.state.pending = None
            raise CheckpointRefused(f"step {step} not saved: " + "; ".join(problems[:4]))
        busy = [any(flags) for flags in zip(*(b for _, b in answers))]
        blocked = 0.0
        try:
            blocked = self.manager.save(step, 0, rng.capture(), tiers_busy=busy, sync=sync)
        except CheckpointError as err:
            # A synchronous save that no tier of this rank took: degraded and logged, as
            # the built-in trainer goes on; raising here would be this rank's alone.
            log.error("step %d: %s", step, err)
        self.saved = step
        return blocked + (time.perf_counter() - began if sync else 0.0)

    def _serialise(self, step: int, state: Any) -> str | None:
        """Hold ``state``'s bytes for the writer; why not, when ``torch.save`` fails or the
        file would not load back (``weights_only`` refuses every global it does not know:
        found at the first save, not at the restore after a failure)."""
        buffer = io.BytesIO()
        try:
            torch.save(state, buffer)
        except Exception as err:  # noqa: BLE001 - said on every rank, by the agreement
            return f"rank {self.info.rank}: torch.save failed: {type(err).__name__}: {err}"
        if not self._checked:
            buffer.seek(0)
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(buffer)
            if unsafe:
                return (f"rank {self.info.rank}: the state holds {', '.join(sorted(unsafe)[:8])}, which a restore with "
                        "torch.load(weights_only=True) refuses: save tensors, numbers, strings, lists and dicts "
                        "(e.g. np.random.get_state() as a list, a NumPy number with float()), or allow the type with "
                        "torch.serialization.add_safe_globals")
            self._checked = True
        self.state.hold(buffer.getbuffer())
        return None

    def wait(self) -> None:
        """Block until this rank's last save is in tier 1 (on a node's first rank: the
        node's commit). The slower tiers go on in the background."""
        self.manager.wait()

    def close(self) -> None:
        """Finish the writes in flight, the slower tiers' too (each stores what it took, or
        fails, degraded and logged), and stop the store's threads."""
        if not self.manager.flush():
            log.error("a slower tier did not finish storing within %.0fs", self.timeout * 2)
        self.manager.close()

    def last_committed(self) -> dict[str, int]:
        """Tier -> the newest step this rank knows committed there."""
        return dict(self.manager.last_committed)


__all__ = ["CheckpointRefused", "ReshardNeeded", "ScriptCheckpoints", "UnusableCheckpoint", "open"]
