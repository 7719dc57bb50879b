"""``activeDeadlineSeconds``: active (non-suspended) seconds, then Failed."""

from __future__ import annotations

from ...api.vocabulary import FailureKind, Reason
from ..accounting import record_failure
from ..context import Pass, Verdict
from ..outcome import finish


def handle(ctx: Pass) -> Verdict:
    deadline = ctx.spec.active_deadline_seconds
    if deadline is None:
        return Verdict.CONTINUE
    left = deadline - ctx.status.active_seconds
    if left > 0:
        ctx.after(left)
        return Verdict.CONTINUE
    record_failure(ctx, FailureKind.DEADLINE, Reason.DEADLINE_EXCEEDED, message=f"activeDeadlineSeconds={deadline} exceeded")
    finish(ctx, False, Reason.DEADLINE_EXCEEDED, f"the job ran longer than activeDeadlineSeconds={deadline}")
    return Verdict.FINISHED
