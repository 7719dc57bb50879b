"""Trainer overhead: tokens/s of the full trainer against a bare loop, side by side.

Both train the same model on the same samples with the same optimizer, in this process
at world size 1. The *bare* loop is the minimum: forward, backward, AdamW step. The
*full* trainer runs with every feature on: async checkpoints to a local tier every
``--checkpoint-every`` steps (snapshot, background write, hashed manifest, commit,
retention), the Prometheus endpoint, the hang watchdog, the per-step loss/stop
agreement and the step log.

The two alternate in chunks of ``--checkpoint-every`` steps (bare chunk, full chunk, bare
chunk ...), so that the machine's drift (other tenants, frequency) hits both alike. Each
full chunk straddles exactly one checkpoint (it starts half an interval before one) and
ends by waiting for that checkpoint's background write, so every cost of the checkpoint
is inside the full chunk's time. The result is total full tokens/s over total bare
tokens/s.

    python bench/trainer_overhead.py [--quick]
    RESULT trainer_throughput_ratio=0.98 bare_tokens_per_s=... full_tokens_per_s=...
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, result



class BareLoop:
    """The minimum: the same model, data, optimizer and schedule, nothing else."""

    def __init__(self, cfg):
        import torch  # noqa: PLC0415

        from llmtrain_trainer.engines.data import build_source  # noqa: PLC0415
        from llmtrain_trainer.engines.model import make_model  # noqa: PLC0415
        from llmtrain_trainer.engines.schedule import param_groups  # noqa: PLC0415

        self.torch = torch
        self.cfg = cfg
        self.model = make_model(cfg)
        self.opt = torch.optim.AdamW(param_groups(self.model, cfg.optimizer.weight_decay), lr=cfg.optimizer.lr, betas=(0.9, 0.95))
        self.source = build_source(cfg.data, cfg.seed, self.model.shape.vocab_size)
        self.accum = cfg.grad_accum_steps(1)
        self.step = 0

    def step_once(self) -> None:
        from llmtrain_trainer.engines.data import micro_batch_indices  # noqa: PLC0415
        from llmtrain_trainer.engines.schedule import lr_at  # noqa: PLC0415

        cfg = self.cfg
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, cfg.optimizer, cfg.max_steps)
        for a in range(self.accum):
            x, y = self.source.batch(micro_batch_indices(self.step, a, 0, 1, cfg.global_batch_size, cfg.micro_batch_size))
            (self.model(x, y) / self.accum).backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optimizer.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1


def full_trainer(cfg, workdir: Path):
    from llmtrain_trainer.train import dist as distmod  # noqa: PLC0415
    from llmtrain_trainer.train.metrics import TrainerMetrics  # noqa: PLC0415
    from llmtrain_trainer.train.loop import Trainer  # noqa: PLC0415

    run = cfg.model_copy(update={"run_dir": str(workdir / "run")})
    run.checkpoint.tiers = [run.checkpoint.tiers[0].model_copy(update={"uri": str(workdir / "ckpt")})]
    info = distmod.init(run.fault_tolerance.collective_timeout_seconds)
    metrics = TrainerMetrics(0, "ddp", run.config_hash(), "bench")
    Path(run.run_dir).mkdir(parents=True, exist_ok=True)
    metrics.serve("127.0.0.1", 0, Path(run.run_dir), local_rank=0)
    trainer = Trainer(run, info, metrics, Path(run.run_dir))
    trainer.start()
    return trainer


def main() -> None:
    # Quiet trainer logs for the benchmark's own runs: set here, not at import, since a
    # test that imports this module must not change its session's environment (it once
    # silenced every later trainer run's log in the suite).
    os.environ.setdefault("LLMTRAIN_LOG_LEVEL", "ERROR")
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=None, help="chunk pairs (default 24, quick 3)")
    p.add_argument("--checkpoint-every", type=int, default=25, help="checkpoint cadence in steps = chunk length (default 25)")
    args = p.parse_args()
    chunks = args.chunks or (3 if args.quick else 24)
    every = args.checkpoint_every

    import torch  # noqa: PLC0415

    from llmtrain_contract.config import TrainerConfig  # noqa: PLC0415

    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))  # leave a core for I/O threads, as in a pod
    cfg = TrainerConfig.model_validate({
        "maxSteps": 10**6, "globalBatchSize": 8, "microBatchSize": 4,
        "data": {"seqLen": 128, "vocabSize": 256}, "model": {"preset": "tiny"},
        "checkpoint": {"intervalSteps": every, "tiers": [{"name": "local", "uri": "/unused", "keep": 2}]},
        "faultTolerance": {"hangTimeoutSeconds": 60, "collectiveTimeoutSeconds": 60},
        "metrics": {"port": 0, "host": "127.0.0.1"},
        "logIntervalSteps": 10**9,
    })
    tokens_per_step = cfg.global_batch_size * cfg.data.seq_len
    params = cfg.model.shape(cfg.data.seq_len).approx_params()
    print(f"model tiny ({params / 1e6:.1f} M params), {chunks} chunk pairs of {every} steps, "
          f"one async checkpoint per full chunk", flush=True)
    with tempfile.TemporaryDirectory(prefix="llmtrain-bench-") as tmp:
        bare = BareLoop(cfg)
        full = full_trainer(cfg, Path(tmp))
        # Warm-up (allocators, lazy init) and put the full trainer half an interval before
        # its next checkpoint, so every timed full chunk contains exactly one.
        for _ in range(every // 2 + every):
            bare.step_once()
        for _ in range(every // 2 + every):
            full.step_once()
        full.ckpt.wait()
        bare_seconds = full_seconds = 0.0
        for chunk in range(chunks):
            t = time.perf_counter()
            for _ in range(every):
                bare.step_once()
            bare_seconds += time.perf_counter() - t
            t = time.perf_counter()
            for _ in range(every):
                full.step_once()
            full.ckpt.wait()  # the checkpoint's background work is charged to the full chunk
            full_seconds += time.perf_counter() - t
            if (chunk + 1) % 4 == 0 or chunk + 1 == chunks:
                print(f"chunk {chunk + 1}/{chunks}: ratio so far {bare_seconds / full_seconds:.4f}", flush=True)
        saved = full.ckpt.last_committed.get("local")
        full.close()
    steps = chunks * every
    bare_tps, full_tps = steps * tokens_per_step / bare_seconds, steps * tokens_per_step / full_seconds
    assert saved is not None and saved > 0, "the full trainer must have committed checkpoints"
    result(trainer_throughput_ratio=round(full_tps / bare_tps, 4), bare_tokens_per_s=round(bare_tps),
           full_tokens_per_s=round(full_tps), checkpoint_every_steps=every, steps_each=steps)


if __name__ == "__main__":
    main()
