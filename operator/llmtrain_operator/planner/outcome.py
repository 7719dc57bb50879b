"""Entering a terminal phase, and stopping pods."""

from __future__ import annotations

from ..api.observed import PodView
from ..api.vocabulary import ConditionType, Phase, PodPhase
from .context import DeletePod, KeepPod, Pass
from .decisions import JobFinished


def stop_pods(ctx: Pass, include_finished: bool) -> None:
    """Delete the job's pods that still run (``include_finished``: those that ended too,
    but not the failed pods kept for their logs: they hold nothing)."""
    for pod in ctx.observed.pods:
        if pod.deleting or pod.kept:
            continue
        if include_finished or pod.active:
            ctx.actions.append(DeletePod(pod.name))


def retire(ctx: Pass, pod: PodView) -> None:
    """A worker pod whose end was handled (charged, or not to be charged) leaves its slot:
    a failed one is kept for its log while the job keeps any (``policies/kept.py``), any
    other is deleted."""
    if pod.phase == PodPhase.FAILED and ctx.spec.fault_tolerance.keep_failed_pods > 0:
        ctx.actions.append(KeepPod(pod.name, pod.uid))
    else:
        ctx.actions.append(DeletePod(pod.name))


def finish(ctx: Pass, succeeded: bool, reason: str, message: str) -> None:
    """Enter a terminal phase: stop what still runs, keep finished pods for their logs."""
    status = ctx.status
    status.phase = Phase.SUCCEEDED if succeeded else Phase.FAILED
    status.completion_time = ctx.stamp
    # Nothing trains any more (a success needs every worker finished; a failure stops
    # the rest): the counts say so, not whatever the last running pass saw.
    status.replicas.ready = status.replicas.active = 0
    status.workers = f"0/{status.replicas.desired or ctx.spec.replicas.max}"
    ctx.condition(ConditionType.SUCCEEDED if succeeded else ConditionType.FAILED, True, reason, message)
    for other in (ConditionType.RUNNING, ConditionType.RESTARTING, ConditionType.DEGRADED):
        ctx.condition(other, False, reason, message)
    ctx.decide(JobFinished(succeeded, reason, message))
    stop_pods(ctx, include_finished=False)
