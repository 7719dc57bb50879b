"""Active and productive seconds, for the deadline and goodput."""

from __future__ import annotations

from ..api.vocabulary import TERMINAL_PHASES, Phase
from .context import Pass
from .decisions import JobStarted


def account_time(ctx: Pass) -> None:
    """Advance active and productive seconds by the time since the last pass."""
    status = ctx.status
    if status.start_time is None:
        status.start_time = ctx.stamp
        ctx.decide(JobStarted())
    elapsed = ctx.seconds_since(status.last_reconcile_time)
    status.last_reconcile_time = ctx.stamp
    if elapsed is None or elapsed <= 0 or status.phase in (Phase.SUSPENDED, *TERMINAL_PHASES):
        return
    status.active_seconds += elapsed
    if status.phase == Phase.RUNNING:
        status.productive_seconds += elapsed
    if status.active_seconds > 0:
        status.goodput = round(min(1.0, status.productive_seconds / status.active_seconds), 4)
