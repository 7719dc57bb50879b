"""Kueue (``planner/queue.py``): a queued job runs only while Kueue admits its Workload.

- Kueue not installed (its Workload API not served): the condition ``Admitted`` says so
  with a Warning Event, and the job runs unqueued (as a JobSet does where Kueue is not).
- No Workload yet: it is created, and the job is suspended (``spec.suspend`` is set, as
  Kueue's webhook does for the jobs it manages).
- Admitted: ``spec.suspend`` is cleared and the pods carry the flavors' placement.
- Not admitted, or evicted: suspended; once an evicted job's pods are gone, its Workload
  gives the quota back, and Kueue queues it again.
- The API server refuses the operator the read (RBAC): suspended, with its words in the
  condition and a Warning Event.
"""

from __future__ import annotations

from ...api.observed import format_time
from ...api.vocabulary import ConditionType, Reason
from .. import manifests, queue
from ..context import CreateObject, Pass, PatchStatus, SetSuspend
from ..queue import UNQUEUED, Admission


def handle(ctx: Pass) -> Admission:
    """Always lets the pass go on; what it decided is the ``Admission`` it returns."""
    name = queue.queue_of(ctx.job)
    seen = ctx.observed.workload
    if name is None or seen is None:
        return UNQUEUED
    workload = queue.workload_name(ctx.job.metadata.name)
    if seen.foreign:
        held = _hold(ctx, Reason.NOT_OWNED, seen.foreign)  # not this job's admission: not run
        ctx.after(queue.POLL_SECONDS)
        return held
    if seen.refused:
        held = _hold(ctx, Reason.READ_REFUSED, seen.refused)  # the admission cannot be known: not run
        ctx.after(queue.POLL_SECONDS)
        return held
    if not seen.served:
        message = (f"label {queue.QUEUE_LABEL}={name}: the cluster does not serve {queue.PLURAL}.{queue.API_VERSION} "
                   "(is Kueue installed?); the job runs without a queue")
        if ctx.condition(ConditionType.ADMITTED, False, Reason.KUEUE_API_MISSING, message):
            ctx.event(Reason.KUEUE_API_MISSING, message, warning=True)
        return UNQUEUED
    ctx.after(queue.POLL_SECONDS)
    if not seen.exists:
        ctx.actions.append(CreateObject(queue.workload(
            ctx.job, manifests.owner_reference(ctx.job), manifests.worker_pod(ctx.job, 0, ctx.status.restart_generation,
                                                                             runtime_image=ctx.runtime_image),
            manifests.store_pod(ctx.job, ctx.runtime_image))))
        ctx.event(Reason.CREATED, f"created Workload {workload} in LocalQueue {name}")
        return _hold(ctx, Reason.WAITING_FOR_ADMISSION, f"waiting for Kueue to admit Workload {workload} (LocalQueue {name})")
    if seen.admitted:
        message = f"Kueue admitted Workload {workload} to ClusterQueue {seen.cluster_queue}"
        if ctx.condition(ConditionType.ADMITTED, True, Reason.ADMITTED_BY_KUEUE, message):
            ctx.event(Reason.ADMITTED_BY_KUEUE, message)
        if ctx.spec.suspend:
            ctx.actions.append(SetSuspend(False))
        return Admission(admitted=True, node_selector=dict(seen.node_selector), tolerations=tuple(seen.tolerations))
    if not seen.evicted:
        return _hold(ctx, Reason.WAITING_FOR_ADMISSION, f"waiting for Kueue to admit Workload {workload} (LocalQueue {name})")
    held = _hold(ctx, Reason.EVICTED_BY_KUEUE, f"Kueue evicted Workload {workload}: {seen.evicted}")
    if seen.reserved and not any(p.active or p.deleting for p in ctx.observed.pods):
        # The pods are gone: give the quota back (Kueue's integrations do this step).
        now = format_time(ctx.now)
        ctx.actions.append(PatchStatus(queue.API_VERSION, queue.KIND, workload, {
            "admission": None,
            "conditions": queue.conditions_with(seen, now, ("QuotaReserved", "False", "Pending", seen.evicted),
                                                ("Admitted", "False", "NoReservation", "The workload has no reservation")),
        }, seen.resource_version))
    return held


def _hold(ctx: Pass, reason: str, message: str) -> Admission:
    if ctx.condition(ConditionType.ADMITTED, False, reason, message) and reason in (Reason.EVICTED_BY_KUEUE, Reason.READ_REFUSED,
                                                                                      Reason.NOT_OWNED):
        ctx.event(reason, message, warning=True)
    if not ctx.spec.suspend:
        ctx.actions.append(SetSuspend(True))
    return Admission(hold=message)
