"""``plan(job, observed, now) -> Plan``: the operator's every decision, as a pure
function. Table-tested in tests/test_planner.py; used by the kopf handlers and by the
local runner alike.

A pass runs the policies in order; each returns a ``Verdict``, and anything but
CONTINUE ends the pass (the job finished, is suspended, or waits on a missing object).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api.job import SpecInvalid, parse_job
from ..api.observed import Observed
from ..api.status import LLMTrainJobStatus, migrate
from ..api.vocabulary import Reason
from .context import DeletePod, Pass, Plan, Verdict
from ..settings import DEFAULT_RUNTIME_IMAGE
from .policies import (
    checkpoints,
    children,
    completion,
    deadline,
    gang,
    in_place,
    node_failures,
    numerics,
    pod_failures,
    progress,
    queueing,
    stragglers,
    summary,
    suspension,
    terminal,
    validity,
    wedge,
)
from .timekeeping import account_time

POLICIES = (
    terminal.handle,       # a finished job: only stragglers and the TTL
    validity.handle,       # a missing Secret/PVC blocks; a fixed spec clears Invalid
    queueing.handle,       # a Kueue-queued job runs while its Workload is admitted
    suspension.handle,
    deadline.handle,
    progress.handle,       # step, world size, newest checkpoint, end of a recovery
    numerics.handle,       # rollbacks for bad numerics and the samples they skipped
    checkpoints.handle,    # tier health, the interval in force, the failure history for auto
                           # (before completion: a finished job's final commits count too)
    completion.handle,
    pod_failures.handle,
    node_failures.handle,
    in_place.handle,
    stragglers.handle,     # report (or replace) a rank that stays slower than the others
    gang.handle,           # the PodGroup a gang's worker pods wait for
    children.handle,       # create what is missing (after the failures were handled)
    summary.handle,        # counts, phase, conditions
    wedge.handle,          # the backstop: no progress for progressTimeoutSeconds
)

SALVAGED = {"restarts": "restarts", "disruptions": "disruptions", "restartGeneration": "restart_generation", "step": "step"}
"""Counters kept from a status that cannot be read, so that the budget is never reset."""


def _status(raw: Any) -> LLMTrainJobStatus:
    try:
        return LLMTrainJobStatus.model_validate(migrate(raw) if isinstance(raw, dict) else (raw or {}))
    except ValidationError:
        # A status we cannot read (hand-edited, from an unknown version) must not wedge
        # the job; keep the counters we can still find so that the budget is never reset.
        fresh = LLMTrainJobStatus()
        if isinstance(raw, dict):
            for key, attr in SALVAGED.items():
                if isinstance(raw.get(key), int):
                    setattr(fresh, attr, raw[key])
        return fresh


def plan(raw: dict[str, Any], observed: Observed, now: datetime, runtime_image: str = DEFAULT_RUNTIME_IMAGE) -> Plan:
    """``runtime_image``: the operator's setting of that name (``manifests.runtime_bundle``)."""
    status = _status(raw.get("status"))
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
    if meta.get("deletionTimestamp"):
        return Plan([], [], status.to_wire(), None)
    try:
        job = parse_job({**raw, "status": None})
    except SpecInvalid as err:
        ctx = Pass(job=None, observed=observed, now=now, status=status)  # type: ignore[arg-type]
        # Even metadata may be garbage here; only a real integer is echoed back.
        generation = meta.get("generation") if type(meta.get("generation")) is int else None
        ctx.status.observed_generation = generation
        validity.mark_invalid(ctx, Reason.INVALID_SPEC, "; ".join(str(e) for e in err.errors), generation)
        return _done(ctx)
    ctx = Pass(job=job, observed=observed, now=now, status=status, runtime_image=runtime_image)
    account_time(ctx)
    for policy in POLICIES:
        if policy(ctx) is not Verdict.CONTINUE:
            break
    return _done(ctx)


def _done(ctx: Pass) -> Plan:
    requeue = min(ctx.timers) if ctx.timers else None
    return Plan(_dedupe(ctx.actions), ctx.decisions, ctx.status.to_wire(), requeue)


def _dedupe(actions: list) -> list:
    """Several concerns may ask to delete the same pod; one request each (a forced one
    wins, since it is what a dead node needs)."""
    out: list = []
    deletes: dict[str, int] = {}
    for action in actions:
        if isinstance(action, DeletePod):
            if action.name in deletes:
                if action.force:
                    out[deletes[action.name]] = action
                continue
            deletes[action.name] = len(out)
        out.append(action)
    return out
