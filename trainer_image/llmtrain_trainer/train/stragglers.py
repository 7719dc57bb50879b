"""Stragglers: a rank whose own share of a step stays well above the others'.

In synchronous data parallelism every rank's *step* takes as long as the slowest one's,
so step times cannot tell who is slow. What differs is each rank's *local* time: from
the start of its step until it begins the last micro-batch's backward pass, where the
gradient all-reduce (the first wait for the peers) happens. A slow device, a throttled
CPU, a noisy neighbour or a slow data path shows up there, on that rank only.

Every rank learns every rank's local time from the per-step all-reduce and judges the
same numbers, so all ranks agree on who straggles without another collective. A rank is
a straggler once its local time has been above ``factor`` times the median of the other
ranks' (and at least ``minExcessSeconds`` above it) for ``steps`` consecutive steps; it
stops being one after as many steps within the bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llmtrain_contract.config import StragglerRuntime


@dataclass
class StragglerWatch:
    cfg: StragglerRuntime
    slow_run: dict[int, int] = field(default_factory=dict)
    fast_run: dict[int, int] = field(default_factory=dict)
    flagged: dict[int, float] = field(default_factory=dict)
    """rank -> its local time over the others' median, while it straggles."""

    def observe(self, local_seconds: list[float]) -> tuple[dict[int, float], set[int]]:
        """One step's local times (index = rank). Returns (ranks newly flagged with their
        ratio, ranks no longer flagged)."""
        if len(local_seconds) < 2 or self.cfg.steps <= 0:
            return {}, set()
        new: dict[int, float] = {}
        cleared: set[int] = set()
        for rank, (mine, others) in enumerate(zip(local_seconds, medians_of_others(local_seconds))):
            slow = mine > self.cfg.factor * others and mine - others >= self.cfg.min_excess_seconds
            self.slow_run[rank] = self.slow_run.get(rank, 0) + 1 if slow else 0
            self.fast_run[rank] = 0 if slow else self.fast_run.get(rank, 0) + 1
            ratio = mine / others if others > 0 else float("inf")
            if rank in self.flagged:
                if self.fast_run[rank] >= self.cfg.steps:
                    del self.flagged[rank]
                    cleared.add(rank)
                elif slow:
                    self.flagged[rank] = ratio
            elif self.slow_run[rank] >= self.cfg.steps:
                self.flagged[rank] = new[rank] = ratio
        return new, cleared

    def reset(self) -> None:
        """A new world (ranks renumbered): start over."""
        self.slow_run.clear()
        self.fast_run.clear()
        self.flagged.clear()


def medians_of_others(values: list[float]) -> list[float]:
    """For each index, the median of all the other values: one sort for the whole world
    (this runs every step, on every rank), not one per rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranked = [values[i] for i in order]
    position = {rank: p for p, rank in enumerate(order)}
    n = len(values) - 1  # values left once one is taken out

    def nth(k: int, gone: int) -> float:  # the k-th smallest of the others
        return ranked[k if k < gone else k + 1]

    out = []
    for rank in range(len(values)):
        gone = position[rank]
        mid = n // 2
        out.append(nth(mid, gone) if n % 2 else (nth(mid - 1, gone) + nth(mid, gone)) / 2)
    return out
