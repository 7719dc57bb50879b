"""Gang scheduling (``scheduling.gang``): the PodGroup the chosen scheduler expects,
owned by the job, before any worker pod (``planner/podgroup.py``).

- The cluster does not serve that PodGroup API (the scheduler is not installed): the
  condition ``PodGroupReady`` says so with a Warning Event, and the pods are created
  without a PodGroup.
- The PodGroup is missing: it is created, and the worker pods wait for the next pass.
- Volcano keeps it Pending until its queue takes the whole gang in; its admission refuses
  pods before that, so the worker pods wait (a pass every few seconds).
- The API server refuses the operator the read (RBAC): the worker pods wait, its words in
  the condition and a Warning Event, and the read is retried every 30 s.
- A suspended or finished job gives its PodGroup back (``podgroup.release``), so that a Volcano
  queue does not keep the gang's resources reserved for pods that will not come.
"""

from __future__ import annotations

from ...api.vocabulary import ConditionType, Reason
from .. import manifests, podgroup
from ..context import CreateObject, Pass, UpdateSpec
from ..podgroup import NOT_HELD, GangGate

VOLCANO_POLL_SECONDS = 2.0
"""A Volcano PodGroup's phase is read this often while the pods wait on it (no watch)."""
READ_RETRY_SECONDS = 30.0
"""A read the API server refused (RBAC) is tried again this often: a fixed Role applies
without any event the operator watches."""


def handle(ctx: Pass) -> GangGate:
    """Always lets the pass go on; what it decided is the ``GangGate`` it returns."""
    api = podgroup.api_for(ctx.job)
    seen = ctx.observed.pod_group
    if api is None or seen is None:
        return NOT_HELD
    name = ctx.job.metadata.name
    what = f"PodGroup {name} ({api.api_version})"
    if seen.refused:
        # Without reading it, the operator cannot tell whether the workers may be created.
        if ctx.condition(ConditionType.POD_GROUP_READY, False, Reason.READ_REFUSED, seen.refused):
            ctx.event(Reason.READ_REFUSED, seen.refused, warning=True)
        ctx.after(READ_RETRY_SECONDS)
        return GangGate(workers_held=seen.refused)
    if seen.foreign:
        if ctx.condition(ConditionType.POD_GROUP_READY, False, Reason.NOT_OWNED, seen.foreign):
            ctx.event(Reason.NOT_OWNED, seen.foreign, warning=True)
        ctx.after(READ_RETRY_SECONDS)
        return GangGate(workers_held=seen.foreign)
    if not seen.served:
        message = (f"the cluster does not serve {api.plural}.{api.group}/{api.version} (is {api.scheduler} installed?); "
                   "the worker pods are created without a PodGroup")
        if ctx.condition(ConditionType.POD_GROUP_READY, False, Reason.POD_GROUP_API_MISSING, message):
            ctx.event(Reason.POD_GROUP_API_MISSING, message, warning=True)
        return NOT_HELD
    wanted = podgroup.pod_group(ctx.job, manifests.owner_reference(ctx.job))
    members = wanted["spec"]["minMember"]
    if not seen.exists:
        ctx.actions.append(CreateObject(wanted))
        ctx.event(Reason.POD_GROUP_CREATED, f"created {what} with minMember {members}")
        ctx.condition(ConditionType.POD_GROUP_READY, False, Reason.POD_GROUP_CREATED, f"created {what}; the worker pods follow")
        ctx.after(1.0)
        return GangGate(workers_held=f"{what} was just created")
    if any(seen.spec.get(key) != value for key, value in wanted["spec"].items()):
        ctx.actions.append(UpdateSpec(wanted))
    if api is podgroup.VOLCANO and seen.phase in podgroup.VOLCANO_WAITING_PHASES:
        message = (f"waiting for Volcano to take {what} into its queue (phase {seen.phase or 'not set yet'}); "
                   "the worker pods are created then")
        ctx.condition(ConditionType.POD_GROUP_READY, False, Reason.POD_GROUP_PENDING, message)
        ctx.after(VOLCANO_POLL_SECONDS)
        return GangGate(workers_held=message)
    phase = f", phase {seen.phase}" if seen.phase else ""
    ctx.condition(ConditionType.POD_GROUP_READY, True, Reason.POD_GROUP_CREATED, f"{what}, minMember {members}{phase}")
    return NOT_HELD

