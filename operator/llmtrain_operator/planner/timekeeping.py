"""Active, productive and redone seconds, for the deadline, goodput and ETTR."""

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
        if _redoing(ctx):
            status.redo_seconds += elapsed
    if status.active_seconds > 0:
        status.goodput = round(min(1.0, status.productive_seconds / status.active_seconds), 4)
        good = max(0.0, status.productive_seconds - status.redo_seconds)
        status.ettr = round(min(1.0, good / status.active_seconds), 4)


def _redoing(ctx: Pass) -> bool:
    """The trainers train steps already trained once: the newest step they report is
    below the job's high-water mark (``status.step`` never goes down), as after a restore
    from a checkpoint older than the failure or a rollback for bad numerics. A pass with
    no step reported (a probe missed) counts as not redoing: only a step seen lower is
    evidence of replayed work."""
    steps = [probe.step for probe in ctx.observed.worker_probes() if probe.step is not None]
    return bool(steps) and max(steps) < ctx.status.step
