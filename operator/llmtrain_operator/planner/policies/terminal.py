"""A finished job: stop stragglers and apply ``ttlSecondsAfterFinished``."""

from __future__ import annotations

from ...api.observed import parse_time
from ...api.vocabulary import TERMINAL_PHASES, Phase, Reason
from ..context import DeleteJob, Pass, Verdict
from ..outcome import stop_pods
from ..podgroup import release as release_pod_group
from ..queue import finish as finish_workload


def handle(ctx: Pass) -> Verdict:
    if ctx.status.phase not in TERMINAL_PHASES:
        return Verdict.CONTINUE
    stop_pods(ctx, include_finished=False)
    release_pod_group(ctx, "the job finished")
    finish_workload(ctx, ctx.status.phase == Phase.SUCCEEDED, f"the job {ctx.status.phase.lower()}")
    ttl = ctx.spec.ttl_seconds_after_finished
    if ttl is not None:
        done = parse_time(ctx.status.completion_time) or ctx.now
        left = ttl - (ctx.now - done).total_seconds()
        if left <= 0:
            ctx.actions.append(DeleteJob(Reason.TTL_EXPIRED))
            ctx.event(Reason.TTL_EXPIRED, f"deleting the job {ttl}s after it finished")
        else:
            ctx.after(left)
    return Verdict.FINISHED
