"""The training loop, top to bottom.

init -> restore (agreed across ranks) -> loop { fault hook, micro-batches, optimizer
step, agree on loss and stop, beat the watchdog, metrics, checkpoint } -> final save.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import exitrecord, rng
from .checkpoint.manager import CheckpointManager, NoCheckpoints, rng_file
from .checkpoint.restore import Choice, NoLoadableCheckpoint
from .checkpoint.tier import DirTier
from llmtrain_contract.config import TrainerConfig
from .data import build_source, micro_batch_indices
from .dist import DistInfo
from .engine import engine_class
from .engine_deepspeed import convert_to_universal, wait_for_universal
from llmtrain_contract.exitcodes import ExitCode
from .faults import FaultInjector
from .schedule import lr_at
from .watchdog import Watchdog, dump_stacks_and_exit

log = logging.getLogger("llmtrain.trainer")


def _gather(obj: Any, world: int) -> list[Any]:
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def build_tiers(cfg: TrainerConfig) -> list[DirTier]:
    tiers = []
    for tier in cfg.checkpoint.tiers:
        if tier.uri.startswith("s3://"):
            log.warning("the %s tier (%s) is not supported by this trainer version; skipping it", tier.name, tier.uri)
            continue
        tiers.append(DirTier(tier.name, Path(tier.uri), keep=tier.keep, every_checkpoints=tier.every_checkpoints))
    return tiers


class Trainer:
    def __init__(self, cfg: TrainerConfig, info: DistInfo, metrics: Any, run_dir: Path):
        self.cfg = cfg
        self.info = info
        self.metrics = metrics
        self.run_dir = run_dir
        self.accum = cfg.grad_accum_steps(info.world_size)  # raises for an invalid world size
        shape = cfg.model.shape(cfg.data.seq_len)
        self.source = build_source(cfg.data, cfg.seed, shape.vocab_size)
        self.strategy = cfg.strategy.kind
        self.faults = FaultInjector.from_env(info.rank, info.restart_count, run_dir)
        self.step = 0
        self._stop = threading.Event()
        self.watchdog = Watchdog(cfg.fault_tolerance.hang_timeout_seconds, self._on_hang)
        self.engine: Any = None
        tiers = build_tiers(cfg)
        meta = {"config_hash": cfg.config_hash(), "strategy": self.strategy, "job": cfg.job_name, "max_steps": cfg.max_steps}
        self.ckpt: CheckpointManager | NoCheckpoints = CheckpointManager(
            tiers, info, cfg.checkpoint.interval_steps, meta,
            commit_timeout=max(60.0, cfg.fault_tolerance.collective_timeout_seconds),
            metrics=metrics, heartbeat=self.watchdog.beat,
        ) if tiers else NoCheckpoints()
        self.startup: dict[str, float] = {}
        self._first_step = True
        self._log_file: Any = None

    # ------------------------------------------------------------------ hooks

    def _on_hang(self, stale: float) -> None:
        dump_stacks_and_exit(
            ExitCode.HANG,
            stale,
            lambda: exitrecord.write(
                self.run_dir, self.info.restart_count, self.info.rank, self.info.local_rank, ExitCode.HANG,
                f"no step progress for {stale:.1f}s (hangTimeoutSeconds={self.cfg.fault_tolerance.hang_timeout_seconds})",
                self.step,
            ),
        )

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Only set a flag: the loop stops at the next step boundary that all ranks agree on.
        self._stop.set()

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        try:
            choice = self.ckpt.restore_point(self.strategy, self.strategy == "deepspeed",
                                             lambda o: _gather(o, self.info.world_size))
        except NoLoadableCheckpoint as err:
            if not self.cfg.checkpoint.allow_fresh_start:
                raise
            log.error("%s; starting from step 0 because checkpoint.allowFreshStart is set", err)
            choice = None
        self.engine = engine_class(self.strategy).create(self.cfg, self.info, choice is not None and choice.mode == "universal")
        self.ckpt.bind(self.engine)
        if choice is not None:
            self._load(choice)
        else:
            rng.seed_all(self.cfg.seed + self.info.rank)
        self.ckpt.prepare(self._barrier)

    def _barrier(self) -> None:
        if self.info.world_size > 1:
            dist.barrier()

    def _load(self, choice: Choice) -> None:
        began = time.perf_counter()
        same_world = choice.saved_world == self.info.world_size
        if choice.mode == "broadcast":
            state = None
            if self.info.rank == choice.source_rank:
                state = torch.load(choice.path / "state.pt", map_location="cpu", weights_only=True)
            box = [state]
            dist.broadcast_object_list(box, src=choice.source_rank)
            self.engine.load_state(box[0])
        elif choice.mode == "universal":
            if self.info.rank == choice.source_rank:
                convert_to_universal(choice.path, heartbeat=self.watchdog.beat)
            wait_for_universal(choice.path, timeout=3600, heartbeat=self.watchdog.beat)
            self.engine.load(choice.path, same_world=False)
        else:
            self.engine.load(choice.path, same_world=same_world)
        rng_path = choice.path / rng_file(self.info.rank) if choice.path else None
        if same_world and rng_path is not None and rng_path.exists():
            rng.restore(torch.load(rng_path, weights_only=False))
        else:
            # No saved stream fits this rank (new world size): derive one deterministically.
            rng.seed_all(self.cfg.seed + 1_000_003 * choice.step + self.info.rank)
        self.step = choice.step
        expected = choice.step * self.cfg.global_batch_size
        if choice.samples != expected:
            raise RuntimeError(f"checkpoint step {choice.step} records {choice.samples} samples, expected {expected}")
        seconds = time.perf_counter() - began
        tier = choice.source_tier or "unknown"
        self.metrics.restored(tier, choice.step, seconds)
        if self.info.rank == 0:
            via = f" from rank {choice.source_rank}" if choice.mode == "broadcast" else ""
            log.warning(
                "resumed from step %d (%s tier, %s%s, saved at world size %d, now %d) in %.2fs",
                choice.step, tier, choice.mode, via, choice.saved_world, self.info.world_size, seconds,
            )
            saved_max = choice.saved_max_steps
            if saved_max is not None and saved_max != self.cfg.max_steps:
                opt = self.cfg.optimizer
                log.warning(
                    "maxSteps changed from %d to %d since step %d was saved: the learning-rate schedule now spans %d "
                    "steps, so step %d trains at lr %.3g instead of %.3g (steps already taken and the data order are "
                    "unchanged)", saved_max, self.cfg.max_steps, choice.step, self.cfg.max_steps, choice.step + 1,
                    lr_at(choice.step, opt, self.cfg.max_steps), lr_at(choice.step, opt, saved_max),
                )

    # ------------------------------------------------------------------ loop

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.start()
        try:
            while self.step < self.cfg.max_steps:
                if self.step_once():
                    return self._preempted(self.step * self.cfg.global_batch_size)
            self.ckpt.save(self.step, self.step * self.cfg.global_batch_size, sync=True)
            return ExitCode.SUCCESS
        finally:
            self.close()

    def start(self) -> None:
        """Restore (or start fresh), then arm the watchdog and open the step log."""
        began = time.perf_counter()
        self.setup()
        self.startup["setup"] = time.perf_counter() - began
        self._first_step = True
        self.watchdog.start()
        self._log_file = (self.run_dir / "steps.jsonl").open("a") if self.info.rank == 0 else None

    def step_once(self) -> bool:
        """One optimizer step with everything around it. Returns True when the ranks
        agreed to stop (SIGTERM)."""
        cfg, info = self.cfg, self.info
        step = self.step
        began = time.perf_counter()
        self.faults.at_step(step + 1)
        batches = [
            self.source.batch(micro_batch_indices(step, a, info.rank, info.world_size, cfg.global_batch_size, cfg.micro_batch_size))
            for a in range(self.accum)
        ]
        local_loss = self.engine.train_step(step, batches)
        loss, stop = self._agree(local_loss)
        self.step = step + 1
        seconds = time.perf_counter() - began
        self.watchdog.beat()
        samples = self.step * cfg.global_batch_size
        tokens = cfg.global_batch_size * cfg.data.seq_len
        self.metrics.step(self.step, samples, loss, seconds, tokens)
        if self._log_file is not None:
            self._log_step(self._log_file, loss, samples, seconds, tokens, step)
        if self._first_step and info.rank == 0:
            self._first_step = False
            self.startup["first_step"] = seconds
            log.warning("first step done; start-up phases: %s", ", ".join(f"{k} {v:.2f}s" for k, v in self.startup.items()))
        if stop:
            return True
        if self.ckpt.due(self.step, cfg.max_steps):
            self.ckpt.save(self.step, samples)
        return False

    def close(self) -> None:
        self.watchdog.stop()
        self.ckpt.close()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _agree(self, local_loss: torch.Tensor) -> tuple[float, bool]:
        """One small all-reduce per step: the global mean loss, and whether any rank got
        SIGTERM (so that every rank stops at the same step)."""
        packed = torch.stack([local_loss.float().cpu(), torch.tensor(1.0 if self._stop.is_set() else 0.0)])
        if self.info.world_size > 1:
            dist.all_reduce(packed)
        return float(packed[0]) / self.info.world_size, bool(packed[1] > 0)

    def _log_step(self, fh: Any, loss: float, samples: int, seconds: float, tokens: int, step0: int) -> None:
        cfg = self.cfg
        record = {
            "step": self.step, "loss": loss, "samples": samples, "world": self.info.world_size,
            "accum": self.accum, "lr": lr_at(step0, cfg.optimizer, cfg.max_steps),
            "attempt": self.info.restart_count, "seconds": seconds, "time": time.time(),
        }
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        if self.step % cfg.log_interval_steps == 0 or self.step == cfg.max_steps:
            ckpt = self.ckpt.newest_local()
            print(
                f"step {self.step:>6}/{cfg.max_steps} | loss {loss:.4f} | lr {record['lr']:.2e} | "
                f"{tokens / seconds:,.0f} tok/s | world {self.info.world_size} x accum {self.accum}"
                + (f" | ckpt@{ckpt}" if ckpt else ""),
                flush=True,
            )

    def _preempted(self, samples: int) -> int:
        """SIGTERM: an emergency checkpoint within the budget, then the preempted code."""
        budget = self.cfg.checkpoint.sigterm_budget_seconds
        timer = threading.Timer(budget, lambda: os._exit(ExitCode.PREEMPTED))
        timer.daemon = True
        timer.start()
        began = time.perf_counter()
        try:
            self.ckpt.wait()
        except Exception as err:  # noqa: BLE001 - the emergency save still runs
            log.error("pending checkpoint failed before the emergency save: %s", err)
        self.ckpt.save(self.step, samples, sync=True)
        if self.info.rank == 0:
            log.warning("SIGTERM: emergency checkpoint of step %d in %.2fs; exiting", self.step, time.perf_counter() - began)
        timer.cancel()
        return ExitCode.PREEMPTED
