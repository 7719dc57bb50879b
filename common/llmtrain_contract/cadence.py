"""The adaptive checkpoint interval (``checkpoint.intervalSteps: auto``).

Young and Daly: with a checkpoint costing ``C`` seconds and failures arriving every
``MTBF`` seconds on average, the interval that loses the least time is about
``sqrt(2 * C * MTBF)``: shorter wastes time on checkpoints, longer on redone work.

``C`` is the training time a checkpoint costs: the stall of its snapshot plus the time the
background write takes away from the steps it overlaps (CheckFreq's "snapshot" and
"persist interference"). The write's own latency ``L`` is not in ``C``: with the write in
the background, a failure loses ``T/2 + L`` on average, and ``L`` does not depend on the
interval ``T``, so the overhead ``C/T + (T/2 + L)/MTBF`` is least at ``sqrt(2 C MTBF)``
whatever ``L`` is. The MTBF
is the job's own: its active seconds over its failures, with a prior worth one failure,
so that a young job with no failure yet does not conclude that failures never happen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CADENCE_FILE = "cadence.json"
"""Beside the trainer's config: the job's failure history, written by the operator
(through the ConfigMap, refreshed by the kubelet) or by ``llmtrain run``."""


def mtbf_seconds(failures: int, active_seconds: float, prior_seconds: float) -> float:
    """The job's mean time between failures, with the prior counted as one failure."""
    return (prior_seconds + max(0.0, active_seconds)) / (1 + max(0, failures))


def young_daly_seconds(cost_seconds: float, mtbf: float) -> float:
    return math.sqrt(2.0 * max(cost_seconds, 0.0) * max(mtbf, 0.0))


@dataclass(frozen=True)
class SaveCost:
    """One checkpoint as its writer measured it (a synchronous one, the final or the
    SIGTERM checkpoint, stalls for its whole latency)."""

    stall_seconds: float
    """The training loop blocked taking the snapshot."""
    latency_seconds: float
    """From the snapshot to the tier-1 commit (the stall included)."""


LATENCY_FLOOR = 2
"""The interval is at least this many times the write's latency: shorter, a checkpoint
would fall due while the previous one is still being written (it is then deferred), and
too few steps would run clear of a write to measure what a write costs them."""


@dataclass(frozen=True)
class Interval:
    steps: int
    cost_seconds: float
    mtbf_seconds: float
    step_seconds: float
    optimal_seconds: float
    latency_seconds: float = 0.0

    def explain(self) -> str:
        return (f"{self.steps} steps: sqrt(2 x cost {self.cost_seconds:.3g}s x MTBF {self.mtbf_seconds:.0f}s) = "
                f"{self.optimal_seconds:.1f}s at {self.step_seconds:.2f}s a step, a write taking {self.latency_seconds:.2f}s")


def interval(cost_seconds: float, mtbf: float, step_seconds: float, min_steps: int, max_steps: int,
             latency_seconds: float = 0.0) -> Interval:
    """The interval in steps, at least ``LATENCY_FLOOR`` write latencies, clamped to
    [min_steps, max_steps]."""
    optimal = young_daly_seconds(cost_seconds, mtbf)
    if step_seconds > 0:
        steps = max(round(optimal / step_seconds), math.ceil(LATENCY_FLOOR * max(latency_seconds, 0.0) / step_seconds))
    else:
        steps = max_steps
    return Interval(max(min_steps, min(max_steps, steps)), cost_seconds, mtbf, step_seconds, optimal, latency_seconds)
