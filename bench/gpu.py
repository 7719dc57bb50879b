"""The trainer on a GPU: CUDA and NCCL paths, exact resume, DeepSpeed ZeRO 1-3 with no op
compiled, the first step of a fresh process, MFU against a bare loop, the memory plan
against the allocator, and the checkpoint stall against a synchronous save and DCP.

    python bench/gpu.py --out DIR [--only SECTION,...] [--budget SECONDS] [--quick]

Made for one GPU with no network (``hack/gpu/check.sh`` carries what the machine lacks).
Sections run in this order, each guarded (a failure is recorded, the next one runs) and
each skipped, and said so, when the budget has less time left than it needs; every
figure lands in ``DIR/gpu.json`` as soon as its section ends:

- ``env``: torch, CUDA, the GPU, the driver; whether torch is in the supported range.
- ``resume``: the real launcher -> torchrun -> trainer stack (``tests/support/elastic.py``)
  on the GPU: DDP over NCCL (one rank; two ranks on a machine with two GPUs), DDP with two
  ranks sharing the GPU over gloo, and DeepSpeed ZeRO-3; each SIGKILLed at step 13 and
  resumed, its losses compared with an uninterrupted run's.
- ``gpu_oom``: the same stack, one rank asking CUDA's allocator for twice the GPU at step
  5 (the fault ``gpu_oom``): it must exit 88 with the allocator's own figures and the
  memory plan, and the restarted rank finish the run.
- ``first_step``: a fresh trainer process (DDP, ZeRO-1, 2, 3) from its start to its first
  step, timed by this script's clock, with an empty torch extensions folder (an op
  compiled on the way would land there).
- ``mfu``: tokens/s and MFU of the built-in trainer (``Trainer.step_once``) against a bare
  torch loop of the same model (bf16 autocast, SDPA, fused AdamW, no per-step sync) at
  gpt2-124m, gpt2-350m and gpt-1.3b.
- ``memory``: ``llmtrain_contract.memplan`` against ``torch.cuda.max_memory_allocated`` for
  DDP and ZeRO 1-3 x the three sizes x two micro-batches.
- ``checkpoint``: ``bench/_ckpt_train.py``'s stall (a window of steps with one checkpoint
  against one without) for our trainer, DCP ``async_save`` and a synchronous ``torch.save``
  + fsync, at gpt2-124m and gpt-1.3b (the AdamW state of the latter is 16 GB).

``--cpu`` runs the same code on CPU with the tiny preset (the script's own test). The last
line is ``RESULT ...``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for extra in (HERE, ROOT / "tests", ROOT / "hack", ROOT / "trainer_image", ROOT / "common", ROOT / "operator"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))
from _common import parser, result  # noqa: E402


TORCH_RANGE = ((2, 11), (2, 13))
"""torch versions the trainer is run with: 2.13 in CI and the images, 2.11 on the GPU
machines this script was run on (docs/benchmarks.md)."""
SIZES = ("gpt2-124m", "gpt2-350m", "gpt-1.3b")
SEQ = 1024
SECTIONS = ("env", "resume", "gpu_oom", "first_step", "mfu", "checkpoint", "memory")


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Run:
    out: Path
    budget: float
    quick: bool
    cpu: bool
    began: float = field(default_factory=time.monotonic)
    figures: dict[str, Any] = field(default_factory=dict)
    checkpoint_presets: list[str] = field(default_factory=lambda: ["gpt2-124m", "gpt-1.3b"])

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.began)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu.json").write_text(json.dumps(self.figures, indent=1, default=str))

    def section(self, name: str, needs: float, body: Callable[[Run], dict[str, Any]]) -> None:
        """Run ``body`` if ``needs`` seconds are left; record its figures, its failure or
        its skipping under ``name``."""
        if self.left() < needs:
            self.figures[name] = {"skipped": f"{self.left():.0f}s left of the budget, the section needs {needs:.0f}s"}
            say(f"== {name}: skipped ({self.figures[name]['skipped']})")
            self.save()
            return
        say(f"== {name} ({self.left():.0f}s of the budget left)")
        began = time.monotonic()
        try:
            figures = body(self)
        except Exception as err:  # noqa: BLE001 - a failed section is a finding, the next one still runs
            figures = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            say(figures["traceback"])
        figures["seconds"] = round(time.monotonic() - began, 1)
        self.figures[name] = figures
        self.save()
        try:
            free_gpu()
        except Exception as err:  # noqa: BLE001 - a sticky CUDA error: recorded, the next section still tries
            figures["free_gpu_error"] = f"{type(err).__name__}: {err}"
            self.save()


def free_gpu() -> None:
    import torch  # noqa: PLC0415

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def torch_in_range(version: str) -> bool:
    """``2.11.0+cu130`` -> (2, 11) within ``TORCH_RANGE``."""
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    low, high = TORCH_RANGE
    return low <= (major, minor) <= high


def presets(run: Run) -> tuple[str, ...]:
    return ("tiny",) if run.cpu else (SIZES[:2] if run.quick else SIZES)


def seq(run: Run) -> int:
    return 64 if run.cpu else SEQ


# ---------------------------------------------------------------------------- env


def env_section(run: Run) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    out: dict[str, Any] = {"torch": torch.__version__, "torch_in_range": torch_in_range(torch.__version__),
                           "python": sys.version.split()[0], "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out.update({"gpu": torch.cuda.get_device_name(0), "gpu_memory": props.total_memory,
                    "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())), "bf16": torch.cuda.is_bf16_supported()})
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    try:
        import deepspeed  # noqa: PLC0415

        out["deepspeed"] = deepspeed.__version__
    except Exception as err:  # noqa: BLE001 - recorded
        out["deepspeed"] = f"not importable: {err}"
    say("  " + json.dumps(out))
    return out


# ---------------------------------------------------------------------------- resume


def resume_case(root: Path, name: str, config: dict[str, Any], procs: int, env: dict[str, str], crash_rank: int) -> dict[str, Any]:
    """A reference run and a run SIGKILLed at step 13 (torchrun restarts it), run side by
    side; the losses of every step compared."""
    from support.elastic import losses_by_step, run_job  # noqa: PLC0415

    results: dict[str, Any] = {}

    def one(kind: str, extra: dict[str, str]) -> None:
        try:
            results[kind] = run_job(root / name / kind, config, nodes=1, procs_per_node=procs, max_restarts=3,
                                    env={**env, **extra}, timeout=150)
        except Exception as err:  # noqa: BLE001 - reported below
            results[kind] = err

    threads = [threading.Thread(target=one, args=("reference", {})),
               threading.Thread(target=one, args=("faulty", {"LLMTRAIN_FAULT_INJECT": f"crash@step=13,rank={crash_rank}"}))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out: dict[str, Any] = {}
    for kind in ("reference", "faulty"):
        if isinstance(results[kind], Exception):
            return {"ok": False, "error": f"{kind}: {results[kind]}"[-3000:]}
    (ref, ref_codes), (job, codes) = results["reference"], results["faulty"]
    logs = job.logs()
    out["codes"] = {"reference": ref_codes, "faulty": codes}
    out["device_line"] = next((line.split("first step done ", 1)[1][:60] for line in logs.splitlines()
                               if "first step done " in line), None)
    reference = {r["step"]: r["loss"] for r in ref.steps()}
    seen = losses_by_step(job.steps())
    out["attempts"] = 1 + max((r["attempt"] for r in job.steps()), default=0)
    out["resumed"] = [int(x) for x in __import__("re").findall(r"resumed from step (\d+) ", logs)]
    out["replayed"] = sorted(s for s, losses in seen.items() if len(losses) > 1)
    common = [s for s in seen if s in reference]
    out["worst_loss_difference"] = max((abs(loss - reference[s]) for s in common for loss in seen[s]), default=None)
    out["steps"] = len(seen)
    out["ok"] = (ref_codes == [0] and codes == [0] and out["attempts"] >= 2 and sorted(seen) == sorted(reference)
                 and out["worst_loss_difference"] is not None and out["worst_loss_difference"] <= 1e-6)
    if not out["ok"]:
        out["log_tail"] = logs[-3000:]
        if os.environ.get("LLMTRAIN_GPU_BENCH_LOGS"):
            Path(os.environ["LLMTRAIN_GPU_BENCH_LOGS"], f"resume-{name}.log").write_text(logs)
    say(f"  {name}: ok={out['ok']} attempts {out['attempts']} resumed {out['resumed']} replayed {out['replayed']} "
        f"worst difference {out['worst_loss_difference']} ({out['device_line']})")
    return out


def resume_section(run: Run) -> dict[str, Any]:
    from support.elastic import base_config  # noqa: PLC0415

    root = Path(tempfile.mkdtemp(prefix="gpu-resume-", dir="/var/tmp"))
    preset = "tiny" if run.cpu else "small"
    common = dict(maxSteps=24, data={"seqLen": 128, "vocabSize": 256}, model={"preset": preset},
                  faultTolerance={"hangTimeoutSeconds": 120, "collectiveTimeoutSeconds": 60})
    cases = {
        "ddp-nccl": (base_config(**common), 1, {}, 0),
        "ddp-2ranks-gloo": (base_config(**common), 2, {"LLMTRAIN_DIST_BACKEND": "gloo"}, 1),
        "zero3": (base_config(**common, strategy={"kind": "deepspeed", "zeroStage": 3}), 1, {}, 0),
    }
    import torch  # noqa: PLC0415

    if not run.cpu and torch.cuda.device_count() >= 2:
        # Two NCCL ranks need two GPUs: the CPU collectives then go through the gloo beside NCCL.
        cases["ddp-nccl-2gpus"] = (base_config(**common), 2, {}, 1)
    if run.cpu:
        cases = {"ddp-nccl": cases["ddp-nccl"]}
    out: dict[str, Any] = {}
    try:
        threads = []
        for name, (config, procs, env, crash_rank) in cases.items():
            def go(name: str = name, config: dict[str, Any] = config, procs: int = procs, env: dict[str, str] = env,
                   crash_rank: int = crash_rank) -> None:
                try:
                    out[name] = resume_case(root, name, config, procs, env, crash_rank)
                except Exception as err:  # noqa: BLE001 - recorded
                    out[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            threads.append(threading.Thread(target=go))
            threads[-1].start()
        for t in threads:
            t.join()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["all_ok"] = all(case.get("ok") for case in out.values() if isinstance(case, dict))
    return out


# ---------------------------------------------------------------------------- gpu_oom


def gpu_oom_section(run: Run) -> dict[str, Any]:
    """A real allocator refusal (on CPU: torch's error raised by the fault), named by the
    trainer: exit 88, the GPU's figures, the memory plan; torchrun's restart finishes."""
    from llmtrain_trainer.pod import exitrecord  # noqa: PLC0415
    from support.elastic import base_config, run_job  # noqa: PLC0415

    root = Path(tempfile.mkdtemp(prefix="gpu-oom-", dir="/var/tmp"))
    try:
        config = base_config(maxSteps=10, data={"seqLen": 128, "vocabSize": 256}, model={"preset": "tiny" if run.cpu else "small"},
                             faultTolerance={"hangTimeoutSeconds": 120, "collectiveTimeoutSeconds": 60})
        job, codes = run_job(root, config, nodes=1, procs_per_node=1, max_restarts=2,
                             env={"LLMTRAIN_FAULT_INJECT": "gpu_oom@step=5,rank=0"}, timeout=120)
        records = exitrecord.read_attempt(root / "node0" / "run", 0)
        message = records[0]["message"] if records else None
        out: dict[str, Any] = {"codes": codes, "exit": records[0]["code"] if records else None, "message": message}
        figures = message is not None and ("no CUDA figures" in message if run.cpu else "the allocator's peak" in message)
        out["ok"] = (codes == [0] and out["exit"] == 88 and bool(figures)
                     and "the memory plan at world size 1: peak " in (message or ""))
        if not out["ok"]:
            out["log_tail"] = job.logs()[-3000:]
        say(f"  exit {out['exit']}, then {codes}: {message}")
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------- first step


def first_step(root: Path, strategy: dict[str, Any], preset: str, seq_len: int, micro: int) -> dict[str, Any]:
    """A fresh ``python -m llmtrain_trainer`` (world size 1) from its start to its first step
    record, by this script's clock; and whether anything was compiled on the way."""
    import yaml  # noqa: PLC0415

    name = strategy["kind"] + (f"-zero{strategy['zeroStage']}" if strategy["kind"] == "deepspeed" else "")
    folder = root / name
    ext = folder / "torch-extensions"
    ext.mkdir(parents=True)
    cfg = {"jobName": "gpu-first-step", "maxSteps": 3, "globalBatchSize": micro, "microBatchSize": micro,
           "runDir": str(folder / "run"), "strategy": strategy, "data": {"seqLen": seq_len},
           "model": {"preset": preset}, "checkpoint": {"tiers": []}, "metrics": {"enabled": False},
           "faultTolerance": {"hangTimeoutSeconds": 300, "collectiveTimeoutSeconds": 120}}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    steps = folder / "run" / "steps.jsonl"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "LLMTRAIN_LOG_LEVEL": "WARNING"}
    env.pop("RANK", None)
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "llmtrain_trainer", "--config", str(folder / "config.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    first = None
    while proc.poll() is None and time.monotonic() - began < 120:
        if first is None and steps.exists() and steps.read_text().strip():
            first = time.monotonic() - began
        time.sleep(0.05)
    if first is None and steps.exists() and steps.read_text().strip():
        first = time.monotonic() - began  # the process ended between two looks
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
    compiled = sorted(str(p.relative_to(ext)) for p in ext.rglob("*"))
    building = [line for line in output.splitlines() if "Building extension" in line or "ninja" in line.lower()]
    out = {"exit": proc.returncode, "first_step_seconds": None if first is None else round(first, 2),
           "compiled": compiled[:10], "build_lines": building[:5],
           "startup": next((line.split("start-up phases: ", 1)[1] for line in output.splitlines() if "start-up phases" in line), None)}
    if proc.returncode != 0:
        out["output_tail"] = output[-3000:]
    say(f"  {name}: exit {proc.returncode}, first step after {out['first_step_seconds']}s, compiled {compiled[:3] or 'nothing'}; "
        f"{out['startup']}")
    return out


def first_step_section(run: Run) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="gpu-first-", dir="/var/tmp"))
    strategies = [{"kind": "ddp"}] + [{"kind": "deepspeed", "zeroStage": z} for z in (1, 2, 3)]
    if run.cpu:
        strategies = strategies[:1]
    preset = "tiny" if run.cpu else "gpt2-124m"
    out: dict[str, Any] = {}
    try:
        for strategy in strategies:
            key = strategy["kind"] + (f"-zero{strategy['zeroStage']}" if "zeroStage" in strategy else "")
            out[key] = first_step(root, strategy, preset, seq(run), 4)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["no_compilation"] = all(not v["compiled"] and not v["build_lines"] for v in out.values() if isinstance(v, dict))
    return out


# ---------------------------------------------------------------------------- in-process trainers


def ensure_process_group() -> None:
    """One process group for every in-process section: NCCL for the GPU and gloo beside it
    (DCP's ``async_save`` needs a CPU backend)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    if dist.is_initialized():
        return
    from llmtrain_trainer.train.dist import _free_port  # noqa: PLC0415

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")


def trainer_config(preset: str, micro: int, seq_len: int, run_dir: Path, strategy: dict[str, Any] | None = None) -> Any:
    from llmtrain_contract.config import TrainerConfig  # noqa: PLC0415

    return TrainerConfig.model_validate({
        "jobName": "gpu-bench", "strategy": strategy or {"kind": "ddp"}, "maxSteps": 10**6,
        "globalBatchSize": micro, "microBatchSize": micro, "runDir": str(run_dir),
        "data": {"seqLen": seq_len}, "model": {"preset": preset}, "checkpoint": {"tiers": []},
        "faultTolerance": {"hangTimeoutSeconds": 3600, "collectiveTimeoutSeconds": 3600},
        "metrics": {"enabled": False}, "logIntervalSteps": 10**9,
    })


def build_trainer(cfg: Any, run_dir: Path) -> Any:
    from llmtrain_trainer.train import dist as distmod  # noqa: PLC0415
    from llmtrain_trainer.train.loop import Trainer  # noqa: PLC0415
    from llmtrain_trainer.train.metrics import NullMetrics  # noqa: PLC0415

    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg, distmod.init(3600), NullMetrics(), run_dir)
    trainer.start()
    return trainer


def close_trainer(trainer: Any) -> None:
    trainer.close()
    engine = getattr(trainer, "engine", None)
    staging = getattr(engine, "staging", None)
    if staging is not None:
        staging.unpin()  # the next trainer of this process may get the same addresses
    inner = getattr(engine, "engine", None)
    if inner is not None and hasattr(inner, "destroy"):
        inner.destroy()  # DeepSpeed's engine: release its hooks and buffers


def sync() -> None:
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_steps(step: Callable[[], Any], warmup: int, steps: int) -> float:
    """Seconds per step, the median of three runs of ``steps`` after ``warmup``."""
    for _ in range(warmup):
        step()
    sync()
    runs = []
    for _ in range(3):
        began = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        runs.append((time.perf_counter() - began) / steps)
    return statistics.median(runs)


def bare_loop(preset: str, micro: int, seq_len: int) -> Callable[[], None]:
    """nanoGPT's loop: the same model, bf16 autocast, fused AdamW, gradient clipping, and
    no synchronisation per step."""
    import torch  # noqa: PLC0415

    from llmtrain_trainer.engines.model import make_model  # noqa: PLC0415
    from llmtrain_trainer.engines.schedule import param_groups  # noqa: PLC0415

    cfg = trainer_config(preset, micro, seq_len, Path("/nonexistent"))
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    model = make_model(cfg).to(dev)
    opt = torch.optim.AdamW(param_groups(model, cfg.optimizer.weight_decay), lr=cfg.optimizer.lr, fused=cuda or None)
    vocab = model.shape.vocab_size
    batches = [torch.randint(0, vocab, (micro, seq_len + 1), device=dev) for _ in range(4)]
    count = [0]

    def step() -> None:
        tokens = batches[count[0] % len(batches)]
        count[0] += 1
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=cuda):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.model = model  # type: ignore[attr-defined]  # kept alive with the closure
    return step


def mfu_micro(preset: str, cpu: bool) -> int:
    return 2 if cpu else {"gpt2-124m": 16, "gpt2-350m": 8, "gpt-1.3b": 4}[preset]


def mfu_section(run: Run) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    from llmtrain_contract.config import MODEL_PRESETS  # noqa: PLC0415
    from llmtrain_contract.flops import flops_per_token, mfu  # noqa: PLC0415

    ensure_process_group()
    product = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    warmup, steps = (2, 3) if run.cpu else (5, 10 if run.quick else 20)
    out: dict[str, Any] = {"product": product}
    for preset in presets(run):
        micro, seq_len = mfu_micro(preset, run.cpu), seq(run)
        tokens = micro * seq_len
        shape = MODEL_PRESETS[preset].model_copy(update={"block_size": seq_len})
        bare = bare_loop(preset, micro, seq_len)
        bare_s = time_steps(bare, warmup, steps)
        del bare
        free_gpu()
        run_dir = Path(tempfile.mkdtemp(prefix="gpu-mfu-", dir="/var/tmp"))
        trainer = build_trainer(trainer_config(preset, micro, seq_len, run_dir), run_dir)
        ours_s = time_steps(trainer.step_once, warmup, steps)
        close_trainer(trainer)
        del trainer
        free_gpu()
        shutil.rmtree(run_dir, ignore_errors=True)
        row = {"micro_batch": micro, "seq": seq_len, "flops_per_token": flops_per_token(shape, seq_len),
               "bare_step_s": bare_s, "ours_step_s": ours_s, "bare_tokens_s": tokens / bare_s, "ours_tokens_s": tokens / ours_s,
               "bare_mfu": mfu(tokens / bare_s, shape, seq_len, 1, product), "ours_mfu": mfu(tokens / ours_s, shape, seq_len, 1, product),
               "ratio": bare_s / ours_s}
        out[preset] = row
        say(f"  {preset} micro-batch {micro}x{seq_len}: bare {bare_s * 1e3:.1f} ms/step, ours {ours_s * 1e3:.1f} ms/step, "
            f"ratio {row['ratio']:.3f}, MFU bare {row['bare_mfu']} ours {row['ours_mfu']}")
        run.save()
    out["worst_ratio"] = min(v["ratio"] for k, v in out.items() if isinstance(v, dict))
    return out


# ---------------------------------------------------------------------------- memory plan


def memory_row(preset: str, micro: int, seq_len: int, strategy: dict[str, Any]) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    from llmtrain_contract import memplan  # noqa: PLC0415

    free_gpu()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-mem-", dir="/var/tmp"))
    cfg = trainer_config(preset, micro, seq_len, run_dir, strategy)
    trainer = build_trainer(cfg, run_dir)
    try:
        for _ in range(3):
            trainer.step_once()
        sync()
        peak = torch.cuda.max_memory_allocated() - base
        static = torch.cuda.memory_allocated() - base
    finally:
        close_trainer(trainer)
        del trainer
        shutil.rmtree(run_dir, ignore_errors=True)
    planned = memplan.plan(memplan.from_config(cfg, 1))
    return {"measured_peak": peak, "measured_static": static, "planned_peak": planned.peak, "planned_static": planned.static,
            "relative_error": planned.peak / peak - 1, "terms": planned.terms, "base": base}


def memory_section(run: Run) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    if not torch.cuda.is_available():
        return {"skipped": "no GPU: the allocator's peak is a CUDA figure"}
    ensure_process_group()
    strategies = [{"kind": "ddp"}] + [{"kind": "deepspeed", "zeroStage": z} for z in (1, 2, 3)]
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"rows": rows}
    for preset in presets(run):
        for micro in (1, 4) if preset == "gpt-1.3b" else (2, 8):
            for strategy in strategies:
                if run.left() < 20:
                    out["stopped"] = "budget"
                    return out
                name = f"{preset} mb{micro} " + (f"zero{strategy['zeroStage']}" if "zeroStage" in strategy else "ddp")
                try:
                    row = {"row": name, **memory_row(preset, micro, SEQ, strategy)}
                    say(f"  {name}: measured {row['measured_peak'] / 2**30:.2f} GiB (static {row['measured_static'] / 2**30:.2f}), "
                        f"planned {row['planned_peak'] / 2**30:.2f} (static {row['planned_static'] / 2**30:.2f}), "
                        f"error {row['relative_error'] * 100:+.1f}%")
                except Exception as err:  # noqa: BLE001 - recorded, the next row runs
                    row = {"row": name, "failed": f"{type(err).__name__}: {err}"[:500]}
                    say(f"  {name}: failed {row['failed']}")
                rows.append(row)
                run.save()
    errors = [abs(r["relative_error"]) for r in rows if "relative_error" in r]
    out["worst_abs_error"] = max(errors) if errors else None
    return out


# ---------------------------------------------------------------------------- checkpoint stall


def checkpoint_row(run: Run, preset: str, micro: int, disk: Path) -> dict[str, Any]:
    from _ckpt_train import DcpTrainer, OurTrainer, measure  # noqa: PLC0415

    ensure_process_group()
    pairs = 2 if (run.quick or preset == "gpt-1.3b" or run.cpu) else 4
    seq_len = seq(run)
    dtype = "float32" if run.cpu else "auto"
    folder = Path(tempfile.mkdtemp(prefix=f"ckpt-{preset}-", dir=disk))
    out: dict[str, Any] = {"micro_batch": micro, "seq": seq_len, "pairs": pairs}
    try:
        ours = OurTrainer(preset, micro, seq_len, folder / "tier1", folder / "run", dtype=dtype)
        # A window long enough for one checkpoint to be written while the steps go on.
        for _ in range(3):
            ours.step()
        began = time.perf_counter()
        done, wait = ours.checkpoint()
        probe_steps = 0
        while not done() and probe_steps < 2000:
            ours.step()
            probe_steps += 1
        wait()
        probe = time.perf_counter() - began
        window = max(5, min(400, math.ceil(probe_steps * 1.5) + 2))
        out.update({"state_bytes": ours.state_bytes(), "probe_persist_s": probe, "probe_steps": probe_steps, "window": window})
        say(f"  {preset}: state {ours.state_bytes() / 1e9:.2f} GB; one checkpoint persisted in {probe:.2f}s over {probe_steps} "
            f"steps; windows of {window} steps")
        stall = measure(ours, pairs, window, log=say)
        ours.close()
        del ours
        free_gpu()
        out["ours"] = vars(stall)
        dcp = DcpTrainer(preset, micro, seq_len, folder / "dcp", dtype=dtype)
        stall_dcp = measure(dcp, pairs, window, log=say)
        sync_s = [dcp.sync_save(folder / "sync.pt") for _ in range(1 if preset == "gpt-1.3b" else 2)]
        del dcp
        free_gpu()
        out["dcp"] = vars(stall_dcp)
        out["sync_save_s"] = sync_s
        floor = 0.01
        out["stall_reduction"] = statistics.median(sync_s) / max(stall.mean, floor)
        out["stall_vs_dcp"] = stall.mean / max(stall_dcp.mean, floor)
        say(f"  {preset}: our stall mean {stall.mean:.3f}s (worst {stall.worst:.3f}s), DCP {stall_dcp.mean:.3f}s, "
            f"synchronous save {statistics.median(sync_s):.2f}s; reduction {out['stall_reduction']:.1f}x, "
            f"ours/DCP {out['stall_vs_dcp']:.2f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def checkpoint_section(run: Run) -> dict[str, Any]:
    disk = Path(os.environ.get("LLMTRAIN_GPU_BENCH_DISK", "/var/tmp"))
    out: dict[str, Any] = {"disk": str(disk)}
    rows = ("tiny",) if run.cpu else tuple(run.checkpoint_presets)
    for preset in rows:
        if preset == "gpt-1.3b" and run.left() < 150:
            out[preset] = {"skipped": f"{run.left():.0f}s left"}
            continue
        micro = 2 if run.cpu else (8 if preset == "gpt2-124m" else 4)
        try:
            out[preset] = checkpoint_row(run, preset, micro, disk)
        except Exception as err:  # noqa: BLE001 - recorded
            out[preset] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
            say(out[preset]["traceback"])
        run.save()
    return out


# ---------------------------------------------------------------------------- main

NEEDS = {"env": 0, "resume": 60, "gpu_oom": 30, "first_step": 40, "mfu": 45, "memory": 40, "checkpoint": 60}
BODIES: dict[str, Callable[[Run], dict[str, Any]]] = {
    "env": env_section, "resume": resume_section, "gpu_oom": gpu_oom_section, "first_step": first_step_section,
    "mfu": mfu_section,
    "memory": memory_section, "checkpoint": checkpoint_section,
}


def summary(figures: dict[str, Any]) -> dict[str, Any]:
    """The RESULT line's values from whatever sections ran."""
    out: dict[str, Any] = {}
    resume = figures.get("resume", {})
    if "all_ok" in resume:
        out["resume_exact"] = int(bool(resume["all_ok"]))
    if "ok" in figures.get("gpu_oom", {}):
        out["gpu_oom_named"] = int(bool(figures["gpu_oom"]["ok"]))
    first = figures.get("first_step", {})
    if "no_compilation" in first:
        out["no_compilation"] = int(bool(first["no_compilation"]))
        times = [v["first_step_seconds"] for v in first.values() if isinstance(v, dict) and v.get("first_step_seconds")]
        if times:
            out["first_step_worst_s"] = max(times)
    mfu = figures.get("mfu", {})
    if "worst_ratio" in mfu:
        out["mfu_ratio_worst"] = round(mfu["worst_ratio"], 3)
    memory = figures.get("memory", {})
    if memory.get("worst_abs_error") is not None:
        out["memplan_worst_error"] = round(memory["worst_abs_error"], 3)
    for preset, row in figures.get("checkpoint", {}).items():
        if isinstance(row, dict) and "stall_reduction" in row:
            out[f"stall_reduction_{preset}"] = round(row["stall_reduction"], 1)
            out[f"stall_vs_dcp_{preset}"] = round(row["stall_vs_dcp"], 3)
    failed = [name for name, v in figures.items() if isinstance(v, dict) and _failed(v)]
    out["failed_sections"] = ",".join(failed) or "none"
    return out


def _failed(figures: Any) -> bool:
    """Whether a section's figures hold a failure anywhere: an error, a failed row, a case
    that is not ok (a checkpoint row's error, a memory row's failure, a resume case)."""
    if isinstance(figures, dict):
        if "error" in figures or "failed" in figures or figures.get("ok") is False:
            return True
        return any(_failed(v) for v in figures.values())
    if isinstance(figures, list):
        return any(_failed(v) for v in figures)
    return False


def main(argv: list[str] | None = None) -> int:
    # Quiet trainer logs for the benchmark's own runs: set here, not at import, since a
    # test that imports this module must not change its session's environment (it once
    # silenced every later trainer run's log in the suite).
    os.environ.setdefault("LLMTRAIN_LOG_LEVEL", "ERROR")
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--out", default="gpu-bench", help="folder for gpu.json")
    p.add_argument("--only", default=",".join(SECTIONS), help="sections to run, comma-separated")
    p.add_argument("--budget", type=float, default=450, help="seconds; a section that needs more than is left is skipped")
    p.add_argument("--cpu", action="store_true", help="run on CPU with the tiny preset (the script's own test)")
    p.add_argument("--checkpoint-presets", default="gpt2-124m,gpt-1.3b", help="presets of the checkpoint section")
    args = p.parse_args(argv)
    chosen = [s for s in args.only.split(",") if s]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        p.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    run = Run(Path(args.out), args.budget, args.quick, args.cpu, checkpoint_presets=args.checkpoint_presets.split(","))
    for name in SECTIONS:
        if name in chosen:
            run.section(name, NEEDS[name], BODIES[name])
    run.figures["total_seconds"] = round(time.monotonic() - run.began, 1)
    run.save()
    result(**summary(run.figures), seconds=run.figures["total_seconds"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
