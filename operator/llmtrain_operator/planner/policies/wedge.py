"""The operator's backstop: ``status.step`` not advancing for ``progressTimeoutSeconds``
while Running means the whole job is wedged: RestartAll."""

from __future__ import annotations

from ...api.vocabulary import FailureKind, Phase, Reason
from ..accounting import record_failure
from ..budget import count_restart, restart_all
from ..context import Pass, Verdict


def handle(ctx: Pass) -> Verdict:
    limit = ctx.spec.fault_tolerance.progress_timeout_seconds
    status = ctx.status
    if not limit or status.phase != Phase.RUNNING:
        return Verdict.CONTINUE
    idle = ctx.seconds_since(status.last_progress_time)
    if idle is None:
        status.last_progress_time = ctx.stamp
        ctx.after(limit)
        return Verdict.CONTINUE
    if idle < limit:
        ctx.after(limit - idle)
        return Verdict.CONTINUE
    record_failure(ctx, FailureKind.WEDGED, Reason.NO_PROGRESS, message=f"step {status.step} did not advance for {idle:.0f}s")
    if not count_restart(ctx, Reason.WEDGED):
        return Verdict.FINISHED
    restart_all(ctx, f"step {status.step} did not advance for {idle:.0f}s (progressTimeoutSeconds={limit})")
    status.last_progress_time = ctx.stamp
    return Verdict.CONTINUE
