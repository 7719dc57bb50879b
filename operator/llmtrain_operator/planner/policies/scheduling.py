"""Pods the scheduler cannot place. A job whose pods ask for more than any node has would
otherwise sit in ``Created`` with the reason only on its pods, which ``kubectl get ltj``
never shows. The ``Unschedulable`` condition names the pods, the scheduler's own words
(``0/4 nodes are available: 3 Insufficient nvidia.com/gpu ...``) and the resources it finds
short; it is set in the pass that sees it and cleared once every pod is placed. An Event
once per pod. Not a failure: nothing is charged (the scheduler keeps trying, and a
cluster autoscaler may add a node)."""

from __future__ import annotations

import re

from ...api.observed import PodView
from ...api.vocabulary import ConditionType, PodPhase, Reason
from ..accounting import first_sighting
from ..context import Pass, Verdict

SHOWN_PODS = 3
_SHORT = re.compile(r"Insufficient ([A-Za-z0-9](?:[A-Za-z0-9./_-]{0,61}[A-Za-z0-9])?)")
"""A resource name; it ends with a letter or digit (``... nvidia.com/gpu. preemption: ...``)."""


def short_resources(message: str) -> list[str]:
    """The resources the scheduler names as insufficient, e.g. ``["nvidia.com/gpu"]``."""
    return sorted(set(_SHORT.findall(message)))


def unplaced(pods: tuple[PodView, ...]) -> list[PodView]:
    return [p for p in pods if p.active and p.phase == PodPhase.PENDING and p.unschedulable]


def handle(ctx: Pass) -> Verdict:
    pending = unplaced(ctx.observed.pods)
    if not pending:
        if any(c.type == ConditionType.UNSCHEDULABLE and c.status == "True" for c in ctx.status.conditions):
            ctx.condition(ConditionType.UNSCHEDULABLE, False, Reason.SCHEDULED, "every pod of the job is placed")
        return Verdict.CONTINUE
    names = [p.name for p in pending]
    shown = ", ".join(names[:SHOWN_PODS]) + (f" and {len(names) - SHOWN_PODS} more" if len(names) > SHOWN_PODS else "")
    words = next((p.schedule_message for p in pending if p.schedule_message), None) or "no reason given"
    short = sorted({r for p in pending for r in short_resources(p.schedule_message or "")})
    message = f"{len(names)} pod(s) cannot be scheduled ({shown}): {words}" + (f"; short of {', '.join(short)}" if short else "")
    ctx.condition(ConditionType.UNSCHEDULABLE, True, Reason.UNSCHEDULABLE, message)
    book = ctx.status.internal
    for pod in pending:
        key = f"pod:{pod.uid or pod.name}"
        if not first_sighting(book.unschedulable_seen, key):
            continue
        ctx.event(Reason.UNSCHEDULABLE, f"pod {pod.name} cannot be scheduled: {pod.schedule_message or 'no reason given'}",
                  warning=True)
    return Verdict.CONTINUE
