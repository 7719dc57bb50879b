"""The job's validity: an invalid spec, or a referenced object that does not exist
(a Secret, a PVC), is reported as the ``Invalid`` condition naming the cause; fixing it
clears the condition. Missing objects are found before pods exist (the operator reads
them, ``missing``) and, for what it may not read, from the worker pods that wait for
them (``CreateContainerConfigError``)."""

from __future__ import annotations

import re

from ...api.observed import PodView
from ...api.vocabulary import ConditionType, Phase, Reason
from .. import names
from ..conditions import is_true, set_condition
from ..context import Pass, Verdict

MISSING_RECHECK_SECONDS = 30
CONFIG_ERROR = "CreateContainerConfigError"
_KINDS = {"secret": "Secret", "configmap": "ConfigMap"}
_NAME = r"(?:[a-z0-9.-]+/)?([a-z0-9.-]+)"
_MISSING_OBJECT = re.compile(rf'\b(secret|configmap)s? +"?{_NAME}"? +not found', re.IGNORECASE)
"""The kubelet's ``secret "s3-creds" not found`` (and ``Secret ml/s3-creds not found``)."""
_MISSING_KEY = re.compile(rf"\bkey +(\S+) +(?:not found +)?in +(secret|configmap) +{_NAME}", re.IGNORECASE)
"""The kubelet's ``couldn't find key K in Secret ml/s3-creds``."""


def missing_from_pods(pods: tuple[PodView, ...] | list[PodView], own_config_map: str) -> tuple[str, ...]:
    """Secrets and ConfigMaps (or keys in them) that worker pods wait for: what the
    operator cannot check itself without reading Secrets. The job's own ConfigMap is left
    out: a pod may be created a moment before it, and that wait ends on its own."""
    found: set[str] = set()
    for pod in pods:
        if pod.deleting or pod.waiting_reason != CONFIG_ERROR or not pod.waiting_message:
            continue
        key = _MISSING_KEY.search(pod.waiting_message)
        if key:
            kind, name, detail = _KINDS[key.group(2).lower()], key.group(3), f" (key {key.group(1)})"
        else:
            obj = _MISSING_OBJECT.search(pod.waiting_message)
            if not obj:
                continue
            kind, name, detail = _KINDS[obj.group(1).lower()], obj.group(2), ""
        if kind == "ConfigMap" and name == own_config_map:
            continue
        found.add(f"{kind} {name}{detail}")
    return tuple(sorted(found))


def mark_invalid(ctx: Pass, reason: str, message: str, generation: int | None) -> None:
    """Phase Invalid; an Event only when the condition flips (not on every pass).
    ``generation`` is passed in: for an unparsable spec there is no typed job."""
    ctx.status.phase = Phase.INVALID
    if set_condition(ctx.status.conditions, ConditionType.INVALID, True, reason, message, ctx.stamp, generation):
        ctx.event(reason, message, warning=True)


def handle(ctx: Pass) -> Verdict:
    waited_for = missing_from_pods(ctx.observed.pods, names.config_map(ctx.job.metadata.name))
    missing = sorted(set(ctx.observed.missing) | set(waited_for))
    if missing:
        mark_invalid(ctx, Reason.MISSING_DEPENDENCY, "missing: " + ", ".join(missing) + " (in the job's namespace)", ctx.generation)
        ctx.after(MISSING_RECHECK_SECONDS)
        return Verdict.BLOCKED
    if is_true(ctx.status.conditions, ConditionType.INVALID):
        ctx.condition(ConditionType.INVALID, False, Reason.SPEC_VALID, "the spec is valid again")
        ctx.event(Reason.SPEC_VALID, "the spec is valid again")
        ctx.status.phase = Phase.PENDING
    return Verdict.CONTINUE
