"""Success: a worker exited 0 and no worker still runs."""

from __future__ import annotations

from ...api.vocabulary import PodPhase, Reason
from ..context import Pass, Verdict
from ..outcome import finish


def handle(ctx: Pass) -> Verdict:
    workers = ctx.observed.workers()
    if not any(p.phase == PodPhase.SUCCEEDED for p in workers):
        return Verdict.CONTINUE
    if any(p.active for p in workers):
        ctx.after(5)
        return Verdict.CONTINUE
    builtin = ctx.spec.trainer.builtin
    if builtin is not None:
        ctx.status.step = max(ctx.status.step, builtin.max_steps)
    finish(ctx, True, Reason.COMPLETED, f"training finished at step {ctx.status.step}")
    if ctx.spec.ttl_seconds_after_finished is not None:
        ctx.after(ctx.spec.ttl_seconds_after_finished)
    return Verdict.FINISHED
