"""The training side of bench/checkpoint.py: our trainer and a DCP peer, each timed over
windows of steps with and without one checkpoint.

A *pair* is a window that starts with one checkpoint and runs at least ``W`` steps, on
until that checkpoint is persisted (so its whole background cost falls inside; a window
never ends on an idle wait), and a window of as many steps without a checkpoint. The
stall of a pair is the first window's wall time minus the second's; the order alternates
from pair to pair so that the machine's drift hits both alike, and a window with a
checkpoint that needs more steps than the previous pairs' count ends with a wait, which
counts. Times are the benchmark's own clock around the loop.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable


@dataclass
class Stall:
    pairs: list[float]
    """Per pair: checkpoint window minus plain window, seconds."""
    step_seconds: float
    """Median plain step time."""
    state_bytes: int

    @property
    def mean(self) -> float:
        return statistics.mean(self.pairs)

    @property
    def median(self) -> float:
        return statistics.median(self.pairs)

    @property
    def worst(self) -> float:
        return max(self.pairs)


def trainer_config(preset: str, batch: int, seq: int, tier: Path, run: Path, strategy: dict[str, Any] | None = None,
                   dtype: str = "float32") -> Any:
    from llmtrain_contract.config import TrainerConfig  # noqa: PLC0415

    return TrainerConfig.model_validate({
        "strategy": strategy or {"kind": "ddp"},
        "maxSteps": 10**6, "globalBatchSize": batch, "microBatchSize": batch, "runDir": str(run),
        "data": {"seqLen": seq}, "model": {"preset": preset, "dtype": dtype},
        "checkpoint": {"intervalSteps": 10**6, "tiers": [{"name": "local", "uri": str(tier), "keep": 2}]},
        "faultTolerance": {"hangTimeoutSeconds": 3600, "collectiveTimeoutSeconds": 3600},
        "metrics": {"enabled": False}, "logIntervalSteps": 10**9,
    })


class OurTrainer:
    """The real trainer (DDP engine, world size 1) with tier 1 at ``tier``."""

    def __init__(self, preset: str, batch: int, seq: int, tier: Path, run: Path, strategy: dict[str, Any] | None = None,
                 dtype: str = "float32"):
        from llmtrain_trainer.train import dist as distmod  # noqa: PLC0415
        from llmtrain_trainer.train.metrics import NullMetrics  # noqa: PLC0415
        from llmtrain_trainer.train.loop import Trainer  # noqa: PLC0415

        cfg = trainer_config(preset, batch, seq, tier, run, strategy, dtype)
        run.mkdir(parents=True, exist_ok=True)
        self.trainer = Trainer(cfg, distmod.init(3600), NullMetrics(), run)
        self.trainer.start()
        self.batch = batch

    def step(self) -> None:
        self.trainer.step_once()

    def checkpoint(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        """Start one; (is it persisted?, wait until it is)."""
        from llmtrain_trainer.engines import rng  # noqa: PLC0415

        t = self.trainer
        t.ckpt.save(t.step, t.step * self.batch, rng.capture())
        return (lambda: not t.ckpt.busy()), t.ckpt.wait

    def state_bytes(self) -> int:
        engine = self.trainer.engine
        if getattr(engine, "staging", None) is not None:
            return engine.staging.size  # GPU: the pinned copy of the device state
        if hasattr(engine, "live"):
            return engine.live.size
        return sum(p.numel() for p in engine.engine.module.parameters()) * 4 * 3  # fp32 weights and AdamW moments

    def tidy(self) -> None:
        return None  # tier 1's own retention keeps two

    def close(self) -> None:
        self.trainer.close()
        staging = getattr(self.trainer.engine, "staging", None)
        if staging is not None:
            staging.unpin()  # a later trainer in this process may be given the same addresses


class DcpTrainer:
    """The peer: the same model and batches with torch's AdamW, checkpointed by
    ``torch.distributed.checkpoint.async_save`` (its default stager and thread)."""

    def __init__(self, preset: str, batch: int, seq: int, folder: Path, dtype: str = "float32"):
        import torch  # noqa: PLC0415

        from llmtrain_trainer.engines.data import build_source, micro_batch_indices  # noqa: PLC0415
        from llmtrain_trainer.engines.model import make_model  # noqa: PLC0415
        from llmtrain_trainer.engines.schedule import param_groups  # noqa: PLC0415

        cfg = trainer_config(preset, batch, seq, folder, folder, dtype=dtype)
        self.torch, self.cfg, self.folder = torch, cfg, folder
        self.cuda = torch.cuda.is_available()
        self.model = make_model(cfg).to("cuda" if self.cuda else "cpu")
        # On a GPU: bf16 autocast and the fused AdamW, as a user of DCP would run it.
        self.opt = torch.optim.AdamW(param_groups(self.model, cfg.optimizer.weight_decay), lr=cfg.optimizer.lr,
                                     betas=(cfg.optimizer.beta1, cfg.optimizer.beta2), fused=self.cuda or None)
        self.source = build_source(cfg.data, cfg.seed, self.model.shape.vocab_size)
        self.indices = micro_batch_indices
        self.steps = self.saves = 0
        for _ in range(2):
            self.step()

    def step(self) -> None:
        torch = self.torch
        x, y = self.source.batch(self.indices(self.steps, 0, 0, 1, self.cfg.global_batch_size, self.cfg.micro_batch_size))
        if self.cuda:
            x, y = x.cuda(), y.cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda and self.cfg.model.dtype != "float32"):
            loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optimizer.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.cuda:
            torch.cuda.synchronize()  # a step ends when the GPU is done (our trainer reads the loss each step)
        self.steps += 1

    def state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: PLC0415

        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        return {"model": model_sd, "optim": optim_sd}

    def checkpoint(self) -> tuple[Callable[[], bool], Callable[[], None]]:
        import torch.distributed.checkpoint as dcp  # noqa: PLC0415

        self.saves += 1
        future = dcp.async_save(self.state(), checkpoint_id=str(self.folder / f"dcp-{self.saves}"))
        return future.done, future.result

    def tidy(self) -> None:
        """Between pairs, untimed: remove the checkpoints the pairs wrote (disk space)."""
        for folder in self.folder.glob("dcp-*"):
            shutil.rmtree(folder, ignore_errors=True)

    def sync_save(self, path: Path) -> float:
        """What a user does without async checkpoints: ``torch.save`` of the model and
        optimizer state, then fsync. Seconds, by this clock."""
        began = time.perf_counter()
        self.torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict()}, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        seconds = time.perf_counter() - began
        path.unlink()
        return seconds

    def state_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters()) * 3

    def close(self) -> None:
        return None


def measure(subject: Any, pairs: int, window: int, warmup: int = 2, log: Callable[[str], None] = print) -> Stall:
    for _ in range(warmup):
        subject.step()
    _, wait = subject.checkpoint()  # the first checkpoint pays one-time costs (page faults, folders)
    wait()
    subject.step()
    diffs, plain_steps = [], []
    count = window
    limit = window * 6

    def plain(n: int) -> float:
        began = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            subject.step()
            plain_steps.append(time.perf_counter() - t)
        return time.perf_counter() - began

    def with_checkpoint(least: int, most: int) -> tuple[float, int]:
        began = time.perf_counter()
        done, wait = subject.checkpoint()
        n = 0
        while n < least or (n < most and not done()):
            subject.step()
            n += 1
        wait()
        return time.perf_counter() - began, n

    for i in range(pairs):
        if i % 2 == 0:
            ckpt_seconds, n = with_checkpoint(count, limit)
            plain_seconds = plain(n)
        else:
            plain_seconds = plain(count)
            ckpt_seconds, n = with_checkpoint(count, count)
        count = max(count, n)
        subject.tidy()
        diffs.append(ckpt_seconds - plain_seconds)
        log(f"    pair {i + 1}/{pairs}: {n} steps, plain {plain_seconds:.2f}s, with checkpoint {ckpt_seconds:.2f}s, "
            f"stall {ckpt_seconds - plain_seconds:+.2f}s")
    return Stall(diffs, statistics.median(plain_steps), subject.state_bytes())


def deferral(subject: OurTrainer, steps: int, log: Callable[[str], None] = print) -> dict[str, float]:
    """Checkpoints due at every step, far faster than one can be written: the trainer's own
    loop (``step_once``) takes one whenever none is in flight, defers one that falls due
    during a write, and waits for the write when the next one falls due too. Counts the
    checkpoints taken and deferred, and times the burst against as many steps with no
    checkpoint due."""
    trainer = subject.trainer
    cadence = trainer.cadence
    saved_interval = cadence.interval
    began = time.perf_counter()
    for _ in range(steps):
        trainer.step_once()
    plain = time.perf_counter() - began
    deferred, committed = trainer.ckpt.deferred, len(trainer.ckpt.costs)
    cadence.interval = 1
    began = time.perf_counter()
    for _ in range(steps):
        trainer.step_once()
    trainer.ckpt.wait()
    burst = time.perf_counter() - began
    cadence.interval = saved_interval
    cadence.pending = False  # a checkpoint still owed by the burst is not the next row's
    out = {"steps": steps, "taken": len(trainer.ckpt.costs) - committed, "deferred": trainer.ckpt.deferred - deferred,
           "plain_seconds": plain, "burst_seconds": burst}
    log(f"    {steps} steps with a checkpoint due at each: {out['taken']} taken, {out['deferred']} deferred; "
        f"{burst:.2f}s against {plain:.2f}s with none due")
    return out
