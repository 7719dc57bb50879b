"""The goodput benchmark's schedule and accounting, pure (no I/O): bench/goodput.py
feeds it what it saw, each observation stamped by the benchmark's own clock.

Accounting (docs/benchmarks.md, "Goodput"): the job's step log is followed from outside;
each line is stamped when the benchmark first sees it. An *interruption* is a new worker
group (a pod or a torchrun attempt not seen before) taking over the step log. It starts
at the injection of the fault that caused it, or, when nothing was injected (a node that
came back and the job growing again), at the last step the old group logged. It lasts
until the log shows a step past the high-water mark it had before the interruption
began: detection, recovery (every wait: scheduling, rendezvous, restore) and the redone
steps are all inside. The same group going back (a rollback for bad numerics) is an
interruption from its last step before. Lost time is the union of those spans, the
start-up (job created to its first step) and every stall (``STALL_SECONDS`` or more with
no step seen, the end of the run included: a failed job trains no more); ETTR = 1 -
lost / wall.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

KINDS = ("crash", "node", "frozen", "hang", "partition", "eviction")
"""The failure kinds, in the order the schedule cycles through them."""


@dataclass(frozen=True)
class Planned:
    kind: str
    at: float
    """Seconds after the job was created."""
    pick: float
    """A seeded number in [0, 1) that chooses the target (rank, node)."""


def schedule(seed: int, kinds: tuple[str, ...], mean_gap: float, count: int) -> list[Planned]:
    """``count`` failures cycling through ``kinds``, one in each window of ``mean_gap``
    seconds at a seeded moment of its middle half: on average one per ``mean_gap``,
    never two at once, and the run (``count * mean_gap``) holds every kind."""
    rng = random.Random(seed)
    return [Planned(kinds[i % len(kinds)], mean_gap * (i + rng.uniform(0.25, 0.75)), rng.random()) for i in range(count)]


@dataclass(frozen=True)
class StepSeen:
    at: float
    step: int
    group: tuple[str, int]
    """(the pod's uid, torchrun's attempt): which worker group logged it."""
    world: int


@dataclass(frozen=True)
class Injected:
    kind: str
    at: float
    target: str


@dataclass
class Interruption:
    start: float
    cause: str
    """The kind of the injected fault, ``rejoin`` (nothing injected: the job grew back, a
    node returned) or ``rollback`` (the same group went back to a checkpoint)."""
    high_water: int
    resumed_at: float | None = None
    """The first step of the new group."""
    resumed_step: int | None = None
    caught_up: float | None = None
    """The first step past ``high_water``."""
    detected: float | None = None
    """The fault in the job's status (faults only)."""
    fault: Injected | None = None
    rejoins: list[Interruption] = field(default_factory=list)

    @property
    def lost_steps(self) -> int | None:
        return None if self.resumed_step is None else max(0, self.high_water - (self.resumed_step - 1))


def interruptions(steps: list[StepSeen], faults: list[Injected], changes: list[float]) -> list[Interruption]:
    """Every interruption in ``steps`` (sorted by time), each fault's the first after its
    injection; ``changes`` are the moments the job's failure record changed in its
    status (detection). A fault after which no new group ever logged keeps
    ``resumed_at`` None (never recovered)."""
    pending = sorted(faults, key=lambda f: f.at)
    out: list[Interruption] = []
    seen: set[tuple[str, int]] = set()
    previous: dict[tuple[str, int], int] = {}
    high_water, last_at = 0, None
    for s in steps:
        while pending and pending[0].at <= s.at:
            fault = pending.pop(0)
            out.append(Interruption(fault.at, fault.kind, _high_water(steps, fault.at), fault=fault,
                                    detected=next((c for c in changes if c >= fault.at), None)))
        if s.group in previous and s.step <= previous[s.group]:
            # The same group went back (a rollback for bad numerics restores the newest
            # checkpoint in place): the steps it trains again are redone.
            out.append(Interruption(last_at if last_at is not None else s.at, "rollback", high_water,
                                    resumed_at=s.at, resumed_step=s.step))
        previous[s.group] = s.step
        if s.group not in seen:
            if seen:  # the first group is the start, not an interruption
                # Every fault still open is over when a new group trains (two faults
                # close together share one recovery); with none, the job re-formed on
                # its own: it grew back.
                open_faults = [c for c in out if c.fault is not None and c.resumed_at is None]
                if not open_faults:
                    open_faults = [Interruption(last_at if last_at is not None else s.at, "rejoin", high_water)]
                    out.append(open_faults[0])
                for cut in open_faults:
                    cut.resumed_at, cut.resumed_step = s.at, s.step
            seen.add(s.group)
        high_water = max(high_water, s.step)
        last_at = s.at
        for cut in out:
            if cut.caught_up is None and cut.resumed_at is not None and s.step > cut.high_water:
                cut.caught_up = s.at
    for fault in pending:  # injected after the last step seen
        out.append(Interruption(fault.at, fault.kind, high_water, fault=fault,
                                detected=next((c for c in changes if c >= fault.at), None)))
    _attach_rejoins(out)
    return out


def _high_water(steps: list[StepSeen], at: float) -> int:
    return max((s.step for s in steps if s.at <= at), default=0)


def _attach_rejoins(cuts: list[Interruption]) -> None:
    """Each rejoin belongs to the fault before it (the node it lost came back)."""
    owner = None
    for cut in cuts:
        if cut.fault is not None:
            owner = cut
        elif owner is not None and cut.cause == "rejoin":
            owner.rejoins.append(cut)


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``spans``."""
    total, reach = 0.0, None
    for begin, end in sorted(spans):
        if end <= begin:
            continue
        if reach is None or begin > reach:
            total += end - begin
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


@dataclass(frozen=True)
class Account:
    wall: float
    startup: float
    lost: float
    """Start-up included, overlaps counted once."""

    @property
    def ettr(self) -> float:
        return max(0.0, 1.0 - self.lost / self.wall) if self.wall > 0 else 0.0


STALL_SECONDS = 10.0
"""A wait this long between two steps seen (or after the last one) with no new group is
lost time too: a job that stopped (failed, stuck) makes no progress either."""


def account(created: float, ended: float, steps: list[StepSeen], cuts: list[Interruption], stall: float = STALL_SECONDS) -> Account:
    """Lost time over [created, ended]: the start-up, each interruption from its start
    until it caught up (or the end of the run, if it never did), and every stall."""
    first = steps[0].at if steps else ended
    spans = [(created, first)] + [(c.start, min(c.caught_up if c.caught_up is not None else ended, ended)) for c in cuts]
    stops = [s.at for s in steps] + [ended]
    spans += [(a, b) for a, b in zip(stops, stops[1:]) if b - a > stall]
    return Account(wall=ended - created, startup=first - created, lost=union_seconds(spans))


def episode_lost(cut: Interruption, ended: float) -> float:
    """A fault's lost time with the rejoins it caused (overlaps counted once)."""
    return union_seconds([(c.start, c.caught_up if c.caught_up is not None else ended) for c in (cut, *cut.rejoins)])


@dataclass(frozen=True)
class Spread:
    median: float
    worst: float
    n: int


def spread(values: list[float]) -> Spread | None:
    return Spread(statistics.median(values), max(values), len(values)) if values else None


def steady_step_seconds(steps: list[StepSeen], cuts: list[Interruption], world: int) -> float | None:
    """The mean time between two consecutive steps of one group at ``world``, outside
    every interruption: the pace of undisturbed training.

    A mean, not a median: a step is stamped when the benchmark reads the log, so with
    several steps per read the single gaps are 0 or a read period, and their median is
    the read period's, not the step's. Their sum over a stretch is exact whatever the
    reads."""
    spans = [(c.start, c.caught_up if c.caught_up is not None else float("inf")) for c in cuts]
    gaps = [b.at - a.at for a, b in zip(steps, steps[1:])
            if a.group == b.group and b.step == a.step + 1 and a.world == b.world == world
            and not any(lo <= b.at <= hi for lo, hi in spans)]
    return sum(gaps) / len(gaps) if gaps else None
