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

from llmtrain_contract.cadence import CADENCE_FILE, Interval, interval, mtbf_seconds
from llmtrain_contract.config import CheckpointRuntime

log = logging.getLogger("llmtrain.cadence")
EMA = 0.3
"""Weight of the newest checkpoint cost in its running estimate."""
BAND = 0.2
"""Between failures, a new optimum replaces the interval in force only when it differs
by more than this fraction. Young/Daly's overhead is flat near the optimum (an interval
20 % off costs under 2 % more: (1.2 + 1/1.2) / 2 = 1.017), while the step time's jitter
moved the optimum by a step or two at almost every step: each move was logged, exported,
and turned into an Event by the operator (every 5 s for an hour in the goodput
benchmark). A new failure always chooses again."""
STEP_WINDOW = 25
"""Recent steps whose median is the step time: a median, because the step that takes a
checkpoint carries its stall (already in the cost) and a step now and then waits on the
machine, and neither is what the next interval's steps take."""


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
        self._warming = True
        self._cost: float | None = None
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

    def observe(self, step_seconds: float, costs: list[float]) -> None:
        """Estimates from this rank's own measurements: the step time (the median of the
        recent steps, the first after a start left out), and each new checkpoint's cost
        (stall plus tier-1 persist, a running average)."""
        if self._warming:
            self._warming = False
        else:
            self._steps.append(step_seconds)
        for cost in costs[self._costs_seen:]:
            self._cost = cost if self._cost is None else (1 - EMA) * self._cost + EMA * cost
        self._costs_seen = len(costs)

    def proposal(self, now: float | None = None) -> int:
        """The interval rank 0 proposes now (other ranks' proposals are not used)."""
        if self.auto is None:
            return self.interval
        if self._cost is None or not self._steps:
            return self.interval
        self.history.refresh()
        now = time.time() if now is None else now
        mtbf = mtbf_seconds(self.history.failures, self.history.active_seconds(now), self.auto.mtbf_prior_seconds)
        optimum = interval(self._cost, mtbf, statistics.median(self._steps), self.auto.min_steps, self.auto.max_steps)
        held = self.chosen
        if held is None or self.history.failures != self._chosen_at_failures or abs(optimum.steps - held.steps) > BAND * held.steps:
            if held is None or optimum.steps != held.steps:
                log.warning("checkpoint interval: %s (%d failures so far)", optimum.explain(), self.history.failures)
            self.chosen, self._chosen_at_failures = optimum, self.history.failures
        return self.chosen.steps

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
