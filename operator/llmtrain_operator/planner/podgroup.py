"""The PodGroup a gang job's scheduler expects (``scheduling.gang``): Volcano's or
scheduler-plugins' coscheduling; its manifest, and its release by a suspended or
finished job (used by ``policies/suspension.py`` and ``policies/terminal.py``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from ..api.job import LLMTrainJob
from ..api.spec import SchedulingSpec
from ..api.vocabulary import ConditionType, Reason
from . import names
from .context import DeleteObject, Pass


@dataclass(frozen=True)
class PodGroupApi:
    scheduler: str
    """``volcano`` | ``scheduler-plugins``: what ``scheduling.gang.scheduler`` says."""
    group: str
    version: str
    plural: str = "podgroups"
    kind: str = "PodGroup"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


VOLCANO = PodGroupApi("volcano", "scheduling.volcano.sh", "v1beta1")
SCHEDULER_PLUGINS = PodGroupApi("scheduler-plugins", "scheduling.x-k8s.io", "v1alpha1")
APIS = {api.scheduler: api for api in (VOLCANO, SCHEDULER_PLUGINS)}

@dataclass(frozen=True)
class GangGate:
    """What the gang decided in this pass (``policies/gang.py``), handed by ``plan`` to the
    creation of the worker pods: ``NOT_HELD`` for a job without a gang, in a cluster
    without the PodGroup API, or whose PodGroup is ready."""

    workers_held: str | None = None
    """Why no worker pod may be created in this pass (their PodGroup is not ready), or None."""


NOT_HELD = GangGate()


VOLCANO_WAITING_PHASES = ("", "Pending")
"""Volcano's admission refuses a pod whose PodGroup is still Pending (its queue has not
taken the gang in), so the worker pods are created once the phase moved on (Inqueue,
Running ...), as Kubeflow's training-operator does."""


def api_for(job: LLMTrainJob) -> PodGroupApi | None:
    """The PodGroup API of a gang job, None without ``scheduling.gang``."""
    return api_of(job.spec.scheduling)


def api_of(sched: SchedulingSpec | None) -> PodGroupApi | None:
    if sched is None or sched.gang is None:
        return None
    chosen = sched.gang.scheduler or ("volcano" if sched.scheduler_name == "volcano" else "scheduler-plugins")
    return APIS[chosen]


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z]*)$")


def scale_quantity(quantity: str, factor: int) -> str | None:
    """``16Gi`` x 2 -> ``32Gi``: the number scaled, the suffix kept. None for a form this
    does not read (an exponent): that resource is then left out of ``minResources``."""
    match = _QUANTITY.match(str(quantity).strip())
    if match is None:
        return None
    try:
        number = Decimal(match.group(1)) * factor
    except InvalidOperation:
        return None
    text = format(number.normalize(), "f") if number != number.to_integral() else str(int(number))
    return text + match.group(2)


def min_resources(job: LLMTrainJob, members: int) -> dict[str, str]:
    """What ``members`` worker pods request together (requests, else limits, as the API
    server defaults them): the schedulers admit the gang only where that fits."""
    res = job.spec.resources
    if res is None:
        return {}
    per_pod = {**{k: str(v) for k, v in (res.limits or {}).items()}, **{k: str(v) for k, v in (res.requests or {}).items()}}
    scaled = {name: scale_quantity(q, members) for name, q in per_pod.items()}
    return {name: q for name, q in sorted(scaled.items()) if q is not None}


def pod_group(job: LLMTrainJob, owner: dict[str, Any]) -> dict[str, Any]:
    """The job's PodGroup, named like the job (the name its worker pods carry)."""
    api = api_for(job)
    sched = job.spec.scheduling
    assert api is not None and sched is not None and sched.gang is not None, "pod_group() of a job without scheduling.gang"
    gang = sched.gang
    spec: dict[str, Any] = {"minMember": gang.min_available}
    wanted = min_resources(job, gang.min_available)
    if wanted:
        spec["minResources"] = wanted
    if api is VOLCANO:
        if gang.queue:
            spec["queue"] = gang.queue
        if sched.priority_class_name:
            spec["priorityClassName"] = sched.priority_class_name
    elif gang.schedule_timeout_seconds is not None:
        spec["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
    return {
        "apiVersion": api.api_version,
        "kind": api.kind,
        "metadata": {
            "name": job.metadata.name,
            "namespace": job.metadata.namespace or "default",
            "labels": names.job_labels(job.metadata.name),
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def release(ctx: Pass, why: str) -> None:
    """Delete the job's PodGroup (a suspended or finished job). The condition says so once
    a pass saw it gone, so that a delete that failed is tried again."""
    api = api_for(ctx.job)
    seen = ctx.observed.pod_group
    if api is None or seen is None or not seen.served:
        return
    if seen.exists:
        ctx.actions.append(DeleteObject(api.api_version, api.kind, ctx.job.metadata.name, uid=seen.uid))
        ctx.event(Reason.POD_GROUP_DELETED, f"deleting PodGroup {ctx.job.metadata.name} ({api.api_version}): {why}")
        ctx.after(1.0)
    else:
        ctx.condition(ConditionType.POD_GROUP_READY, False, Reason.POD_GROUP_DELETED, f"no PodGroup: {why}")
