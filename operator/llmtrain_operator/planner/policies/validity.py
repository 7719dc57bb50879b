"""The job's validity: an invalid spec, or a referenced object that does not exist
(a Secret, a PVC), is reported as the ``Invalid`` condition naming the cause; fixing it
clears the condition."""

from __future__ import annotations

from ...api.vocabulary import ConditionType, Phase, Reason
from ..conditions import is_true, set_condition
from ..context import Pass, Verdict

MISSING_RECHECK_SECONDS = 30


def mark_invalid(ctx: Pass, reason: str, message: str, generation: int | None) -> None:
    """Phase Invalid; an Event only when the condition flips (not on every pass).
    ``generation`` is passed in: for an unparsable spec there is no typed job."""
    ctx.status.phase = Phase.INVALID
    if set_condition(ctx.status.conditions, ConditionType.INVALID, True, reason, message, ctx.stamp, generation):
        ctx.event(reason, message, warning=True)


def handle(ctx: Pass) -> Verdict:
    if ctx.observed.missing:
        mark_invalid(ctx, Reason.MISSING_DEPENDENCY,
                     "missing: " + ", ".join(ctx.observed.missing) + " (in the job's namespace)", ctx.generation)
        ctx.after(MISSING_RECHECK_SECONDS)
        return Verdict.BLOCKED
    if is_true(ctx.status.conditions, ConditionType.INVALID):
        ctx.condition(ConditionType.INVALID, False, Reason.SPEC_VALID, "the spec is valid again")
        ctx.event(Reason.SPEC_VALID, "the spec is valid again")
        ctx.status.phase = Phase.PENDING
    return Verdict.CONTINUE
