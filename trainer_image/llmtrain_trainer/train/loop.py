"""The training loop, top to bottom.

    start:  agree on a restore point (resume.py) -> build the engine -> load or seed
            -> arm the rescue (rescue.py) and the watchdog
    step:   fault hook -> micro-batches -> engine step -> agree (agreement.py: loss,
            stop, checkpoint flags, stragglers) -> numerics (roll back?) -> beat, metrics,
            step log -> checkpoint if due (cadence)
    end:    the final checkpoint, synchronous; or, after SIGTERM, the emergency one
    heal:   (inProcessHealing) a collective failed: a new group with the failed peer's
            replacement, the state from the round's donor (heal.py), the loop goes on

Each concern is a small unit called from here; the loop holds only the step and the
data position.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, cast

import torch
from llmtrain_contract import flops, params
from llmtrain_contract.config import TrainerConfig
from llmtrain_contract.exitcodes import ExitCode
from llmtrain_contract.names import Env
from llmtrain_store.build import build_tiers
from llmtrain_store.health import NO_SPACE
from llmtrain_store.tier import CheckpointError

from llmtrain_trainer.checkpoint.cadence import Cadence
from llmtrain_trainer.checkpoint.manager import CheckpointManager
from llmtrain_trainer.checkpoint.off import NoCheckpoints
from llmtrain_trainer.checkpoint.protocol import Checkpoints
from llmtrain_trainer.engines import rng
from llmtrain_trainer.engines.base import Engine, EngineClass, Healable, device
from llmtrain_trainer.engines.data import build_source, micro_batch_indices
from llmtrain_trainer.engines.ddp import broadcast_json
from llmtrain_trainer.engines.select import engine_class
from llmtrain_trainer.engines.init_weights import check_deferred
from llmtrain_trainer.pod import exitrecord
from llmtrain_trainer.pod.heartbeat import WAITING_STATES, Heartbeat, State
from llmtrain_trainer.train import agreement
from llmtrain_trainer.train.agreement import Agreed, Proposal
from llmtrain_trainer.train.faults import FaultInjector
from llmtrain_trainer.train.healround import HealError, HealStopped, Round
from llmtrain_trainer.train.numerics import DataPosition, LossGuard
from llmtrain_trainer.train.peers import is_collective_failure
from llmtrain_trainer.train.rescue import Rescuer
from llmtrain_trainer.train.resume import RestorePoint, Resume
from llmtrain_trainer.train.steplog import StepLog
from llmtrain_trainer.train.stragglers import StragglerWatch
from llmtrain_trainer.train.watchdog import Watchdog, dump_stacks_and_exit, first_step_limit
from llmtrain_trainer.world import DistInfo

log = logging.getLogger("llmtrain.trainer")


class BadNumerics(RuntimeError):
    """Bad numerics once more after ``maxRollbacks`` rollbacks."""


def build_checkpoints(cfg: TrainerConfig, info: DistInfo, naming: EngineClass, metrics: Any, heartbeat: Any) -> Checkpoints:
    """The tiers of ``checkpoint.tiers``, or nothing at all (``checkpoint.enabled: false``
    renders no tier): chosen once, so the loop never asks again."""
    tiers = build_tiers(cfg.checkpoint.tiers)
    if not tiers:
        return NoCheckpoints()
    # ``model``: the shape, for what reads a checkpoint without the job (an export to GPT-2's
    # layout needs the heads, which no parameter's shape tells).
    # ``owner``: the job's uid, so that a job re-created under the same name (same tiers)
    # never prunes what it did not write (``llmtrain_store.owner``); a local run's id.
    meta = {"config_hash": cfg.config_hash(), "strategy": cfg.strategy.kind, "job": cfg.job_name, "max_steps": cfg.max_steps,
            "model": cfg.model.shape(cfg.data.seq_len).model_dump(), "owner": cfg.job_uid or cfg.job_name}
    return CheckpointManager(tiers, info, naming, meta, commit_timeout=max(60.0, cfg.fault_tolerance.collective_timeout_seconds),
                             metrics=metrics, heartbeat=heartbeat)


class Trainer:
    def __init__(self, cfg: TrainerConfig, info: DistInfo, metrics: Any, run_dir: Path, config_dir: Path | None = None,
                 healing: Any = None, first_round: Round | None = None):
        self.cfg = cfg
        self.healing = healing
        """``heal.Healing`` with ``inProcessHealing`` under the launcher: the process groups
        come from its rounds, and a failed collective heals (``_heal``)."""
        self.first_round = first_round
        """The round this process started in: one that heals makes it a replacement,
        which gets the state from a survivor instead of storage."""
        self._boundary_updates = 0
        """The engine's optimizer updates at the last step boundary: one more means this
        rank's state is a step past the last agreed one (the agreement failed)."""
        self._lineage: list[str] = []
        self.info = info
        self.metrics = metrics
        self.run_dir = run_dir
        self.accum = cfg.grad_accum_steps(info.world_size)  # raises for an invalid world size
        self.source = build_source(cfg.data, cfg.seed, cfg.model.shape(cfg.data.seq_len).vocab_size)
        self.strategy: EngineClass = engine_class(cfg.strategy.kind)
        self.faults = FaultInjector.from_env(info.rank, info.restart_count, run_dir)
        self.step = 0
        self.last_loss: float | None = None
        """The agreed loss of ``step``, once this attempt has finished a step (the exit record
        reports it: the metrics of the last step may never be scraped)."""
        self.position = DataPosition()
        """Where the data stream is: skipped windows of samples, rollbacks."""
        self.guard = LossGuard(cfg.fault_tolerance.numerics)
        self.stragglers = StragglerWatch(cfg.fault_tolerance.stragglers)
        self._stop = threading.Event()
        if healing is not None:
            healing.stopping = self._stop.is_set  # a SIGTERM from its own agent gives up a round (Rounds.join)
        hang_timeout = cfg.fault_tolerance.hang_timeout_seconds
        self.watchdog = Watchdog(
            hang_timeout, self._on_hang,
            heartbeat=Heartbeat(run_dir, info.rank, info.local_rank, info.restart_count, first_step_limit(hang_timeout)),
            supervised=os.environ.get(Env.SUPERVISED) == "1", on_rescue=self._on_rescue_request,
        )
        self.ckpt = build_checkpoints(cfg, info, self.strategy, metrics, self.watchdog.beat)
        self.resume = Resume(cfg, info, self.ckpt, metrics, sharded=cfg.strategy.kind == "deepspeed")
        self.rescuer = Rescuer(self.ckpt, self.guard, self.watchdog, cfg.checkpoint.sigterm_budget_seconds,
                               cfg.global_batch_size, enabled=bool(cfg.checkpoint.tiers))
        self.cadence = Cadence(cfg.checkpoint, config_dir, metrics)
        self.engine: Engine | None = None
        self.steplog: StepLog | None = None
        self.startup: dict[str, float] = {}
        self.exit_message: str | None = None
        """Why the run ends with its exit code, when there is more to say than its name."""
        self._first_step = True
        # Asked once, here: a torch.cuda query in the middle of a CPU run (the first step's
        # log line once asked one) made the next steps' losses differ from an identical
        # run's by 1e-7 and more on this machine's CUDA build of torch.
        self.device = device()
        self.flops_per_token = flops.flops_per_token(cfg.model.shape(cfg.data.seq_len), cfg.data.seq_len, params.of_spec(cfg))
        self.peak_flops = flops.peak_flops(torch.cuda.get_device_name(self.device)) if self.device.type == "cuda" else None
        """This rank's GPU's dense bf16 peak, when the table knows it (every rank of a job
        is assumed to run on the same product)."""

    # ------------------------------------------------------------------ the run

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self.start()
        try:
            while self.step < self.cfg.max_steps:
                try:
                    if self.step_once():
                        return self._preempted()
                except Exception as err:
                    if not (is_collective_failure(err) and self._heal(err)):
                        raise
            return self._final_save()
        except BadNumerics as err:
            self.exit_message = str(err)
            log.error("%s", err)
            return ExitCode.BAD_NUMERICS
        except Exception as err:
            if is_collective_failure(err):
                first_line = (str(err).splitlines() or [""])[0][:200]
                self.rescuer.save(f"a collective failed ({type(err).__name__}: {first_line})")
                if self.watchdog.rescue_requested():
                    # The supervisor judged this rank a victim and wrote its exit record
                    # before it asked: end as the request does, leaving that record.
                    sys.stderr.flush()
                    os._exit(ExitCode.COLLECTIVE_TIMEOUT)
            raise
        finally:
            self.close()

    def start(self) -> None:
        """Restore (or start fresh), then arm the rescue and the watchdog and open the step log."""
        began = time.perf_counter()
        if self.first_round is not None and self.first_round.heals:
            # Restarted in place into a job that goes on: a survivor sends the state.
            self.engine = self.strategy.create(self.cfg, self.info, False)
            self.ckpt.bind(self.engine)
            built = time.perf_counter()
            self._transfer(self.first_round)
            received = time.perf_counter()
            self.metrics.healed("replacement", received - began)
            self.cadence.start(self.step)
            self.ckpt.prepare(lambda: None, self.step, self._lineage, sweep_shared=False)
            formed = self.healing.formed_at if self.healing is not None else began
            log.info("restarted in process: step %d from rank %d's memory, %.2fs after the round formed (the group and "
                     "set-up %.2fs, the engine and its DDP wrapper %.2fs, the state %.2fs)", self.step, self.first_round.donor,
                     received - formed, began - formed, built - began, received - built)
        else:
            point = self.resume.agree()
            self.engine = self.strategy.create(self.cfg, self.info, point is not None and point.choice.mode == "universal")
            self.ckpt.bind(self.engine)
            self._load(point)
            if point is not None:
                self.position = DataPosition.from_wire(point.choice.data)
            self._publish_position()
            self.cadence.start(self.step)
            self._lineage = list(point.choice.lineage) if point is not None else []
            self.ckpt.prepare(self._barrier, self.step, self._lineage)
        self._boundary_updates = self._engine().updates()
        self.startup["setup"] = time.perf_counter() - began
        self._first_step = True
        self.rescuer.arm(self.engine, self.step)
        self.watchdog.start()
        if self.info.rank == 0:
            self.steplog = StepLog(self.cfg, self.run_dir, self.info.world_size, self.accum, self.info.restart_count)

    def step_once(self) -> bool:
        """One optimizer step with everything around it. True when the ranks agreed to
        stop (SIGTERM)."""
        engine = self._engine()
        began = time.perf_counter()
        self.faults.at_step(self.step + 1)
        if self.cfg.fault_tolerance.in_process_healing:
            # Each rank's generators from (seed, rank, step): a rank restarted in process
            # draws what its predecessor would have (no peer holds another's RNG state).
            rng.seed_all(rng.step_seed(self.cfg.seed, self.info.rank, self.step + 1))
        if self.faults.poison:
            self.faults.poison = False
            with torch.no_grad():
                next(iter(engine.parameters())).view(-1)[0] = float("nan")
        with self.watchdog.section(State.TRAIN_STEP):
            local_loss = engine.train_step(self.step, self._micro_batches())
        self.rescuer.updated(self.step + 1, local_loss)
        self.faults.before_agree(self.step + 1)
        with self.watchdog.section(State.COLLECTIVE):
            agreed = self._agree(float(local_loss), engine.sync_started - began)
        self.cadence.agreed(agreed.interval)
        self._watch_stragglers(agreed.local_seconds)
        bad = self.guard.judge(agreed.loss)
        if bad is not None:
            self.rescuer.judged_bad()
            self._roll_back(self.step + 1, bad)
            return False
        self.step += 1
        self._boundary_updates = engine.updates()
        self.rescuer.at_boundary(self.step)
        seconds = time.perf_counter() - began
        self.watchdog.beat(self.step)
        self._report(agreed.loss, seconds)
        if agreed.stop:
            return True
        self._checkpoint_if_due(agreed)
        self.cadence.observe(seconds, self.ckpt.costs, self.ckpt.writing())
        return False

    def close(self) -> None:
        self.watchdog.stop()
        self.ckpt.close()
        if self.steplog is not None:
            self.steplog.close()

    # ------------------------------------------------------------------ a step's parts

    def _engine(self) -> Engine:
        assert self.engine is not None, "start() builds the engine"
        return self.engine

    def _micro_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cfg, info = self.cfg, self.info
        data_step = self.position.data_step(self.step)
        return [self.source.batch(micro_batch_indices(data_step, a, info.rank, info.world_size, cfg.global_batch_size,
                                                      cfg.micro_batch_size))
                for a in range(self.accum)]

    def _agree(self, local_loss: float, local_seconds: float) -> Agreed:
        interval = self.cadence.proposal() if self.info.rank == 0 else 0
        proposal = Proposal(loss=local_loss, stop=self._stop.is_set(), writing=self.ckpt.busy(), interval=interval,
                            tiers_busy=self.ckpt.tiers_busy(), local_seconds=local_seconds)
        return agreement.agree(self.info, proposal)

    def _report(self, loss: float, seconds: float) -> None:
        """Metrics, the step log and, after an attempt's first step, its start-up phases."""
        cfg, info = self.cfg, self.info
        self.last_loss = loss
        tokens = cfg.global_batch_size * cfg.data.seq_len
        # The global batch splits evenly over the ranks (the world size divides it).
        node_tokens = tokens * info.local_world_size // info.world_size if info.is_node_leader else 0
        self.metrics.step(self.step, self.step * cfg.global_batch_size, loss, seconds, node_tokens)
        if seconds > 0:
            self.metrics.throughput(tokens / seconds)
        if self.peak_flops:
            self.metrics.mfu(tokens / seconds * self.flops_per_token / (self.peak_flops * info.world_size))
        if self.steplog is not None:
            self.steplog.record(self.step, loss, seconds, self.position, self.ckpt.newest_local())
        if self._first_step and info.rank == 0:
            self._first_step = False
            self.startup["first_step"] = seconds
            log.info("first step done on %s (%s); start-up phases: %s", self.device, info.backend,
                        ", ".join(f"{k} {v:.2f}s" for k, v in self.startup.items()))

    def _checkpoint_if_due(self, agreed: Agreed) -> None:
        """Save the step when the cadence says so. A rank still writing the previous one
        defers it, every rank alike (they all read the same agreed flag), to the first
        step where none is; once deferred for a whole interval, every rank waits for the
        write instead."""
        if not self.cadence.due(self.step, self.cfg.max_steps):
            return
        writing = agreed.writing
        if writing and self.cadence.overdue(self.step):
            writing = not self._wait_for_previous_checkpoint()
        if writing:
            self.cadence.deferred()
            self.ckpt.defer()
            return
        self.ckpt.save(self.step, self.step * self.cfg.global_batch_size, rng.capture(), agreed.tiers_busy)
        self.cadence.saved(self.step)

    def _wait_for_previous_checkpoint(self) -> bool:
        """Every rank waits until its previous checkpoint is written; True when all are."""
        began = time.perf_counter()
        free = agreement.all_true(self.info, self.ckpt.wait_free())
        waited = time.perf_counter() - began
        self.metrics.checkpoint_stall(waited)
        if self.info.rank == 0:
            log.warning("step %d: waited %.1fs for the previous checkpoint's write, which took longer than an interval "
                        "(a shorter interval than the tiers can write only adds stalls)", self.step, waited)
        return free

    def _watch_stragglers(self, local_seconds: list[float]) -> None:
        new, cleared = self.stragglers.observe(local_seconds)
        if self.info.rank == 0:
            knobs = self.cfg.fault_tolerance.stragglers
            for rank, ratio in new.items():
                log.warning("straggler: rank %d's local step time has been %.1fx the other ranks' median for %d steps "
                            "(stragglers.factor=%g)", rank, ratio, knobs.steps, knobs.factor)
            for rank in cleared:
                log.warning("straggler: rank %d keeps pace again", rank)
        node = set(self.info.ranks_on_node())
        if self.info.local_rank == 0 and (new or cleared or self.stragglers.flagged):
            self.metrics.stragglers({r: v for r, v in self.stragglers.flagged.items() if r in node}, cleared & node)

    # ------------------------------------------------------------------ in-process healing

    HEAL_ATTEMPTS = 3
    """Rounds a survivor tries before it recovers as without healing (a peer of the new
    round failing too, while it forms or while the state is sent)."""

    def _heal(self, err: BaseException) -> bool:
        """A collective failed: form a new group with the failed peer's replacement and go
        on from the state held here (the donor's, if another survivor holds a newer one).
        False when that cannot be done: the caller recovers as without healing."""
        if self.healing is None:
            return False
        began = time.perf_counter()
        engine = cast(Healable, self._engine())  # inProcessHealing runs DDP only (main.py)
        first_line = (str(err).splitlines() or [""])[0][:200]
        log.warning("step %d: a collective failed (%s: %s); healing in process", self.step + 1, type(err).__name__, first_line)
        # The failed step's frames hold the DDP wrapper, and with it the failed group.
        traceback.clear_frames(err.__traceback__)
        intact = True  # False once a transfer into this rank failed half way
        for _ in range(self.HEAL_ATTEMPTS):
            held = self.step + (engine.updates() - self._boundary_updates) if intact else None
            # Nothing may hold the failed group once it is dropped (heal._abandon): its
            # connections close only with it, and a peer still blocked on this rank in a
            # collective fails only then.
            engine.unwrap()
            gc.collect()
            try:
                with self.watchdog.section(State.COLLECTIVE):
                    self.ckpt.wait_free()  # the state may be received in place: no snapshot of it in flight
                    formed = self.healing.reform(held)
                    if not formed.heals:
                        raise HealError(f"round {formed.index}: no member holds an intact state")
                    self.rescuer.forget()  # from here the state may be half received until it is all in
                    intact = False
                    engine.rewrap()
                    wrapped = time.perf_counter()
                    self._transfer(formed)
                    intact = True
            except HealStopped as stopped:
                log.warning("healing in process: %s; the rank ends, and its node's agent restarts its ranks", stopped)
                if self.info.world_size > self.info.local_world_size:
                    # torchrun stops a node's ranks for one's failure and restarts them in
                    # place: the other nodes' ranks hold this same state and heal with them.
                    # A rescue checkpoint here would only hold that restart up (2.05 s for
                    # the tiny model's, measured beside three other ranks on two cores).
                    self.rescuer.forget()
                return False
            except HealError as heal_err:
                log.error("healing in process failed: %s; the rank ends, and the job recovers by restarting", heal_err)
                return False
            except Exception as again:
                if not is_collective_failure(again):
                    raise
                traceback.clear_frames(again.__traceback__)
                log.warning("healing in process: the new group failed too (%s); another round", type(again).__name__)
                continue
            self.rescuer.arm(engine, self.step)
            self.watchdog.beat(self.step)
            done = time.perf_counter()
            self.metrics.healed("survivor", done - began)
            log.info("healed in %.2fs: the round formed after %.2fs, the group and the DDP wrapper took %.2fs, the state "
                     "%.2fs", done - began, self.healing.formed_at - began, wrapped - self.healing.formed_at, done - wrapped)
            return True
        log.error("healing in process: %d rounds failed; the rank ends, and the job recovers by restarting", self.HEAL_ATTEMPTS)
        return False

    def _transfer(self, formed: Round) -> None:
        """Every member of a healing round: the donor's state into every rank (the engine's
        by its broadcast, the loop's as JSON), so that all go on from the same step."""
        donor = formed.donor
        engine = cast(Healable, self._engine())
        engine.broadcast_from(donor)
        mine = None
        if self.info.rank == donor:
            mine = {"step": formed.step, "position": self.position.to_wire(), "window": list(self.guard.window),
                    "lineage": self._lineage, "loss": self.last_loss}
        state = broadcast_json(mine, donor)
        self.step = int(state["step"])
        self.position = DataPosition.from_wire(state["position"])
        self.position.heals += 1  # this round, counted alike by every member from the donor's count
        self.guard.window.clear()
        self.guard.window.extend(float(x) for x in state["window"])
        self._lineage = [str(x) for x in state["lineage"]]
        self.last_loss = state["loss"]
        self._publish_position()
        self._boundary_updates = engine.updates()

    # ------------------------------------------------------------------ restore and roll back

    def _load(self, point: RestorePoint | None) -> None:
        """The agreed step into the engine and the RNG state, or a fresh start."""
        if self.cfg.init_from:
            check_deferred(point.choice.step if point is not None else None)  # fresh start: the weights must have loaded
        if point is not None:
            self.step = self.resume.load(self._engine(), point, self.watchdog.beat)
        else:
            rng.seed_all(self.cfg.seed + self.info.rank)
            self.step = 0

    def _publish_position(self) -> None:
        """Every later checkpoint records the data position (it is restored with it)."""
        self.ckpt.set_data_position(self.position.to_wire())
        self.metrics.data_position(self.position)

    def _roll_back(self, bad_step: int, why: str) -> None:
        """Bad numerics at ``bad_step`` (every rank judged the same global loss): back to
        the newest committed checkpoint, skipping the samples trained on since then.
        Rolling back repeatedly at the same place skips further each time."""
        limit = self.cfg.fault_tolerance.numerics.max_rollbacks
        if self.position.rollbacks >= limit:
            raise BadNumerics(f"bad numerics at step {bad_step}: {why}; {self.position.rollbacks} rollbacks already "
                              f"(maxRollbacks={limit})")
        self.ckpt.wait_free()  # a write in flight holds a good step: let it commit first
        self.rescuer.forget()  # the state is replaced below: nothing to rescue until it is
        # A group-wide agreement and load: a rank waiting here waits for its peers.
        with self.watchdog.section(State.COLLECTIVE):
            point = self.resume.agree()
            if point is None:
                self.engine = self.strategy.create(self.cfg, self.info, False)
                self.ckpt.bind(self.engine)
            self._load(point)
        self.last_loss = None  # the restored step's loss is not known here
        # The current position, not the checkpoint's: windows skipped since that
        # checkpoint stay skipped.
        skip = self.position.skip(self.step, bad_step, self.cfg.global_batch_size, why)
        self._publish_position()
        self.cadence.start(self.step)
        self.rescuer.arm(self._engine(), self.step)
        self.watchdog.beat()
        if self.info.rank == 0:
            log.warning("bad numerics at step %d: %s; rolled back to step %d and skipped samples %d..%d (the data of steps "
                        "%d..%d); rollback %d of at most %d", bad_step, why, self.step, skip.first_sample, skip.end_sample - 1,
                        skip.first_step, skip.last_step, self.position.rollbacks, limit)

    def _barrier(self) -> None:
        if self.info.world_size > 1:
            with self.watchdog.section(State.COLLECTIVE):
                torch.distributed.barrier()

    # ------------------------------------------------------------------ the end

    def _final_save(self) -> int:
        """The last checkpoint, synchronous, into every tier. Training is done; if no tier
        holds it afterwards (every rank's tier 1, or a job-wide tier that rank 0
        committed), the exit code says so. Retryable when a tier failed for a reason that
        may pass (a restart resumes from the newest committed checkpoint and saves again
        once a tier works); ``STORAGE_FULL``, permanent, when every failed tier is out of
        space: tier 1 already deleted every older step it could for room (``make_room``), a
        restart would redo the steps since the newest one and fail the same way, and that
        newest one is never deleted for room, since it is the job's only way back should
        the final write fail."""
        step = self.step
        try:
            self.ckpt.save(step, step * self.cfg.global_batch_size, rng.capture(), sync=True)
        except CheckpointError as err:
            log.error("final checkpoint of step %d: %s", step, err)
        local_ok, shared_ok = self.ckpt.durable(step)
        everywhere_local = agreement.all_true(self.info, local_ok)
        somewhere_shared = agreement.any_true(self.info, shared_ok)
        if everywhere_local or somewhere_shared:
            return ExitCode.SUCCESS
        degraded = self.ckpt.degraded()
        problems = "; ".join(f"{tier}: {d.message}" for tier, d in degraded.items()) or "no tier committed it"
        self.exit_message = f"training finished at step {step} but no tier holds the final checkpoint ({problems})"
        # Out of space everywhere it failed: every rank's failed tiers are all full (a rank
        # with none failed, a non-leader whose small part went in, agrees), and some failed.
        failed_somewhere = agreement.any_true(self.info, bool(degraded))
        only_full = agreement.all_true(self.info, all(d.reason == NO_SPACE for d in degraded.values()))
        if failed_somewhere and only_full:
            newest = self.ckpt.newest_local()
            self.exit_message += ("; every tier that failed is out of space: give it room, then run the job again"
                                  + (f" (it resumes from step {newest}, which is kept)" if newest is not None else ""))
            log.error("%s", self.exit_message)
            return ExitCode.STORAGE_FULL
        log.error("%s", self.exit_message)
        return ExitCode.TRANSIENT

    def _preempted(self) -> int:
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
        try:
            self.ckpt.save(self.step, self.step * self.cfg.global_batch_size, rng.capture(), sync=True)
        except CheckpointError as err:
            log.error("SIGTERM: the emergency checkpoint of step %d failed (%s); the newest committed one stays", self.step, err)
        if self.info.rank == 0:
            log.warning("SIGTERM: emergency checkpoint of step %d in %.2fs; exiting", self.step, time.perf_counter() - began)
        timer.cancel()
        return ExitCode.PREEMPTED

    # ------------------------------------------------------------------ signals and the watchdog

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the loop stops at the next step boundary that all ranks agree on.
        self._stop.set()

    def _on_hang(self, stale: float) -> None:
        timeout = self.cfg.fault_tolerance.hang_timeout_seconds
        state = self.watchdog.state  # where it hung, before a rescue marks it RESCUING
        if state in WAITING_STATES:
            self.rescuer.save(f"no step progress for {stale:.1f}s while waiting for a peer")
        if state in (State.COLLECTIVE, State.RESCUING):
            # Blocked in a collective: a peer stopped participating. That peer is the
            # cause (its own pod reports it); this rank is a victim, never charged.
            code = ExitCode.COLLECTIVE_TIMEOUT
            message = f"victim: blocked in a collective for {stale:.1f}s, waiting for a peer (hangTimeoutSeconds={timeout})"
        else:
            code = ExitCode.HANG
            message = f"no step progress for {stale:.1f}s (hangTimeoutSeconds={timeout})"
        dump_stacks_and_exit(
            code, stale,
            lambda: exitrecord.write(self.run_dir, self.info.restart_count, self.info.rank, self.info.local_rank, code, message, self.step),
        )

    def _on_rescue_request(self) -> None:
        """The supervisor judged this rank a victim and asked for a rescue checkpoint (it
        wrote the exit record): save it, then end as the supervisor would have."""
        self.rescuer.save("the supervisor judged this rank a victim of a peer that stopped")
        sys.stderr.flush()
        os._exit(ExitCode.COLLECTIVE_TIMEOUT)
