"""The operator's backstop: no training step finished for ``progressTimeoutSeconds``
(``status.lastProgressTime``, kept by the progress policy) means the whole job is
wedged: RestartAll. A user's script that never reports a step is not watched
(``reports_progress``).

It acts in every phase where workers exist and should be training (Running, Restarting,
Created), so no job sits forever, whatever stopped it: a frozen pod that still looks
alive, a launcher that never exits, a trainer stuck before its first step. Waiting for
capacity is not a wedge: while no worker runs yet, or one cannot be scheduled, the clock
starts over (restarting would not help; a queue is not a failure of the job).
"""

from __future__ import annotations

from ...api.vocabulary import FailureKind, Phase, Reason
from ..accounting import record_failure
from ..budget import count_restart, restart_all
from ..context import Pass, Verdict

WATCHED = (Phase.RUNNING, Phase.RESTARTING, Phase.CREATED)


def reports_progress(ctx: Pass) -> bool:
    """The built-in trainer always reports its steps. A user's script may (through
    ``LLMTRAIN_PROGRESS_FILE``, docs/custom-scripts.md) or may not: one that never reported
    a step has no progress to time out, and only crashes and hangs of its processes
    count."""
    if ctx.spec.trainer.builtin is not None or ctx.status.step > 0:
        return True
    return any(p.step is not None for p in ctx.observed.probes.values())


def handle(ctx: Pass) -> Verdict:
    limit = ctx.spec.fault_tolerance.progress_timeout_seconds
    status = ctx.status
    if not limit or status.phase not in WATCHED or not reports_progress(ctx):
        return Verdict.CONTINUE
    workers = [p for p in ctx.observed.workers() if p.active]
    idle = ctx.seconds_since(status.last_progress_time)
    if idle is None or not workers or any(p.unschedulable for p in workers):
        status.last_progress_time = ctx.stamp
        ctx.after(limit)
        return Verdict.CONTINUE
    if idle < limit:
        ctx.after(limit - idle)
        return Verdict.CONTINUE
    what = f"step {status.step} did not advance for {idle:.0f}s" if status.step else f"no training step for {idle:.0f}s"
    record_failure(ctx, FailureKind.WEDGED, Reason.NO_PROGRESS, message=f"{what} (phase {status.phase})")
    if not count_restart(ctx, Reason.WEDGED):
        return Verdict.FINISHED
    restart_all(ctx, f"{what} (progressTimeoutSeconds={limit}, phase {status.phase})")
    status.last_progress_time = ctx.stamp
    return Verdict.CONTINUE
