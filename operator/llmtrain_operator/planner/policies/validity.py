"""The job's validity: an invalid spec, or a referenced object that does not exist
(a Secret, a PVC), is reported as the ``Invalid`` condition naming the cause; fixing it
clears the condition. Missing objects are found before pods exist (the operator reads
them, ``missing``) and, for what it may not read, from the worker pods that wait for
them (``CreateContainerConfigError``), which also names any other reason a pod cannot
start (an image that would run as root where it must not)."""

from __future__ import annotations

import re
from datetime import datetime

from ...api.observed import PodView
from ...api.vocabulary import ConditionType, Phase, Reason
from .. import names, podpolicy
from ..manifests import IMAGE_UID
from ..conditions import is_true, set_condition
from ..context import Ledger, Pass, Verdict

MISSING_RECHECK_SECONDS = 30
OTHER_WAIT_GRACE_SECONDS = 20
CONFIG_ERROR = "CreateContainerConfigError"
_KINDS = {"secret": "Secret", "configmap": "ConfigMap"}
_NAME = r"(?:[a-z0-9.-]+/)?([a-z0-9.-]+)"
_MISSING_OBJECT = re.compile(rf'\b(secret|configmap)s? +"?{_NAME}"? +not found', re.IGNORECASE)
"""The kubelet's ``secret "s3-creds" not found`` (and ``Secret ml/s3-creds not found``)."""
_MISSING_KEY = re.compile(rf"\bkey +(\S+) +(?:not found +)?in +(secret|configmap) +{_NAME}", re.IGNORECASE)
"""The kubelet's ``couldn't find key K in Secret ml/s3-creds``."""


RESOLVED: dict[str, str] = {
    Reason.POD_TEMPLATE_REFUSED: "the pod template asks for nothing the operator refuses",
    Reason.MISSING_DEPENDENCY: "the objects the job was missing exist now",
    Reason.TIER_CONFLICT: "no older live job uses the job's checkpoint tiers now",
    Reason.CONTAINER_CONFIG_ERROR: "the pods no longer wait on a container configuration error",
}
"""What clearing ``Invalid`` says, by the reason it had (an invalid spec: "valid again")."""


TIER_HINT = ("; give this job its own spec.checkpoint.shared.subPath or spec.checkpoint.s3.prefix, or delete the "
             "other job (this one starts by itself once it is gone)")
ROOT_HINT = (f"; the image runs as root: use one with a numeric non-root USER (the project's run as {IMAGE_UID}), "
             "or allow root with spec.podTemplate.spec.securityContext.runAsNonRoot: false")


def waits_of_pods(pods: tuple[PodView, ...] | list[PodView], own_config_map: str,
                  now: datetime) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What keeps pods in ``CreateContainerConfigError``: (Secrets and ConfigMaps, or keys
    in them, that they wait for; every other reason, as the kubelet words it, with the
    pod). The first is what the operator cannot check itself without reading Secrets; the
    second is, for example, an image that would run as root in a pod that must not,
    counted once the pod has waited ``OTHER_WAIT_GRACE_SECONDS`` (a kubelet that just
    started reports such errors for a moment). The job's own ConfigMap is left out: a pod
    may be created a moment before it, and that wait ends on its own."""
    missing: set[str] = set()
    other: dict[str, str] = {}
    for pod in pods:
        if pod.deleting or pod.waiting_reason != CONFIG_ERROR or not pod.waiting_message:
            continue
        message = pod.waiting_message
        key = _MISSING_KEY.search(message)
        obj = None if key else _MISSING_OBJECT.search(message)
        if key:
            kind, name, detail = _KINDS[key.group(2).lower()], key.group(3), f" (key {key.group(1)})"
        elif obj:
            kind, name, detail = _KINDS[obj.group(1).lower()], obj.group(2), ""
        else:
            if pod.created is None or (now - pod.created).total_seconds() >= OTHER_WAIT_GRACE_SECONDS:
                other.setdefault(message, pod.name)
            continue
        if not (kind == "ConfigMap" and name == own_config_map):
            missing.add(f"{kind} {name}{detail}")
    blocked = tuple(f"pod {pod} cannot start: {message}" + (ROOT_HINT if "runAsNonRoot" in message else "")
                    for message, pod in sorted(other.items(), key=lambda item: item[1]))
    return tuple(sorted(missing)), blocked


def mark_invalid(ctx: Ledger, reason: str, message: str, generation: int | None) -> None:
    """Phase Invalid; an Event only when the condition flips (not on every pass).
    ``generation`` is passed in: for an unparsable spec there is no typed job."""
    ctx.status.phase = Phase.INVALID
    if set_condition(ctx.status.conditions, ConditionType.INVALID, True, reason, message, ctx.stamp, generation):
        ctx.event(reason, message, warning=True)


def handle(ctx: Pass) -> Verdict:
    refused = podpolicy.refusals(ctx.spec.pod_template.to_wire() if ctx.spec.pod_template is not None else None,
                                 ctx.pod_policy)
    if refused:
        mark_invalid(ctx, Reason.POD_TEMPLATE_REFUSED, "; ".join(refused), ctx.generation)
        return Verdict.BLOCKED
    if ctx.observed.tier_conflicts:
        # Before any pod exists: two jobs on one tier overwrite and prune each other's steps.
        mark_invalid(ctx, Reason.TIER_CONFLICT, "; ".join(ctx.observed.tier_conflicts) + TIER_HINT, ctx.generation)
        ctx.after(MISSING_RECHECK_SECONDS)
        return Verdict.BLOCKED
    waited_for, blocked = waits_of_pods(ctx.observed.pods, names.config_map(ctx.job.metadata.name), ctx.now)
    missing = sorted(set(ctx.observed.missing) | set(waited_for))
    if missing or blocked:
        if missing:
            mark_invalid(ctx, Reason.MISSING_DEPENDENCY, "missing: " + ", ".join(missing) + " (in the job's namespace)", ctx.generation)
        else:
            mark_invalid(ctx, Reason.CONTAINER_CONFIG_ERROR, "; ".join(blocked), ctx.generation)
        ctx.after(MISSING_RECHECK_SECONDS)
        return Verdict.BLOCKED
    if is_true(ctx.status.conditions, ConditionType.INVALID):
        was = next(c.reason for c in ctx.status.conditions if c.type == ConditionType.INVALID)
        message = RESOLVED.get(was, "the spec is valid again")
        ctx.condition(ConditionType.INVALID, False, Reason.SPEC_VALID, message)
        ctx.event(Reason.SPEC_VALID, message)
        ctx.status.phase = Phase.PENDING
    return Verdict.CONTINUE
