"""The adaptive checkpoint interval (``checkpoint.intervalSteps: auto``).

Young and Daly: with a checkpoint costing ``C`` seconds and failures arriving every
``MTBF`` seconds on average, the interval that loses the least time is about
``sqrt(2 * C * MTBF)``: shorter wastes time on checkpoints, longer on redone work.

``C`` is what a checkpoint costs the job: the training time it stalls plus the time
until it is persisted (a failure in between loses back to the previous one). The MTBF
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
class Interval:
    steps: int
    cost_seconds: float
    mtbf_seconds: float
    step_seconds: float
    optimal_seconds: float

    def explain(self) -> str:
        return (f"{self.steps} steps: sqrt(2 x cost {self.cost_seconds:.2f}s x MTBF {self.mtbf_seconds:.0f}s) = "
                f"{self.optimal_seconds:.1f}s at {self.step_seconds:.2f}s a step")


def interval(cost_seconds: float, mtbf: float, step_seconds: float, min_steps: int, max_steps: int) -> Interval:
    """The interval in steps, clamped to [min_steps, max_steps]."""
    optimal = young_daly_seconds(cost_seconds, mtbf)
    steps = round(optimal / step_seconds) if step_seconds > 0 else max_steps
    return Interval(max(min_steps, min(max_steps, steps)), cost_seconds, mtbf, step_seconds, optimal)
