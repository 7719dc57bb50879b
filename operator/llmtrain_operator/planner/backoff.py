"""The backoff before a replacement: per worker slot, as a Kubernetes Job's
``backoffLimitPerIndex`` computes its delays per index.

A slot's replacement waits ``initialSeconds × factor^(k-1)`` (capped at ``maxSeconds``),
where ``k`` counts that slot's failures in a row: a failure more than
``resetAfterSeconds`` after the slot's previous replacement was due starts again at 1, as
the kubelet's CrashLoopBackOff resets after a container has run for a while. A failure
elsewhere in the job does not delay the slot: in a job of a thousand nodes, failures of
different nodes are independent, and one job-wide count that never resets made every
replacement wait ``maxSeconds`` after the first few (bench/operator_scale.py: kill →
replacement 10.0 s at worst with example 01's 10 s cap). A crash loop still backs off:
every slot that keeps failing counts its own failures.

A job-wide restart (``RestartAll``, the progress backstop) replaces every slot: it counts
under ``JOB_WIDE``, whose wait holds back every slot."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..api.status import SlotBackoff
from .context import Pass

JOB_WIDE = "*"
"""The key of restarts that replace every slot."""

MAX_SLOTS = 128
"""Slots whose streaks are kept at once (about 115 bytes each in the status, with the
managedFields entries that name its keys); beyond it the entry due longest ago goes
first, and that slot's next failure counts from 1. More slots failing within
``resetAfterSeconds`` is a job-wide problem, which the restart budget ends."""


TIMER_FLOOR = 0.05
"""A pass is asked for when a replacement is due, not a whole second after a pass that
found it 0.3 s away (the planner's usual floor): the wait only shrinks from pass to pass,
so the timer cannot spin. Deadlines are kept to the millisecond for the same reason."""


def delay_seconds(ctx: Pass, failures: int) -> float:
    """``initialSeconds × factor^(failures-1)``, capped, without computing a power that
    overflows a float (a long streak: ``2.0 ** 1100`` raises)."""
    b = ctx.spec.fault_tolerance.backoff
    n = max(0, failures - 1)
    if b.max_seconds <= b.initial_seconds or b.factor == 1:
        return min(b.max_seconds, b.initial_seconds)
    if b.initial_seconds <= 0 or n < math.log(b.max_seconds / b.initial_seconds, b.factor):
        return min(b.max_seconds, b.initial_seconds * b.factor ** n)
    return b.max_seconds


def key(slot: int | None) -> str:
    return JOB_WIDE if slot is None else str(slot)


def start(ctx: Pass, keys: Iterable[str]) -> None:
    """A restart charged for ``keys`` (slots, or ``JOB_WIDE``): each streak grows (or
    starts again), and ``status.nextRestartTime`` names the latest replacement's time."""
    table = ctx.status.internal.backoff
    reset_after = ctx.spec.fault_tolerance.backoff.reset_after_seconds
    for k in dict.fromkeys(keys):
        entry = table.pop(k, None)
        failures = entry.failures + 1 if entry is not None and -_left(ctx, entry.until) < reset_after else 1
        delay = delay_seconds(ctx, failures)
        table[k] = SlotBackoff(failures=failures, until=ctx.at(delay, ms=True))  # re-inserted: newest last
        ctx.after(delay, floor=TIMER_FLOOR, urgent=True)
    for stale in [k for k, e in table.items() if (since := ctx.seconds_since(e.until)) is None or since >= reset_after]:
        del table[stale]
    while len(table) > MAX_SLOTS:
        del table[min(table, key=lambda k: _left(ctx, table[k].until))]
    latest = max(table.values(), key=lambda e: _left(ctx, e.until), default=None)
    if latest is not None and _left(ctx, latest.until) > 0:
        ctx.status.next_restart_time = latest.until


def _left(ctx: Pass, stamp: str | None) -> float:
    """Seconds until ``stamp`` (negative: past; 0: none, or one that does not parse)."""
    return -(ctx.seconds_since(stamp) or 0.0)


def wait_seconds(ctx: Pass, slot: int) -> float:
    """How long ``slot``'s replacement still waits (0: it may be created now)."""
    table = ctx.status.internal.backoff
    if not table:
        # A status written before backoff was per slot: its one job-wide time holds.
        return max(0.0, _left(ctx, ctx.status.next_restart_time))
    return max([0.0, *(_left(ctx, e.until) for k in (str(slot), JOB_WIDE) if (e := table.get(k)) is not None)])


def clear(ctx: Pass) -> None:
    """Suspension: a resumed job starts its pods at once, every streak from 1."""
    ctx.status.internal.backoff = {}
    ctx.status.next_restart_time = None
