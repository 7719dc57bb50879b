"""Entry point: ``python -m llmtrain_trainer --config FILE`` (run under torchrun).

Build the config, train, close in a ``finally``. Every way out maps to a documented
exit code (``exitcodes.py``) and leaves an exit record for the launcher.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import yaml
from pydantic import ValidationError

from llmtrain_trainer.pod import exitrecord
from llmtrain_trainer.train import gpumem
from llmtrain_trainer.train.faults import FaultInjector
from llmtrain_trainer.train.peers import is_collective_failure
from llmtrain_contract import memplan
from llmtrain_contract.config import TrainerConfig, WorldSizeInvalid
from llmtrain_contract.exitcodes import ExitCode
from llmtrain_contract.names import Env


STARTUP: dict[str, float] = {}
"""Seconds spent in each start-up phase, logged with the first step (recovery time is
mostly start-up time)."""


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def _warm_imports() -> None:
    try:
        import torch._dynamo  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001 - only an optimisation
        pass


def load_config(path: str) -> TrainerConfig:
    with open(path) as fh:
        raw = yaml.safe_load(fh)
    return TrainerConfig.model_validate(raw or {})


def _configure_logging() -> None:
    """The trainer's own messages from INFO (``LLMTRAIN_LOG_LEVEL``): its milestones (first
    step, resumed from step N) are INFO, what went wrong WARNING and up. Libraries (torch,
    DeepSpeed) from WARNING, whatever the variable says: their INFO is noise in a pod's log."""
    logging.basicConfig(
        level=logging.WARNING,
        format=f"[rank {_rank()}] %(asctime)s %(name)s %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    wanted = os.environ.get(Env.LOG_LEVEL, "INFO").upper()
    level = logging.getLevelName(wanted)
    if not isinstance(level, int):
        logging.getLogger("llmtrain").warning("%s=%r is not a log level (DEBUG, INFO, WARNING, ERROR); using INFO",
                                              Env.LOG_LEVEL, wanted)
        level = logging.INFO
    logging.getLogger("llmtrain").setLevel(level)


def _fail(run_dir: Path, code: int, message: str, step: int | None = None) -> int:
    print(f"llmtrain: {ExitCode(code).name} (exit {int(code)}): {message}", file=sys.stderr, flush=True)
    try:
        exitrecord.write(run_dir, _attempt(), _rank(), _local_rank(), code, message, step)
    except OSError as err:
        print(f"llmtrain: could not write the exit record: {err}", file=sys.stderr)
    return int(code)


def _gpu_oom_message(cfg: TrainerConfig, err: BaseException) -> str:
    """The GPU's figures and the memory plan at this attempt's world size, against this GPU."""
    gpu = gpumem.figures(err)
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        plan = memplan.verdict(memplan.from_config(cfg, world), gpu.total_bytes if gpu is not None else None)
    except Exception as plan_err:  # noqa: BLE001 - the OOM is named without its plan rather than not at all
        plan = f"no memory plan ({type(plan_err).__name__}: {plan_err})"
    return gpumem.message(_rank(), err, gpu, plan)


class HealingUnsupported(ValueError):
    """``inProcessHealing`` with an engine that cannot heal in process."""


def _healing(cfg: TrainerConfig):
    """The rank's in-process healing (``train/heal.py``), or None: not asked for, or not
    under the launcher (then nobody restarts a rank in place, and failures restart
    processes as without it)."""
    if not cfg.fault_tolerance.in_process_healing:
        return None
    if cfg.strategy.kind != "ddp":
        raise HealingUnsupported(f"faultTolerance.inProcessHealing needs strategy 'ddp' (this job's is "
                                 f"'{cfg.strategy.kind}': a ZeRO shard lost with its rank has no replica to heal from)")
    from llmtrain_trainer.train.heal import Healing  # noqa: PLC0415 - imported by run() before its warm-up thread starts

    healing = Healing.from_env(cfg.fault_tolerance.collective_timeout_seconds)
    if healing is None and _rank() == 0:
        logging.getLogger("llmtrain").warning("faultTolerance.inProcessHealing: no %s (not started by the launcher); "
                                              "a failure restarts processes", Env.HEAL_STORE)
    return healing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmtrain_trainer")
    parser.add_argument("--config", required=True, help="trainer config (YAML/JSON) rendered by the operator")
    args = parser.parse_args(argv)
    _configure_logging()
    fallback_dir = Path(os.environ.get(Env.RUN_DIR, "/tmp/llmtrain"))
    try:
        cfg = load_config(args.config)
    except OSError as err:
        return _fail(fallback_dir, ExitCode.CONFIG_ERROR, f"cannot read config {args.config}: {err.strerror}")
    except (yaml.YAMLError, ValidationError) as err:
        return _fail(fallback_dir, ExitCode.CONFIG_ERROR, f"invalid config {args.config}: {err}")
    try:
        # First thing, before torch: a rank that dies from here on without a record died
        # of a signal, and its earlier runs' records are not taken for its own.
        exitrecord.mark_started(Path(cfg.run_dir), _attempt(), _local_rank())
    except OSError as err:
        return _fail(fallback_dir, ExitCode.CONFIG_ERROR, f"run dir {cfg.run_dir} is not writable: {err.strerror}")

    began = time.perf_counter()
    import torch  # noqa: PLC0415 - after the config: a bad config fails fast without torch

    STARTUP["import_torch"] = time.perf_counter() - began
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed on CPU (gloo)
    return run(cfg, Path(args.config).parent)


def run(cfg: TrainerConfig, config_dir: Path | None = None) -> int:
    # Everything below imports torch: only after the config was read, so that a bad
    # config exits in a fraction of a second with its documented code.
    from llmtrain_trainer.train import dist as distmod  # noqa: PLC0415
    from llmtrain_trainer.checkpoint.restore import NoLoadableCheckpoint, TierUnavailable  # noqa: PLC0415
    from llmtrain_trainer.engines.data import DataError  # noqa: PLC0415
    from llmtrain_trainer.engines.safeload import UnsafeCheckpoint  # noqa: PLC0415
    from llmtrain_trainer.train.metrics import NullMetrics, TrainerMetrics  # noqa: PLC0415
    from llmtrain_trainer.train.loop import Trainer  # noqa: PLC0415
    from llmtrain_trainer.train import heal  # noqa: F401, PLC0415 - here, not beside the warm-up's imports (below)

    # Building the optimizer imports torch._dynamo (~1.5 s of a restart's critical path);
    # that import runs in a thread of its own while the process group starts, which mostly
    # waits on peers. Only there: two threads importing overlapping module graphs can
    # deadlock on import locks, which Python breaks by handing one of them a half-imported
    # module ("module 'sympy' has no attribute 'core'"). Process-group init imports
    # nothing, and the main thread joins the warm-up before it imports anything again.
    warming = threading.Thread(target=_warm_imports, name="warm-imports", daemon=True)
    warming.start()
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = None
    try:
        # Test faults for step 0: start-up, before the process group (faults.py).
        FaultInjector.from_env(_rank(), _attempt(), run_dir).at_step(0)
        began = time.perf_counter()
        healing = _healing(cfg)
        first_round = healing.start() if healing is not None else None
        info = healing.info() if healing is not None else distmod.init(cfg.fault_tolerance.collective_timeout_seconds)
        STARTUP["dist_init"] = time.perf_counter() - began
        warming.join()
        metrics = (
            TrainerMetrics(info.rank, cfg.strategy.kind, cfg.config_hash(), cfg.job_name)
            if cfg.metrics.enabled else NullMetrics()
        )
        port = cfg.metrics.port + info.local_rank if cfg.metrics.port else 0
        # The operator renders "$POD_IP": bind to the pod's address, not every interface.
        host = os.path.expandvars(cfg.metrics.host)
        metrics.serve(host if host and not host.startswith("$") else "0.0.0.0", port, run_dir, info.local_rank)
        metrics.started(info.world_size, info.restart_count,
                        exitrecord.failed_attempts(run_dir, info.restart_count, info.local_world_size))
        try:
            trainer = Trainer(cfg, info, metrics, run_dir, config_dir, healing, first_round)
        except WorldSizeInvalid as err:
            return _fail(run_dir, ExitCode.WORLD_SIZE_INVALID, str(err))
        trainer.startup = STARTUP
        code = trainer.run()
        exitrecord.write(run_dir, info.restart_count, info.rank, info.local_rank, code,
                         trainer.exit_message or ExitCode(code).name.lower(), trainer.step, dict(trainer.ckpt.last_committed),
                         trainer.last_loss)
        if code == ExitCode.SUCCESS:
            distmod.shutdown()
        return int(code)
    except HealingUnsupported as err:
        return _fail(run_dir, ExitCode.CONFIG_ERROR, str(err))
    except DataError as err:
        return _fail(run_dir, ExitCode.DATA_ERROR, str(err))
    except (NoLoadableCheckpoint, UnsafeCheckpoint) as err:
        return _fail(run_dir, ExitCode.CORRUPT_CHECKPOINT, str(err))
    except TierUnavailable as err:
        return _fail(run_dir, ExitCode.TRANSIENT, str(err))
    except Exception as err:  # noqa: BLE001 - every exit must be classified
        step = trainer.step if trainer else None
        # A victim first: a collective that broke while handling an OOM has it as context.
        if is_collective_failure(err):
            return _fail(run_dir, ExitCode.COLLECTIVE_TIMEOUT, f"{type(err).__name__}: {err}", step)
        if (oom := gpumem.out_of_memory(err)) is not None:
            traceback.print_exc()
            return _fail(run_dir, ExitCode.GPU_OUT_OF_MEMORY, _gpu_oom_message(cfg, oom), step)
        traceback.print_exc()
        exitrecord.write(run_dir, _attempt(), _rank(), _local_rank(), 1, f"{type(err).__name__}: {err}", step)
        return 1
