"""Values a pod supplied that the operator could not use: a label, a termination
message's field, a metric (``api.untrusted``). Each was already left out of what the
pass reads; here each is reported once per pod and field, as a Warning Event naming the
pod and the value, so that a broken or hostile pod is visible without wedging its job."""

from __future__ import annotations

from ...api.vocabulary import Reason
from ..accounting import first_sighting
from ..context import Pass, Verdict


def handle(ctx: Pass) -> Verdict:
    book = ctx.status.internal
    for pod in ctx.observed.pods:
        for what in pod.rejected + ctx.observed.rejected_values.get(pod.name, ()):
            key = f"pod:{pod.uid}/{what.split(' (', 1)[0]}"
            if not first_sighting(book.values_rejected, key):
                continue
            ctx.event(Reason.UNUSABLE_POD_VALUE, f"pod {pod.name}: {what} is not a value the operator can use; ignored",
                      warning=True)
    return Verdict.CONTINUE
