"""The trainer's Prometheus endpoint (one per rank, on ``port + local_rank``).

The operator scrapes local rank 0 of each pod for ``step`` and the last committed
checkpoint, so the trainer needs no Kubernetes credentials. When metrics are off, a
no-op twin with the same methods takes its place (checked once, not on every step).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from llmtrain_contract.names import Metric, MetricLabel
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import MetricsHandler
from llmtrain_trainer.pod import httpserve

log = logging.getLogger("llmtrain.metrics")

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
CKPT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)


class TrainerMetrics:
    def __init__(self, rank: int, strategy: str, config_hash: str, job: str):
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # this rank's CPU seconds, resident memory, open files
        labels = {"rank": str(rank)}
        self._step = Gauge(Metric.STEP, "Newest completed optimizer step", registry=r)
        self._samples = Gauge(Metric.SAMPLES, "Global samples consumed so far", registry=r)
        self._loss = Gauge(Metric.LOSS, "Training loss of the last step (mean over the global batch)", registry=r)
        self._mfu = Gauge(Metric.MFU, "Model FLOPs utilisation of the last step: the job's tokens/s times FLOPs per token "
                          "over its GPUs' dense bf16 peak", registry=r)
        self._tokens = Counter(Metric.TOKENS, "Tokens this node's ranks trained on (counted by its local rank 0 only)", registry=r)
        self._tokens_per_second = Gauge(Metric.TOKENS_PER_SECOND, "The job's tokens per second over the last step "
                                        "(the global batch's tokens over the step's wall time)", registry=r)
        self._step_seconds = Histogram(Metric.STEP_SECONDS, "Wall time of one optimizer step", buckets=STEP_BUCKETS, registry=r)
        self._world = Gauge(Metric.WORLD_SIZE, "Ranks in the current rendezvous round", registry=r)
        # Counters that outlive a process: each run adds what happened before it in this
        # pod (torchrun's restart count, the exit records of earlier attempts).
        self._restarts = Counter(Metric.WORKER_GROUP_RESTARTS, "Failure restarts torchrun made in this pod", registry=r)
        self._failed = Counter(Metric.FAILED_ATTEMPTS, "Failed attempts in this pod, by cause: a rank here crashed or "
                               "hung, or every rank was the victim of a peer that vanished elsewhere", ["cause"], registry=r)
        self._rollbacks = Gauge(Metric.NUMERICS_ROLLBACKS, "Rollbacks for bad numerics over the job (from the checkpoints)", registry=r)
        self._heal_rounds = Gauge(Metric.HEAL_ROUNDS, "In-process heals over the job (from the checkpoints and the heals)", registry=r)
        self._skipped = Gauge(Metric.SKIPPED_SAMPLES, "1 per window of samples skipped after bad numerics",
                              ["first_step", "last_step", "first_sample", "end_sample"], registry=r)
        self._straggler = Gauge(Metric.STRAGGLER, "Per straggling rank of this node: its local step time over the other "
                                "ranks' median", ["rank"], registry=r)
        self._last_step_ts = Gauge(Metric.LAST_STEP_TIMESTAMP, "Unix time of the newest step", registry=r)
        self._stall = Histogram(Metric.CHECKPOINT_STALL_SECONDS, "Seconds the training loop was blocked by one checkpoint",
                                buckets=CKPT_BUCKETS, registry=r)
        self._persist = Histogram(Metric.CHECKPOINT_PERSIST_SECONDS, "Seconds to persist and commit a checkpoint, per tier", ["tier"],
                                  buckets=CKPT_BUCKETS, registry=r)
        self._persisted = Counter(Metric.CHECKPOINT_PERSISTED_BYTES, "Bytes of checkpoints this rank persisted, per tier", ["tier"],
                                  registry=r)
        self._restore = Histogram(Metric.CHECKPOINT_RESTORE_SECONDS, "Seconds to restore, per tier", ["tier"], buckets=CKPT_BUCKETS,
                                  registry=r)
        self._restored = Counter(Metric.CHECKPOINT_RESTORED_BYTES, "Bytes this rank restored or pulled, per tier", ["tier"], registry=r)
        self._last_ckpt = Gauge(Metric.CHECKPOINT_LAST_STEP, "Newest committed checkpoint step, per tier", ["tier"], registry=r)
        self._last_ckpt_ts = Gauge(Metric.CHECKPOINT_LAST_TIMESTAMP, "Unix time of the newest commit, per tier", ["tier"], registry=r)
        self._ckpt_fail = Counter(Metric.CHECKPOINT_FAILURES, "Checkpoint writes that failed, per tier and reason", ["tier", "reason"],
                                  registry=r)
        self._healthy = Gauge(Metric.CHECKPOINT_TIER_HEALTHY, "1 while a tier works, 0 while it is degraded", ["tier"], registry=r)
        self._degraded = Gauge(Metric.CHECKPOINT_TIER_DEGRADED, "1 for the reason a tier is degraded now", ["tier", "reason"], registry=r)
        self._deferred = Counter(Metric.CHECKPOINT_DEFERRED, "Checkpoints deferred because the previous one was still being written",
                                 registry=r)
        self._interval = Gauge(Metric.CHECKPOINT_INTERVAL_STEPS, "The checkpoint interval in force, steps", registry=r)
        self._cost = Gauge(Metric.CHECKPOINT_COST_SECONDS,
                           "A checkpoint's cost to the training: stall plus write interference (adaptive cadence input)", registry=r)
        self._latency = Gauge(Metric.CHECKPOINT_LATENCY_SECONDS,
                              "A checkpoint's write latency, snapshot to tier-1 commit (adaptive cadence input)", registry=r)
        self._mtbf = Gauge(Metric.CHECKPOINT_MTBF_SECONDS, "The job's mean time between failures (adaptive cadence input)", registry=r)
        self._cadence_step = Gauge(Metric.CHECKPOINT_CADENCE_STEP_SECONDS,
                                   "The typical step time converting seconds into steps (adaptive cadence input)", registry=r)
        self._heals = Counter(Metric.HEALS, "In-process heals this process took part in, by role: survivor (a round formed "
                              "after a collective failed) or replacement (restarted in place, the state from a survivor)",
                              ["role"], registry=r)
        self._heal_seconds = Histogram(Metric.HEAL_SECONDS, "Seconds of one in-process heal, by role: a survivor's from the "
                                       "failed collective to the state in every rank, a replacement's from the loop's start to "
                                       "the state received", ["role"], buckets=CKPT_BUCKETS, registry=r)
        info = Gauge(Metric.INFO, "Static facts about this trainer", [MetricLabel.JOB, "strategy", "config_hash", "rank"], registry=r)
        info.labels(job, strategy, config_hash, labels["rank"]).set(1)

    def serve(self, host: str, port: int, run_dir: Path, local_rank: int) -> int:
        """Start the HTTP endpoint; returns the bound port (``port=0`` picks a free one)
        and records it in ``<run_dir>/metrics-local-rank-<r>.json`` for local tooling
        (the local runner finds each node's endpoint there)."""
        # Bounded (pod/httpserve.py): prometheus_client's own server starts a thread per
        # connection and waits forever on each.
        server = httpserve.serve(host, port, MetricsHandler.factory(self.registry), f"metrics-{local_rank}")
        bound = server.server_port
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / f"metrics-local-rank-{local_rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"host": host, "port": bound}))
        tmp.replace(path)
        return bound

    def started(self, world_size: int, restarts: int, failed_attempts: dict[str, int]) -> None:
        self._world.set(world_size)
        self._restarts.inc(restarts)
        for cause, count in failed_attempts.items():
            self._failed.labels(cause=cause).inc(count)

    def step(self, step: int, samples: int, loss: float, seconds: float, node_tokens: int) -> None:
        """``node_tokens``: what this node's ranks trained on in the step, passed by its
        local rank 0 (0 from the others)."""
        self._step.set(step)
        self._samples.set(samples)
        self._loss.set(loss)
        self._step_seconds.observe(seconds)
        self._tokens.inc(node_tokens)
        self._last_step_ts.set(time.time())

    def mfu(self, value: float) -> None:
        self._mfu.set(value)

    def throughput(self, tokens_per_second: float) -> None:
        self._tokens_per_second.set(tokens_per_second)

    def checkpoint_stall(self, seconds: float) -> None:
        self._stall.observe(seconds)

    def checkpoint_committed(self, tier: str, step: int, seconds: float, size: int) -> None:
        self._persist.labels(tier=tier).observe(seconds)
        self._persisted.labels(tier=tier).inc(size)
        self._last_ckpt.labels(tier=tier).set(step)
        self._last_ckpt_ts.labels(tier=tier).set(time.time())

    def checkpoint_failed(self, tier: str, reason: str) -> None:
        self._ckpt_fail.labels(tier=tier, reason=reason).inc()
        self.tier_health(tier, reason)

    def tier_health(self, tier: str, reason: str | None) -> None:
        """``reason`` None: healthy."""
        self._healthy.labels(tier=tier).set(0 if reason else 1)
        for labels in list(self._degraded._metrics):  # only the current reason stays at 1
            if labels[0] == tier:
                self._degraded.remove(*labels)
        if reason:
            self._degraded.labels(tier=tier, reason=reason).set(1)

    def checkpoint_deferred(self) -> None:
        self._deferred.inc()

    def cadence(self, interval_steps: int, chosen: Any) -> None:
        self._interval.set(interval_steps)
        if chosen is not None:
            self._cost.set(chosen.cost_seconds)
            self._latency.set(chosen.latency_seconds)
            self._mtbf.set(chosen.mtbf_seconds)
            self._cadence_step.set(chosen.step_seconds)

    def restored(self, tier: str, step: int, seconds: float) -> None:
        self._restore.labels(tier=tier).observe(seconds)
        self._last_ckpt.labels(tier=tier).set(step)

    def restored_bytes(self, tier: str, size: int, seconds: float) -> None:
        self._restored.labels(tier=tier).inc(size)

    def stragglers(self, flagged: dict[int, float], cleared: set[int]) -> None:
        for rank, ratio in flagged.items():
            self._straggler.labels(rank=str(rank)).set(round(ratio, 2))
        for rank in cleared:
            try:
                self._straggler.remove(str(rank))
            except KeyError:
                pass  # never exported here

    def healed(self, role: str, seconds: float) -> None:
        """One in-process heal done: ``role`` survivor or replacement (``Metric.HEALS``)."""
        self._heals.labels(role=role).inc()
        self._heal_seconds.labels(role=role).observe(seconds)

    def data_position(self, position: Any) -> None:
        """The job's rollbacks and skipped windows (a ``numerics.DataPosition``), as the
        checkpoints carry them: the same on every rank, whichever pod it runs in."""
        self._rollbacks.set(position.rollbacks)
        self._heal_rounds.set(position.heals)
        for skip in position.skips:
            self._skipped.labels(first_step=str(skip.first_step), last_step=str(skip.last_step),
                                 first_sample=str(skip.first_sample), end_sample=str(skip.end_sample)).set(1)


class NullMetrics:
    """Metrics off: same interface, no work."""

    def serve(self, host: str, port: int, run_dir: Path, local_rank: int) -> int:
        return 0

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None
