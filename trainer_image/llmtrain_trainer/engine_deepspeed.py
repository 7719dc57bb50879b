"""The DeepSpeed engine (ZeRO 0-3), same interface as ``engine.DDPEngine``.

On CPU DeepSpeed needs ``DS_ACCELERATOR=cpu`` (set by ``main`` before the import) and
JIT-builds a small communication op with gcc and ninja on first use.

Checkpoints use DeepSpeed's own format inside our folder (``ds/``), with
``use_node_local_storage`` so that every node leader writes the model states file and a
node-local tier is self-sufficient for a restart on the same nodes. A restore at another
world size goes through DeepSpeed's *universal checkpoint*: the saved folder is converted
once (``ds_to_universal``) and loaded with ``checkpoint.load_universal``. The conversion
needs every rank's shard in one place, i.e. a complete copy (a single node's local tier,
or the shared tier).
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from llmtrain_contract.config import TrainerConfig
from .dist import DistInfo
from .engine import Batch, make_model
from .schedule import lr_at, param_groups

DS_TAG = "ds"
UNIVERSAL_DIR = "universal"
MODEL_STATES = "mp_rank_00_model_states.pt"
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
    if not torch.cuda.is_available():
        # DeepSpeed's fused/CPU Adam need compiled ops; torch's AdamW is exact and portable.
        defaults["optimizer"]["params"]["torch_adam"] = True
    if cfg.model.dtype == "bfloat16":
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


class DeepSpeedEngine:
    kind = "deepspeed"
    # DeepSpeed's save is collective and synchronous; there is no separate snapshot.
    async_capable = False

    @classmethod
    def create(cls, cfg: TrainerConfig, info: DistInfo, restoring_universal: bool) -> "DeepSpeedEngine":
        return cls(cfg, info, load_universal=restoring_universal)

    def __init__(self, cfg: TrainerConfig, info: DistInfo, load_universal: bool = False):
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

    def train_step(self, step: int, micro_batches: list[Batch]) -> torch.Tensor:
        lr = lr_at(step, self.cfg.optimizer, self.cfg.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.engine.train()
        total = torch.zeros((), device=self.dev)
        for x, y in micro_batches:
            loss = self.engine(x.to(self.dev), y.to(self.dev))
            self.engine.backward(loss)  # DeepSpeed scales by 1/accumulation itself
            self.engine.step()  # applies the update only at the accumulation boundary
            total += loss.detach().float()
        return total / len(micro_batches)

    def snapshot(self) -> None:
        return None

    def write_snapshot(self, snap: None, folder: Path) -> list[str]:
        self.engine.save_checkpoint(
            str(folder),
            tag=DS_TAG,
            client_state={"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}},
            save_latest=False,
        )
        names = [f"{DS_TAG}/{p.name}" for p in (folder / DS_TAG).iterdir()]
        mine = [n for n in names if self.file_rank(n) == self.info.rank]
        if self.info.is_node_leader and f"{DS_TAG}/{MODEL_STATES}" in names:
            mine.append(f"{DS_TAG}/{MODEL_STATES}")
        return sorted(mine)

    def replicated_files(self) -> set[str]:
        return {f"{DS_TAG}/{MODEL_STATES}"}

    @staticmethod
    def file_rank(name: str) -> int | None:
        match = _SHARD.search(name)
        return int(match.group(1)) if match else None

    def load(self, folder: Path, same_world: bool) -> None:
        if same_world:
            path, _ = self.engine.load_checkpoint(
                str(folder), tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        else:
            path, _ = self.engine.load_checkpoint(
                str(folder / UNIVERSAL_DIR), tag=DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {folder}")


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
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
        "--input_folder", str(folder / DS_TAG),
        "--output_folder", str(tmp / DS_TAG),
        "--num_extract_workers", "1", "--num_merge_workers", "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while proc.poll() is None:
        heartbeat()
        time.sleep(0.2)
    output = proc.stdout.read() if proc.stdout else ""
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
