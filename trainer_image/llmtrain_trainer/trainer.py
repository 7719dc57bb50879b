"""The training loop, top to bottom.

init -> restore (agreed across ranks) -> loop { fault hook, micro-batches, optimizer
step, agree on loss and stop, beat the watchdog, metrics, checkpoint } -> final save.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from llmtrain_contract.config import TrainerConfig
from llmtrain_contract.exitcodes import ExitCode
from llmtrain_contract.names import Env
from llmtrain_store import manifest as mf
from llmtrain_store.s3 import S3Tier
from llmtrain_store.tiers import CheckpointError, DirTier

from . import exitrecord, rng
from .checkpoint.cadence import Cadence
from .checkpoint.manager import CheckpointManager, NoCheckpoints, rng_file
from .checkpoint.restore import Choice, NoLoadableCheckpoint
from .data import build_source, micro_batch_indices
from .dist import DistInfo
from .engine import engine_class
from .engine_deepspeed import convert_to_universal, wait_for_universal
from .faults import FaultInjector
from .heartbeat import WAITING_STATES, Heartbeat, State
from .numerics import DataPosition, LossGuard
from .peers import is_collective_failure
from .schedule import lr_at
from .stragglers import StragglerWatch
from .watchdog import Watchdog, dump_stacks_and_exit, first_step_limit

log = logging.getLogger("llmtrain.trainer")
RESTORE_ROUNDS = 5
"""Agreements tried when pulls of the chosen copy keep failing, before giving up."""


def _gather(obj: Any, world: int) -> list[Any]:
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def build_tiers(cfg: TrainerConfig) -> list[Any]:
    """The configured tiers, fastest first: directories (node-local, shared) and S3."""
    tiers: list[Any] = []
    for tier in cfg.checkpoint.tiers:
        if tier.uri.startswith("s3://"):
            tiers.append(S3Tier(tier.name, tier.uri, keep=tier.keep, interval_steps=tier.interval_steps, endpoint=tier.endpoint,
                                region=tier.region, path_style=tier.path_style))
        else:
            tiers.append(DirTier(tier.name, Path(tier.uri), keep=tier.keep, interval_steps=tier.interval_steps))
    return tiers


class BadNumerics(RuntimeError):
    """Bad numerics once more after ``maxRollbacks`` rollbacks."""


class Trainer:
    def __init__(self, cfg: TrainerConfig, info: DistInfo, metrics: Any, run_dir: Path, config_dir: Path | None = None):
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
        self.position = DataPosition()
        """Where the data stream is: skipped windows of samples, rollbacks."""
        self.guard = LossGuard(cfg.fault_tolerance.numerics)
        self.stragglers = StragglerWatch(cfg.fault_tolerance.stragglers)
        self._stop = threading.Event()
        hang_timeout = cfg.fault_tolerance.hang_timeout_seconds
        self.watchdog = Watchdog(
            hang_timeout, self._on_hang,
            heartbeat=Heartbeat(run_dir, info.rank, info.local_rank, info.restart_count, first_step_limit(hang_timeout)),
            supervised=os.environ.get(Env.SUPERVISED) == "1", on_rescue=self._on_rescue_request,
        )
        self._boundary: tuple[int, int, rng.Raw] | None = None
        """(step, the engine's optimizer steps, the RNG state) at the last step boundary: what
        a rescue checkpoint saves. None while the state is being replaced (a restore)."""
        self._advanced: tuple[int, int, float] | None = None
        """(step, the engine's optimizer steps, this rank's loss) once a step's optimizer
        update ran but before the ranks agreed on its loss."""
        self._restored_step = 0
        self._rescuable = False
        self._rescue_guard = threading.Lock()
        self._rescue_started = False
        self._rescue_done = threading.Event()
        self.engine: Any = None
        tiers = build_tiers(cfg)
        meta = {"config_hash": cfg.config_hash(), "strategy": self.strategy, "job": cfg.job_name, "max_steps": cfg.max_steps}
        self.ckpt: CheckpointManager | NoCheckpoints = CheckpointManager(
            tiers, info, meta, commit_timeout=max(60.0, cfg.fault_tolerance.collective_timeout_seconds),
            metrics=metrics, heartbeat=self.watchdog.beat,
        ) if tiers else NoCheckpoints()
        self.cadence = Cadence(cfg.checkpoint, config_dir, metrics)
        self.startup: dict[str, float] = {}
        self.exit_message: str | None = None
        """Why the run ends with its exit code, when there is more to say than its name."""
        self._first_step = True
        self._log_file: Any = None

    # ------------------------------------------------------------------ hooks

    def _on_hang(self, stale: float) -> None:
        timeout = self.cfg.fault_tolerance.hang_timeout_seconds
        state = self.watchdog.state  # where it hung, before a rescue marks it RESCUING
        if state in WAITING_STATES:
            self.rescue(f"no step progress for {stale:.1f}s while waiting for a peer")
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
        self.rescue("the supervisor judged this rank a victim of a peer that stopped")
        sys.stderr.flush()
        os._exit(ExitCode.COLLECTIVE_TIMEOUT)

    def rescue(self, why: str) -> None:
        """A peer failed (``why``): save the last step into tier 1 if this rank's state
        still is that step's (a replicated state, the optimizer not yet past it; the
        engine checks) and no checkpoint of it exists yet. Called once, by the training
        thread after a collective raised or by the watchdog thread while the training
        thread is blocked in one; a second caller waits for the first to finish, so that
        the process does not end in the middle of the write. Bounded by
        ``checkpoint.sigtermBudgetSeconds``; never raises."""
        budget = self.cfg.checkpoint.sigterm_budget_seconds
        with self._rescue_guard:
            first, self._rescue_started = not self._rescue_started, True
        if not first:
            self._rescue_done.wait(budget)
            return
        # A victim from now on, to the supervisor and this watchdog, however long the save
        # takes or whatever CPU it burns: left in the state the failed section restored, a
        # rank saving after its collective raised was judged stuck and charged a hang.
        self.watchdog.enter(State.RESCUING)
        self.watchdog.beat()
        try:
            boundary = self._boundary
            if boundary is None or self.engine is None:
                return
            step, updates, state = boundary
            advanced = self._advanced
            if self.engine.updates() != updates and advanced is not None and advanced[1] == self.engine.updates():
                # The optimizer already applied the next step (the peer failed in the
                # agreement): that step's state, if this rank's view of it is sound.
                doubt = self._doubt(advanced[2])
                if doubt is not None:
                    log.warning("%s; no rescue checkpoint of step %d: %s", why, advanced[0], doubt)
                    return
                step, updates, state = advanced[0], advanced[1], rng.raw()
            newest = max(self.ckpt.newest_saved() or 0, self._restored_step)
            if step <= newest:
                log.warning("%s; step %d is the newest checkpoint already, no rescue checkpoint needed", why, step)
                return
            began = time.monotonic()
            why_not = self.ckpt.rescue(step, step * self.cfg.global_batch_size, updates, rng.encode(state), began + budget)
            if why_not is None:
                log.warning("%s; rescue checkpoint of step %d saved into tier 1 in %.2fs (the newest checkpoint before it: step %d)",
                            why, step, time.monotonic() - began, newest)
            else:
                log.warning("%s; no rescue checkpoint of step %d: %s", why, step, why_not)
        except Exception as err:  # noqa: BLE001 - the rank is failing already; the rescue only adds
            log.error("%s; the rescue checkpoint failed: %s", why, err)
        finally:
            self._rescue_done.set()

    def _doubt(self, local_loss: float) -> str | None:
        """Why a step whose loss the ranks never agreed on must not be saved: this rank's
        own loss fails the loss guard (noisier than the global one, so the test is, if
        anything, too strict), or a parameter is not finite (another rank's bad gradient
        reached every replica through the all-reduce)."""
        why = self.guard.verdict(local_loss)
        if why is not None:
            return f"its loss was never agreed, and this rank's {why.removeprefix('the ')}"
        with torch.no_grad():
            if not all(bool(torch.isfinite(p).all()) for p in self.engine.parameters()):
                return "its loss was never agreed, and a parameter is not finite"
        return None

    def _mark_boundary(self) -> None:
        """The state is exactly ``self.step``'s now (after a step, a restore)."""
        self._boundary = (self.step, self.engine.updates(), rng.raw()) if self._rescuable else None

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Only set a flag: the loop stops at the next step boundary that all ranks agree on.
        self._stop.set()

    # ------------------------------------------------------------------ setup

    def setup(self) -> None:
        choice, path = self._agree_on_restore()
        self.engine = engine_class(self.strategy).create(self.cfg, self.info, choice is not None and choice.mode == "universal")
        self.ckpt.bind(self.engine)
        if choice is not None:
            self._load(choice, path)
            self.position = DataPosition.from_wire(choice.data)
        else:
            rng.seed_all(self.cfg.seed + self.info.rank)
        self._publish_position()
        self.cadence.start(self.step)
        self.ckpt.prepare(self._barrier, self.step)

    def _publish_position(self) -> None:
        """Every later checkpoint records the data position (it is restored with it)."""
        if isinstance(self.ckpt, CheckpointManager):
            self.ckpt.meta["data"] = self.position.to_wire()
        self.metrics.data_position(self.position)

    def _agree_on_restore(self) -> tuple[Choice | None, Path | None]:
        """The restore point every rank agrees on, with its files where this rank reads
        them (pulled into tier 1 first when they are elsewhere). A pull that fails on any
        rank (a remote copy whose bytes do not match, a tier that went away) excludes that
        copy and the ranks agree again."""
        gather = lambda o: _gather(o, self.info.world_size)  # noqa: E731
        pull_timeout = max(600.0, self.cfg.fault_tolerance.collective_timeout_seconds)
        excluded: frozenset[tuple[str, int]] = frozenset()
        self.ckpt.forget_failed_pulls()
        failures: list[tuple[str, int, str]] = []
        for _ in range(RESTORE_ROUNDS):
            try:
                choice = self.ckpt.restore_point(self.strategy, self.strategy == "deepspeed", gather, excluded)
            except NoLoadableCheckpoint as err:
                if not self.cfg.checkpoint.allow_fresh_start:
                    raise
                log.error("%s; starting from step 0 because checkpoint.allowFreshStart is set", err)
                return None, None
            if choice is None:
                return None, None
            path, failure = None, None
            if not (choice.mode == "broadcast" and self.info.rank != choice.source_rank):
                try:
                    path = self.ckpt.localize(choice, pull_timeout)
                except CheckpointError as err:
                    failure = (choice.tier or "", choice.step, str(err))
            failures = [f for f in gather(failure) if f]
            if not failures:
                return choice, path
            if self.info.rank == 0:
                for _tier, step, why in failures:
                    log.warning("step %d: %s; agreeing on another copy", step, why)
            excluded = excluded | {(t, s) for t, s, _ in failures}
        raise NoLoadableCheckpoint([why for _, _, why in failures])

    def _barrier(self) -> None:
        if self.info.world_size > 1:
            with self.watchdog.section(State.COLLECTIVE):
                dist.barrier()

    def _files(self, folder: Path) -> dict[str, mf.FileEntry]:
        return mf.entries(json.loads((folder / mf.MANIFEST).read_text()), self.engine.allowed_names())

    def _restore_rng(self, choice: Choice, path: Path | None) -> bool:
        """This rank's saved RNG state, verified against its manifest first: from the
        copy it loaded, else from any tier holding it (a rank that received the state by
        broadcast). False when none verifies (each refusal is logged)."""
        found = self.ckpt.read_rng(choice.step, rng_file(self.info.rank), path)
        if found is None:
            log.warning("rank %d: no usable saved RNG state of step %d; deriving one", self.info.rank, choice.step)
            return False
        rng.restore(*found)
        return True

    def _load(self, choice: Choice, path: Path | None) -> None:
        """Load the agreed step from where ``_agree_on_restore`` put it, verifying every
        byte as it is read, then the RNG state when the world size is the same."""
        began = time.perf_counter()
        same_world = choice.saved_world == self.info.world_size
        if choice.mode == "broadcast":
            if path is not None:
                self.engine.load(path, self._files(path), same_world=True)
            self.engine.broadcast_from(choice.source_rank)
        elif choice.mode == "universal":
            assert path is not None
            if self.info.is_node_leader:
                convert_to_universal(path, heartbeat=self.watchdog.beat)
            wait_for_universal(path, timeout=3600, heartbeat=self.watchdog.beat)
            self.engine.load(path, self._files(path), same_world=False)
        else:
            assert path is not None
            self.engine.load(path, self._files(path), same_world=same_world)
        if same_world and not self._restore_rng(choice, path):
            rng.seed_all(self.cfg.seed + 1_000_003 * choice.step + self.info.rank)
        if not same_world:
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
            return self._final_save()
        except BadNumerics as err:
            self.exit_message = str(err)
            log.error("%s", err)
            return ExitCode.BAD_NUMERICS
        except Exception as err:
            if is_collective_failure(err):
                first_line = (str(err).splitlines() or [""])[0][:200]
                self.rescue(f"a collective failed ({type(err).__name__}: {first_line})")
                if self.watchdog.rescue_requested():
                    # The supervisor judged this rank a victim and wrote its exit record
                    # before it asked: end as the request does, leaving that record.
                    sys.stderr.flush()
                    os._exit(ExitCode.COLLECTIVE_TIMEOUT)
            raise
        finally:
            self.close()

    def start(self) -> None:
        """Restore (or start fresh), then arm the watchdog and open the step log."""
        began = time.perf_counter()
        self.setup()
        self.startup["setup"] = time.perf_counter() - began
        self._first_step = True
        # A rescue checkpoint needs the whole state in this process's memory (a replicated
        # engine on the host) and a tier to save it in.
        self._rescuable = isinstance(self.ckpt, CheckpointManager) and self.engine.can_rescue()
        self._restored_step = self.step
        self._mark_boundary()
        if self._rescuable:
            self.watchdog.offer_rescue(self.cfg.checkpoint.sigterm_budget_seconds)
        self.watchdog.start()
        self._log_file = (self.run_dir / "steps.jsonl").open("a") if self.info.rank == 0 else None

    def step_once(self) -> bool:
        """One optimizer step with everything around it. Returns True when the ranks
        agreed to stop (SIGTERM)."""
        cfg, info = self.cfg, self.info
        step = self.step
        began = time.perf_counter()
        self.faults.at_step(step + 1)
        if self.faults.poison:
            self.faults.poison = False
            with torch.no_grad():
                next(iter(self.engine.parameters())).view(-1)[0] = float("nan")
        data_step = self.position.data_step(step)
        batches = [
            self.source.batch(micro_batch_indices(data_step, a, info.rank, info.world_size, cfg.global_batch_size, cfg.micro_batch_size))
            for a in range(self.accum)
        ]
        with self.watchdog.section(State.TRAIN_STEP):
            local_loss = self.engine.train_step(step, batches)
        if self._rescuable:
            self._advanced = (step + 1, self.engine.updates(), float(local_loss))
        self.faults.before_agree(step + 1)
        local_seconds = self.engine.sync_started - began
        with self.watchdog.section(State.COLLECTIVE):
            loss, stop, busy, interval, tiers_busy, locals_ = self._agree(local_loss, local_seconds)
        self.cadence.agreed(interval)
        self._watch_stragglers(locals_)
        bad = self.guard.judge(loss)
        if bad is not None:
            self._advanced = None  # judged bad: a rescue never saves it
            self._roll_back(step + 1, bad)
            return False
        self.step = step + 1
        self._mark_boundary()
        seconds = time.perf_counter() - began
        self.watchdog.beat(self.step)
        samples = self.step * cfg.global_batch_size
        tokens = cfg.global_batch_size * cfg.data.seq_len
        # The global batch splits evenly over the ranks (the world size divides it).
        node_tokens = tokens * info.local_world_size // info.world_size if info.is_node_leader else 0
        self.metrics.step(self.step, samples, loss, seconds, node_tokens)
        if self._log_file is not None:
            self._log_step(self._log_file, loss, samples, seconds, tokens, step)
        if self._first_step and info.rank == 0:
            self._first_step = False
            self.startup["first_step"] = seconds
            log.warning("first step done; start-up phases: %s", ", ".join(f"{k} {v:.2f}s" for k, v in self.startup.items()))
        if stop:
            return True
        if self.cadence.due(self.step, cfg.max_steps):
            if busy and self.cadence.overdue(self.step):
                busy = not self._wait_for_previous_checkpoint()
            if busy:
                # A rank is still writing the previous checkpoint: every rank defers to the
                # first step where none is (they all see the same agreed flag).
                self.cadence.deferred()
                self.ckpt.defer()
            else:
                self.ckpt.save(self.step, samples, tiers_busy)
                self.cadence.saved(self.step)
        self.cadence.observe(seconds, self.ckpt.costs, self.ckpt.writing())
        return False

    def _roll_back(self, bad_step: int, why: str) -> None:
        """Bad numerics at ``bad_step`` (every rank judged the same global loss): back to
        the newest committed checkpoint, skipping the samples trained on since then.
        Rolling back repeatedly at the same place skips further each time."""
        limit = self.cfg.fault_tolerance.numerics.max_rollbacks
        if self.position.rollbacks >= limit:
            raise BadNumerics(f"bad numerics at step {bad_step}: {why}; {self.position.rollbacks} rollbacks already "
                              f"(maxRollbacks={limit})")
        self.ckpt.wait_free()  # a write in flight holds a good step: let it commit first
        self._boundary = None  # the state is replaced below: nothing to rescue until it is
        # A group-wide agreement and load: a rank waiting here waits for its peers.
        with self.watchdog.section(State.COLLECTIVE):
            choice, path = self._agree_on_restore()
            if choice is not None:
                self._load(choice, path)  # sets self.step and the RNG state
            else:
                self.engine = engine_class(self.strategy).create(self.cfg, self.info, False)
                self.ckpt.bind(self.engine)
                rng.seed_all(self.cfg.seed + self.info.rank)
                self.step = 0
        # The current position, not the checkpoint's: windows skipped since that
        # checkpoint stay skipped.
        skip = self.position.skip(self.step, bad_step, self.cfg.global_batch_size, why)
        self._publish_position()
        self._restored_step = self.step
        self._mark_boundary()
        self.cadence.start(self.step)
        self.watchdog.beat()
        if self.info.rank == 0:
            log.warning("bad numerics at step %d: %s; rolled back to step %d and skipped samples %d..%d (the data of steps "
                        "%d..%d); rollback %d of at most %d", bad_step, why, self.step, skip.first_sample, skip.end_sample - 1,
                        skip.first_step, skip.last_step, self.position.rollbacks, limit)

    def close(self) -> None:
        self.watchdog.stop()
        self.ckpt.close()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _agree(self, local_loss: torch.Tensor, local_seconds: float) -> tuple[float, bool, bool, int, list[bool], list[float]]:
        """One small all-reduce per step: the global mean loss; whether any rank got
        SIGTERM (so that every rank stops at the same step); whether any rank is still
        writing a checkpoint (so that every rank defers the next one alike); rank 0's
        checkpoint interval (so that every rank saves the same steps); per slower tier,
        whether any rank is still storing into it (so that all offer it the same steps);
        and every rank's local share of the step (each fills its own slot), for the
        straggler watch."""
        proposal = float(self.cadence.proposal()) if self.info.rank == 0 else 0.0
        tiers = [1.0 if b else 0.0 for b in self.ckpt.tiers_busy()]
        world = self.info.world_size
        slots = [0.0] * world
        slots[self.info.rank] = local_seconds
        packed = torch.tensor([float(local_loss), 1.0 if self._stop.is_set() else 0.0,
                               1.0 if self.ckpt.busy() else 0.0, proposal, *tiers, *slots], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(packed)
        values = packed.tolist()
        n = 4 + len(tiers)
        return (values[0] / world, values[1] > 0, values[2] > 0, int(values[3]), [x > 0 for x in values[4:n]], values[n:])

    def _watch_stragglers(self, local_seconds: list[float]) -> None:
        new, cleared = self.stragglers.observe(local_seconds)
        node = set(self.info.ranks_on_node())
        for rank, ratio in new.items():
            if self.info.rank == 0:
                log.warning("straggler: rank %d's local step time has been %.1fx the other ranks' median for %d steps "
                            "(stragglers.factor=%g)", rank, ratio, self.cfg.fault_tolerance.stragglers.steps,
                            self.cfg.fault_tolerance.stragglers.factor)
        for rank in cleared:
            if self.info.rank == 0:
                log.warning("straggler: rank %d keeps pace again", rank)
        if self.info.local_rank == 0 and (new or cleared or self.stragglers.flagged):
            self.metrics.stragglers({r: v for r, v in self.stragglers.flagged.items() if r in node}, cleared & node)

    def _log_step(self, fh: Any, loss: float, samples: int, seconds: float, tokens: int, step0: int) -> None:
        cfg = self.cfg
        record = {
            "step": self.step, "loss": loss, "samples": samples, "world": self.info.world_size,
            "accum": self.accum, "lr": lr_at(step0, cfg.optimizer, cfg.max_steps),
            "attempt": self.info.restart_count, "seconds": seconds, "time": time.time(),
            "data_samples": [self.position.data_step(step0) * cfg.global_batch_size,
                             (self.position.data_step(step0) + 1) * cfg.global_batch_size],
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

    def _wait_for_previous_checkpoint(self) -> bool:
        """Every rank waits until its previous checkpoint is written; True when all are
        (they agree, so that all save the same step or all defer again)."""
        began = time.perf_counter()
        free = self.ckpt.wait_free()
        flags = torch.tensor([0.0 if free else 1.0], dtype=torch.float64)
        if self.info.world_size > 1:
            dist.all_reduce(flags)
        waited = time.perf_counter() - began
        self.metrics.checkpoint_stall(waited)
        if self.info.rank == 0:
            log.warning("step %d: waited %.1fs for the previous checkpoint's write, which took longer than an interval "
                        "(a shorter interval than the tiers can write only adds stalls)", self.step, waited)
        return flags[0] == 0

    def _final_save(self) -> int:
        """The last checkpoint, synchronous, into every tier. Training is done; if no tier
        holds it afterwards (every rank's tier 1, or a job-wide tier that rank 0
        committed), the exit code says so: retryable, since a restart resumes from the
        newest committed checkpoint and saves again once a tier works."""
        step = self.step
        try:
            self.ckpt.save(step, step * self.cfg.global_batch_size, sync=True)
        except CheckpointError as err:
            log.error("final checkpoint of step %d: %s", step, err)
        local_ok, shared_ok = self.ckpt.durable(step)
        flags = torch.tensor([0.0 if local_ok else 1.0, 1.0 if shared_ok else 0.0], dtype=torch.float64)
        if self.info.world_size > 1:
            dist.all_reduce(flags)
        if flags[0] == 0 or flags[1] > 0:
            return ExitCode.SUCCESS
        problems = "; ".join(f"{tier}: {d.message}" for tier, d in self.ckpt.degraded().items()) or "no tier committed it"
        self.exit_message = f"training finished at step {step} but no tier holds the final checkpoint ({problems})"
        log.error("%s", self.exit_message)
        return ExitCode.TRANSIENT

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
        try:
            self.ckpt.save(self.step, samples, sync=True)
        except CheckpointError as err:
            log.error("SIGTERM: the emergency checkpoint of step %d failed (%s); the newest committed one stays", self.step, err)
        if self.info.rank == 0:
            log.warning("SIGTERM: emergency checkpoint of step %d in %.2fs; exiting", self.step, time.perf_counter() - began)
        timer.cancel()
        return ExitCode.PREEMPTED
