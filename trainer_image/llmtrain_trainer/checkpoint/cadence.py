"""When checkpoints fall due: a fixed interval (every multiple of ``intervalSteps``), or
the adaptive one (``intervalSteps: auto``, ``llmtrain_contract.cadence``).

The ranks must save the same steps. Rank 0 proposes the interval from its own
measurements and the job's failure history, and every rank learns it from the per-step
agreement (the trainer's one small all-reduce), so the decision is the same everywhere.
A checkpoint deferred because a rank was still writing the previous one is taken at the
first step where no rank is busy, but never later than the step the next one falls due:
there the trainer waits for the write (as a PyTorch DCP loop waits on the previous
``async_save``), so writes slower than the interval cost stalls, never checkpoints.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any

from llmtrain_contract.cadence import CADENCE_FILE, Interval, SaveCost, interval, mtbf_seconds
from llmtrain_contract.config import CheckpointRuntime

log = logging.getLogger("llmtrain.cadence")
EMA = 0.3
"""Weight of the newest checkpoint's stall and latency in their running estimates."""
BAND = 1.5
"""Between failures, a new optimum replaces the interval in force only when it is more
than this factor above or below it. Young/Daly's overhead ``C/T + T/(2 MTBF)`` is flat
near the optimum: an interval 1.5x off either way costs (1.5 + 1/1.5) / 2 = 1.083 times
the least overhead, 8 % of an overhead that is itself a few percent. The estimates swing
more than a narrower band absorbs: on a loaded machine the step time and the checkpoint
cost each moved +-20 % within minutes, and a 20 % band still changed the interval about
once a minute in the goodput benchmark (each change logged, exported and made an Event).
A new failure always chooses again."""
STEP_WINDOW = 25
"""Recent steps whose median is the step time: a median, because a step now and then
waits on the machine, and that is not what the next interval's steps take. The steps that
overlapped a background write are kept apart: what they take beyond the others is the
write's interference, part of the checkpoint's cost."""
EXCESS_WINDOW = 100
"""Recent steps that overlapped a write, each as its excess over the median step clear of
one at the time (a fraction, so a change of pace does not read as interference), whose
mean is the interference. A long window, and a mean of fractions rather than a
difference of medians: the excess (0.02 s on 0.14 s steps for the tiny model) is smaller
than the step time's jitter, and a 25-step difference of medians swung the cost 20-fold
and the interval between 11 and 50 steps within seconds."""


class History:
    """The job's failures and active time, from ``cadence.json`` beside the config
    (written by the operator into the job's ConfigMap, which the kubelet refreshes in the
    pod, or by ``llmtrain run``). Re-read when the file changes; the active time runs on
    from the moment the file was written."""

    def __init__(self, path: Path | None):
        self.path = path
        self._mtime: float | None = None
        self.failures = 0
        self._active = 0.0
        self._as_of: float | None = None

    def refresh(self) -> None:
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
                return
            doc = json.loads(self.path.read_text())
            self.failures = max(0, int(doc.get("failures", 0)))
            self._active = max(0.0, float(doc.get("activeSeconds", 0.0)))
            self._as_of = float(doc["time"]) if "time" in doc else None
            self._mtime = mtime
        except (OSError, ValueError, TypeError, KeyError):
            return  # absent or being replaced: keep what was read last

    def active_seconds(self, now: float) -> float:
        return self._active + (max(0.0, now - self._as_of) if self._as_of is not None else 0.0)


class Cadence:
    def __init__(self, runtime: CheckpointRuntime, config_dir: Path | None, metrics: Any):
        self.auto = runtime.auto
        self.interval = runtime.interval_steps if self.auto is None else self.auto.initial_steps
        self.metrics = metrics
        self.pending = False
        self._last_saved = 0
        self.history = History(config_dir / CADENCE_FILE if config_dir is not None else None)
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        """Recent steps clear of any background write."""
        self._overlapped: deque[float] = deque(maxlen=STEP_WINDOW)
        """Recent steps that overlapped one."""
        self._excess: deque[float] = deque(maxlen=EXCESS_WINDOW)
        self._overlapped_total = 0
        self._writing = False
        self._warming = True
        self._stall: float | None = None
        self._latency: float | None = None
        self._costs_seen = 0
        self.chosen: Interval | None = None
        """The interval proposed and the inputs it was chosen from."""
        self._chosen_at_failures = 0
        metrics.cadence(self.interval, None)

    def start(self, restored_step: int) -> None:
        self._last_saved = restored_step
        # The first step after a (re)start carries one-off work (the first collectives,
        # allocations, kernels): measured in, it made the interval after every failure
        # too short.
        self._warming = True

    # ------------------------------------------------------------------ rank 0's proposal

    def observe(self, step_seconds: float, costs: list[SaveCost], writing: bool) -> None:
        """Estimates from this rank's own measurements, after each step: the step time
        (the median of the recent steps clear of a background write, the first after a
        start left out), each new checkpoint's stall and latency (running averages), and
        whether a write is in flight now (after this step's save, if any), so that the
        next step is known to overlap it: writes start only at a step's end."""
        overlapped, self._writing = self._writing, writing
        if self._warming:
            self._warming = False
        elif overlapped:
            self._overlapped.append(step_seconds)
            self._overlapped_total += 1
            if self._steps:
                self._excess.append(step_seconds / statistics.median(self._steps) - 1.0)
        else:
            self._steps.append(step_seconds)
        for cost in costs[self._costs_seen:]:
            self._stall = cost.stall_seconds if self._stall is None else (1 - EMA) * self._stall + EMA * cost.stall_seconds
            self._latency = (cost.latency_seconds if self._latency is None
                             else (1 - EMA) * self._latency + EMA * cost.latency_seconds)
        self._costs_seen = len(costs)

    def step_seconds(self) -> float | None:
        """The median recent step clear of a write; while every step overlaps one (an
        interval shorter than the write), the median of those, so the interval can grow
        out of it."""
        window = self._steps or self._overlapped
        return statistics.median(window) if window else None

    def cost_seconds(self) -> float | None:
        """What a checkpoint costs the training: its stall, plus what the steps that
        overlapped its write took beyond the others (per checkpoint). Until steps clear of
        a write are seen, the whole latency, as if the write had stopped training."""
        if self._stall is None or self._latency is None:
            return None
        if not self._steps:
            return self._latency
        if not self._excess:
            return self._stall
        excess = max(0.0, statistics.fmean(self._excess)) * statistics.median(self._steps)
        return self._stall + excess * self._overlapped_total / max(1, self._costs_seen)

    def proposal(self, now: float | None = None) -> int:
        """The interval rank 0 proposes now (other ranks' proposals are not used)."""
        if self.auto is None:
            return self.interval
        cost, step = self.cost_seconds(), self.step_seconds()
        if cost is None or step is None:
            return self.interval
        self.history.refresh()
        now = time.time() if now is None else now
        mtbf = mtbf_seconds(self.history.failures, self.history.active_seconds(now), self.auto.mtbf_prior_seconds)
        optimum = interval(cost, mtbf, step, self.auto.min_steps, self.auto.max_steps, self._latency or 0.0)
        held = self.chosen
        if held is None or self.history.failures != self._chosen_at_failures or not held.steps / BAND <= optimum.steps <= held.steps * BAND:
            if held is None or optimum.steps != held.steps:
                log.warning("checkpoint interval: %s (%d failures so far)", optimum.explain(), self.history.failures)
            self.chosen, self._chosen_at_failures = optimum, self.history.failures
            held = optimum
        return held.steps

    # ------------------------------------------------------------------ every rank

    def agreed(self, interval_steps: int) -> None:
        """The interval all ranks agreed on at this step (rank 0's proposal)."""
        if interval_steps >= 1:
            self.interval = interval_steps
        self.metrics.cadence(self.interval, self.chosen)

    def due(self, step: int, max_steps: int) -> bool:
        if step >= max_steps:
            return False  # the final save follows
        if self.pending:
            return True
        if self.auto is None:
            return step % self.interval == 0
        return step >= self._last_saved + self.interval

    def saved(self, step: int) -> None:
        self.pending = False
        self._last_saved = step

    def deferred(self) -> None:
        self.pending = True

    def overdue(self, step: int) -> bool:
        """A deferred checkpoint has waited a whole interval: take it now, even if that
        means waiting for the previous write."""
        if not self.pending:
            return False
        if self.auto is None:
            return step % self.interval == 0
        return step >= self._last_saved + 2 * self.interval
