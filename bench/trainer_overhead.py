"""Trainer overhead: tokens/s of the full trainer against a bare loop, side by side.

Both train the same model on the same samples with the same optimizer, in this process
at world size 1. The *bare* loop is the minimum: forward, backward, AdamW step. The
*full* trainer runs with every feature on: async checkpoints to a local tier at the
given cadence (snapshot, write, sha256 manifest, commit, retention), the Prometheus
endpoint, the hang watchdog, the per-step loss/stop agreement and the step log.

Runs alternate (bare, full, bare, full, ...) so that drift in machine speed hits both
sides of each pair; the result is the median of the per-pair ratios.

    python bench/trainer_overhead.py [--quick]
    RESULT trainer_throughput_ratio=0.98 bare_tokens_per_s=... full_tokens_per_s=...
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parser, result  # noqa: E402

os.environ.setdefault("LLMTRAIN_LOG_LEVEL", "ERROR")


def bare_loop(cfg, steps: int) -> float:
    """Tokens/s of the minimal loop, over steps 2..N (step 1 warms up allocators)."""
    import torch  # noqa: PLC0415

    from llmtrain_trainer.data import build_source, micro_batch_indices  # noqa: PLC0415
    from llmtrain_trainer.engine import make_model  # noqa: PLC0415
    from llmtrain_trainer.schedule import lr_at, param_groups  # noqa: PLC0415

    model = make_model(cfg)
    opt = torch.optim.AdamW(param_groups(model, cfg.optimizer.weight_decay), lr=cfg.optimizer.lr, betas=(0.9, 0.95))
    source = build_source(cfg.data, cfg.seed, model.shape.vocab_size)
    accum = cfg.grad_accum_steps(1)
    marks = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.optimizer, cfg.max_steps)
        for a in range(accum):
            x, y = source.batch(micro_batch_indices(step, a, 0, 1, cfg.global_batch_size, cfg.micro_batch_size))
            (model(x, y) / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
    tokens = (steps - 1) * cfg.global_batch_size * cfg.data.seq_len
    return tokens / (marks[-1] - marks[0])


def full_trainer(cfg, steps: int, workdir: Path) -> float:
    from llmtrain_trainer import dist as distmod  # noqa: PLC0415
    from llmtrain_trainer.metrics import TrainerMetrics  # noqa: PLC0415
    from llmtrain_trainer.trainer import Trainer  # noqa: PLC0415

    run = cfg.model_copy(update={"max_steps": steps, "run_dir": str(workdir / "run")})
    run.checkpoint.tiers = [run.checkpoint.tiers[0].model_copy(update={"uri": str(workdir / "ckpt")})]
    info = distmod.init(run.fault_tolerance.collective_timeout_seconds)
    metrics = TrainerMetrics(0, "ddp", run.config_hash(), "bench")
    metrics.serve("127.0.0.1", 0, Path(run.run_dir), local_rank=0)
    Path(run.run_dir).mkdir(parents=True, exist_ok=True)
    trainer = Trainer(run, info, metrics, Path(run.run_dir))
    assert trainer.run() == 0
    records = [json.loads(line) for line in (Path(run.run_dir) / "steps.jsonl").read_text().splitlines()]
    assert len(records) == steps
    tokens = (steps - 1) * cfg.global_batch_size * cfg.data.seq_len
    return tokens / (records[-1]["time"] - records[0]["time"])


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 150, quick 60)")
    p.add_argument("--rounds", type=int, default=None, help="alternating pairs of runs (default 7, quick 3)")
    p.add_argument("--checkpoint-every", type=int, default=25, help="checkpoint cadence in steps (default 25)")
    args = p.parse_args()
    steps = args.steps or (60 if args.quick else 150)
    rounds = args.rounds or (3 if args.quick else 7)

    import torch  # noqa: PLC0415

    from llmtrain_trainer.config import TrainerConfig  # noqa: PLC0415

    torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))  # leave a core for I/O threads, as in a pod
    cfg = TrainerConfig.model_validate({
        "maxSteps": steps, "globalBatchSize": 8, "microBatchSize": 4,
        "data": {"seqLen": 128, "vocabSize": 256}, "model": {"preset": "tiny"},
        "checkpoint": {"intervalSteps": args.checkpoint_every, "tiers": [{"name": "local", "uri": "/unused", "keep": 2}]},
        "faultTolerance": {"hangTimeoutSeconds": 60, "collectiveTimeoutSeconds": 60},
        "metrics": {"port": 0, "host": "127.0.0.1"},
        "logIntervalSteps": 10**9,
    })
    params = cfg.model.shape(cfg.data.seq_len).approx_params()
    print(f"model tiny ({params / 1e6:.1f} M params), {steps} steps x {rounds} rounds, "
          f"checkpoint every {args.checkpoint_every} steps", flush=True)
    bare, full = [], []
    with tempfile.TemporaryDirectory(prefix="llmtrain-bench-") as tmp:
        for r in range(rounds):
            bare.append(bare_loop(cfg, steps))
            full.append(full_trainer(cfg, steps, Path(tmp) / f"round{r}"))
            print(f"round {r + 1}: bare {bare[-1]:,.0f} tok/s, full {full[-1]:,.0f} tok/s, ratio {full[-1] / bare[-1]:.3f}", flush=True)
    ratio = statistics.median(f / b for f, b in zip(full, bare))
    result(
        trainer_throughput_ratio=round(ratio, 4),
        bare_tokens_per_s=round(statistics.median(bare)),
        full_tokens_per_s=round(statistics.median(full)),
        checkpoint_every_steps=args.checkpoint_every,
        steps=steps,
        rounds=rounds,
    )


if __name__ == "__main__":
    main()
