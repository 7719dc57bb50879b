"""The DeepSpeed engine (ZeRO 0-3), a ``base.Engine`` like ``ddp.DDPEngine``.

On CPU DeepSpeed needs ``DS_ACCELERATOR=cpu`` (set by ``main`` before the import) and
JIT-builds a small communication op with gcc and ninja on first use.

Checkpoints use DeepSpeed's own format inside our folder (``ds/``), with
``use_node_local_storage`` so that every node leader writes the model states file and a
node-local tier is self-sufficient for a restart on the same nodes. Saves are
asynchronous: ``DeepSpeedSnapshot`` captures the state dicts, a side thread copies them
while the next forward and backward run, and they are written in the background. A restore at another
world size goes through DeepSpeed's *universal checkpoint*: the saved folder is converted
once (``ds_to_universal``) and loaded with ``checkpoint.load_universal``. The conversion
needs every rank's shard in one place, i.e. a complete copy (a single node's local tier,
or the shared tier).

Frozen parameters (``freeze``, ``lora``) are in DeepSpeed's model states, and a restore at
the same world size loads them from there. A universal checkpoint holds only what the
optimizer steps: after a restore at another world size the frozen parameters are what the
model was built with, the seeded init or the ``initFrom`` file (the same values: nothing
trains them), so that file must still be readable then (``_require_frozen_source``).
"""

from __future__ import annotations

import copy
import io
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

import torch
from llmtrain_store.manifest import ENGINE_FILES
from llmtrain_store.sources import MemorySource

from llmtrain_contract.config import TrainerConfig

from llmtrain_trainer.checkpoint.protocol import Choice
from llmtrain_trainer.state.tensorio import HashingFile
from llmtrain_trainer.engines import build_locks, safeload
from llmtrain_trainer.engines.base import Batch
from llmtrain_trainer.engines.init_weights import require_loaded
from llmtrain_trainer.engines.model import make_model
from llmtrain_trainer.engines.schedule import lr_at, param_groups
from llmtrain_trainer.world import DistInfo

DS_TAG = "ds"
UNIVERSAL_DIR = "universal"
MODEL_STATES = "mp_rank_00_model_states.pt"
UNIVERSAL_WAIT_SECONDS = 3600.0
"""How long the ranks wait for their node's universal conversion (a file, not a
collective: it may take longer than the collective timeout)."""
_SHARD = re.compile(r"zero_pp_rank_(\d+)_")


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def deepspeed_config(cfg: TrainerConfig, world_size: int, load_universal: bool) -> dict[str, Any]:
    """The project's defaults, the user's passthrough over them, then the derived keys
    that must stay consistent with the fixed global batch (they always win)."""
    opt = cfg.optimizer
    defaults: dict[str, Any] = {
        "zero_optimization": {"stage": cfg.strategy.zero_stage},
        "gradient_clipping": opt.grad_clip,
        "steps_per_print": 10**9,  # the trainer logs; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
        "optimizer": {
            "type": "AdamW" if opt.name == "adamw" else "SGD",
            "params": {"lr": opt.lr, "betas": [opt.beta1, opt.beta2], "eps": 1e-8, "weight_decay": opt.weight_decay}
            if opt.name == "adamw"
            else {"lr": opt.lr, "momentum": opt.beta1},
        },
    }
    user_optimizer = "optimizer" in (cfg.strategy.deepspeed_config or {})
    if opt.name == "adamw" and not user_optimizer:
        # DeepSpeed's FusedAdam and CPU Adam are ops compiled on first use (nvcc, minutes,
        # in every new pod); torch's AdamW is built in, and its fused CUDA kernel does the
        # same work in one launch. So no op is ever compiled on a job's path. Only when the
        # user names no optimizer: a merge cannot take keys out of theirs, and FusedAdam or
        # Lamb given "fused" or "torch_adam" would refuse them.
        defaults["optimizer"]["params"]["torch_adam"] = True
        if torch.cuda.is_available():
            defaults["optimizer"]["params"]["fused"] = True
    if cfg.model.dtype == "bfloat16" or (
        cfg.model.dtype == "auto" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    ):
        defaults["bf16"] = {"enabled": True}
    merged = _merge(defaults, cfg.strategy.deepspeed_config or {})
    accum = cfg.grad_accum_steps(world_size)
    merged.update(
        {
            "train_batch_size": cfg.global_batch_size,
            "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
            "gradient_accumulation_steps": accum,
        }
    )
    merged.setdefault("checkpoint", {})
    merged["checkpoint"]["use_node_local_storage"] = True
    merged["checkpoint"]["load_universal"] = load_universal
    return merged


class CaptureEngine:
    """A DeepSpeed checkpoint engine that records what ``save_checkpoint`` would write
    (each file's path and state dict, by reference) instead of writing it. The real
    engine is swapped back right after; the snapshot copies and writes in the background."""

    name = "llmtrain-capture"

    def __init__(self, root: Path):
        self.root = root
        self.captured: list[tuple[str, Any]] = []

    def create(self, info: Any) -> None:
        return None

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def save(self, state_dict: Any, path: str) -> None:
        self.captured.append((str(Path(path).relative_to(self.root)), state_dict))

    def commit(self, info: Any) -> bool:
        return True

    def is_decoupled(self) -> bool:
        return False

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def set_commit_info(self, info: Any) -> None:
        return None

    def get_commit_info(self) -> None:
        return None

    def cleanup(self) -> None:
        return None

    def preserves_storage_sharing(self) -> bool:
        # False: DeepSpeed would clone every tensor synchronously for torch.save; the
        # snapshot copies them in the background instead.
        return False


def _copy(obj: Any) -> Any:
    """A deep copy of a state dict whose tensors are fresh CPU copies (what DeepSpeed
    holds may change in the next optimizer step; this copy does not)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return obj.__class__((k, _copy(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(v) for v in obj)
    return obj


class DeepSpeedSnapshot:
    """DeepSpeed's files of one checkpoint: captured by reference at the step, copied by a
    side thread while the next forward and backward run (the next optimizer step waits
    for it), then written with ``torch.save`` in DeepSpeed's own layout (so its loader and
    its universal-checkpoint converter read them as usual)."""

    def __init__(self, engine: DeepSpeedEngine, captured: list[tuple[str, Any]]):
        self.engine = engine
        self._captured = captured
        self._copies: list[tuple[str, Any]] = []
        self._thread = threading.Thread(target=self._copy_all, name="ds-snapshot-copy", daemon=True)
        self._thread.start()

    def _copy_all(self) -> None:
        self._copies = [(name, _copy(sd)) for name, sd in self._captured]
        self._captured = []

    def copied(self) -> None:
        """Block until the copy is done (before the next optimizer step)."""
        self._thread.join()

    def write(self, folder: Path) -> dict[str, dict[str, Any]]:
        self.copied()
        records = {}
        for name, sd in self._copies:
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            out = HashingFile(target)
            torch.save(sd, out)  # type: ignore[arg-type]  # torch's FileLike says IO[bytes]; torch.save needs only write()
            out.close()
            records[name] = piece_record(name, out.pieces)
        return records

    def images(self) -> dict[str, MemorySource]:
        self.copied()
        out = {}
        for name, sd in self._copies:
            buffer = io.BytesIO()
            torch.save(sd, buffer)
            out[name] = MemorySource([buffer.getvalue()])
        return out

    def release(self) -> None:
        self.copied()
        self._copies = []
        self.engine._snapshot = None


class DeepSpeedEngine:
    kind = "deepspeed"

    @classmethod
    def create(cls, cfg: TrainerConfig, info: DistInfo, restoring_universal: bool) -> DeepSpeedEngine:
        return cls(cfg, info, load_universal=restoring_universal)

    def __init__(self, cfg: TrainerConfig, info: DistInfo, load_universal: bool = False):
        build_locks.clear_stale(build_locks.build_root())  # else a killed build's lock hangs the op's load
        import deepspeed  # noqa: PLC0415 - heavy; only when this strategy is chosen

        self.cfg = cfg
        self.info = info
        model = make_model(cfg)
        groups = param_groups(model, cfg.optimizer.weight_decay)
        self.ds_config = deepspeed_config(cfg, info.world_size, load_universal)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=groups, config=self.ds_config
        )
        self.dev = self.engine.device
        self._snapshot: DeepSpeedSnapshot | None = None

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.engine.module.parameters()

    sync_started = 0.0

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        lr = lr_at(step, self.cfg.optimizer, self.cfg.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.engine.train()
        total = torch.zeros((), device=self.dev)
        for i, (x, y) in enumerate(micro_batches):
            loss = self.engine(x.to(self.dev), y.to(self.dev))
            if i == len(micro_batches) - 1:
                self.sync_started = time.perf_counter()  # the gradient reduction comes next
            self.engine.backward(loss)  # DeepSpeed scales by 1/accumulation itself
            if i == len(micro_batches) - 1 and self._snapshot is not None:
                self._snapshot.copied()  # the update below changes what the snapshot holds
            self.engine.step()  # applies the update only at the accumulation boundary
            total += loss.detach().float()
        return total / len(micro_batches)

    def snapshot_free(self) -> bool:
        return self._snapshot is None

    def updates(self) -> int:
        return int(self.engine.global_steps)

    def can_rescue(self) -> bool:
        return False  # ZeRO shards the optimizer state: a peer's shard is lost with it

    def rescue_snapshot(self, updates: int) -> None:
        return None

    def snapshot(self) -> DeepSpeedSnapshot:
        """``save_checkpoint`` with a capturing engine: DeepSpeed builds its state dicts
        (and runs its collectives) as usual, but nothing is copied or written here."""
        # DeepSpeed still creates the tag's folder and copies its zero_to_fp32 script there;
        # nothing in it is needed once the call returns, so the folder lives only as long.
        root = Path(tempfile.mkdtemp(prefix="ds-capture-"))
        capture = CaptureEngine(root)
        real = self.engine.checkpoint_engine
        self.engine.checkpoint_engine = capture
        try:
            self.engine.save_checkpoint(
                str(root), tag=DS_TAG,
                client_state={"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}, save_latest=False,
            )
        finally:
            self.engine.checkpoint_engine = real
            shutil.rmtree(root, ignore_errors=True)
        mine = [(name, sd) for name, sd in capture.captured
                if self.file_rank(name) == self.info.rank or (name == f"{DS_TAG}/{MODEL_STATES}" and self.info.is_node_leader)]
        self._snapshot = DeepSpeedSnapshot(self, mine)
        return self._snapshot

    def replicated_files(self) -> set[str]:
        # The model-states file is not byte-identical across data-parallel ranks (two
        # nodes' copies of one step differed by 64 bytes in the two-node test), so it
        # cannot be stored in shares:
        # rank 0 stores it whole in job-wide tiers; each node leader keeps its own in tier 1.
        return set()

    @staticmethod
    def allowed_names() -> re.Pattern[str]:
        return ENGINE_FILES["deepspeed"]

    @staticmethod
    def file_rank(name: str) -> int | None:
        match = _SHARD.search(name)
        return int(match.group(1)) if match else None

    def restore(self, choice: Choice, folder: Path | None, heartbeat: Callable[[], None]) -> None:
        """DeepSpeed reads its own files, weights-only (``safeload.py``: no pickle from a
        tier); they were verified against the manifest, byte for byte, before this is called. At the world size that saved
        them, each rank loads the model file and its own shard; at another, one rank per
        node converts the complete copy into a universal checkpoint first (the others wait
        for its output) and every rank loads that."""
        assert folder is not None, "a sharded state is never broadcast"
        if choice.mode == "universal":
            if self.info.is_node_leader:
                convert_to_universal(folder, heartbeat=heartbeat)
            wait_for_universal(folder, timeout=UNIVERSAL_WAIT_SECONDS, heartbeat=heartbeat)
            load_from = folder / UNIVERSAL_DIR
        else:
            load_from = folder
        with safeload.weights_only():  # no pickle from a tier (safeload.py)
            path, _ = self.engine.load_checkpoint(
                str(load_from), tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {load_from}")
        if choice.mode == "universal":
            self._require_frozen_source()

    def _require_frozen_source(self) -> None:
        """A universal checkpoint does not restore the frozen parameters (the module
        docstring): with ``initFrom`` they are the file's, which must have been read."""
        if self.cfg.init_from and any(not p.requires_grad for p in self.engine.module.parameters()):
            require_loaded("needed to resume at another world size under DeepSpeed: its universal checkpoint holds "
                           "no frozen parameter, they are the file's")


def piece_record(name: str, pieces: list[tuple[int, int, str]]) -> dict[str, Any]:
    size = sum(p[1] for p in pieces)
    if len(pieces) == 1:
        return {"size": size, "hash": pieces[0][2]}
    return {"size": size, "slices": [{"name": name, "offset": o, "size": n, "hash": h, "at": o} for o, n, h in pieces]}


def convert_to_universal(folder: Path, heartbeat: Callable[[], None] = lambda: None) -> Path:
    """Run DeepSpeed's offline converter on a complete copy; idempotent.

    It runs as a subprocess (the converter is a CLI with its own worker pools) while this
    thread keeps the watchdog fed.
    """
    out = folder / UNIVERSAL_DIR
    if (out / "latest_universal").exists():
        return out
    tmp = folder / (UNIVERSAL_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "llmtrain_trainer.engines.safeload", "deepspeed.checkpoint.ds_to_universal",
        "--input_folder", str(folder / DS_TAG),
        "--output_folder", str(tmp / DS_TAG),
        "--num_extract_workers", "1", "--num_merge_workers", "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while proc.poll() is None:
        heartbeat()
        time.sleep(0.2)
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode == safeload.REFUSED:
        raise safeload.UnsafeCheckpoint(f"converting {folder} to a universal checkpoint: {output.strip()[-2000:]}")
    if proc.returncode != 0:
        raise RuntimeError(f"ds_to_universal failed for {folder}: {output[-2000:]}")
    (tmp / "latest_universal").write_text(DS_TAG)
    tmp.replace(out)
    return out


def wait_for_universal(folder: Path, timeout: float, heartbeat: Callable[[], None]) -> None:
    """Ranks other than the converter wait for its output (a file, not a collective:
    the conversion may take longer than the collective timeout)."""
    deadline = time.monotonic() + timeout
    while not (folder / UNIVERSAL_DIR / "latest_universal").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no universal checkpoint appeared in {folder} within {timeout:.0f}s")
        heartbeat()
        time.sleep(0.2)
