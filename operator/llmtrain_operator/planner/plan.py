"""``plan(job, observed, now) -> Plan``: the operator's every decision, as a pure
function. Table-tested in tests/test_planner.py; used by the kopf handlers and by the
local runner alike."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api.job import LLMTrainJob, SpecInvalid, parse_job
from ..api.observed import Observed
from ..api.status import LLMTrainJobStatus
from . import children, failures, lifecycle, summary
from .context import DeletePod, Pass, Plan


def _status(raw: Any) -> LLMTrainJobStatus:
    try:
        return LLMTrainJobStatus.model_validate(raw or {})
    except ValidationError:
        # A status we cannot read (hand-edited, older version) must not wedge the job;
        # keep the counters we can still find so that the budget is never reset.
        fresh = LLMTrainJobStatus()
        if isinstance(raw, dict):
            for key in ("restarts", "disruptions", "restartGeneration", "step"):
                if isinstance(raw.get(key), int):
                    setattr(fresh, {"restartGeneration": "restart_generation"}.get(key, key), raw[key])
        return fresh


def plan(raw: dict[str, Any], observed: Observed, now: datetime) -> Plan:
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
        _invalid(ctx, "InvalidSpec", "; ".join(str(e) for e in err.errors), generation)
        return _done(ctx)
    ctx = Pass(job=job, observed=observed, now=now, status=status)
    _run(ctx)
    return _done(ctx)


def _invalid(ctx: Pass, reason: str, message: str, generation: int | None) -> None:
    from .conditions import set_condition  # noqa: PLC0415

    ctx.status.phase = "Invalid"
    if set_condition(ctx.status.conditions, "Invalid", True, reason, message, ctx.stamp, generation):
        ctx.event(reason, message, warning=True)


def _run(ctx: Pass) -> None:
    lifecycle.account_time(ctx)
    if lifecycle.handle_terminal(ctx):
        return
    if ctx.observed.missing:
        _invalid(ctx, "MissingDependency", "missing: " + ", ".join(ctx.observed.missing) + " (in the job's namespace)", ctx.generation)
        ctx.after(30)
        return
    lifecycle.clear_invalid(ctx)
    if lifecycle.handle_suspend(ctx):
        return
    if lifecycle.handle_deadline(ctx):
        return
    summary.absorb_probes(ctx)
    if _succeeded(ctx):
        return
    for step in (failures.handle_pod_failures, failures.handle_node_failures, failures.handle_in_place_restarts):
        if step(ctx):
            return
    children.ensure_infrastructure(ctx)
    children.reconcile_workers(ctx)
    summary.summarise(ctx)
    failures.handle_wedge(ctx)


def _succeeded(ctx: Pass) -> bool:
    """Training is done when a worker exited 0 and no worker is still running."""
    workers = ctx.observed.workers()
    if not any(p.phase == "Succeeded" for p in workers):
        return False
    if any(p.active for p in workers):
        ctx.after(5)
        return False
    builtin = ctx.spec.trainer.builtin
    if builtin is not None:
        ctx.status.step = max(ctx.status.step, builtin.max_steps)
    lifecycle.finish(ctx, True, "Completed", f"training finished at step {ctx.status.step}")
    if ctx.spec.ttl_seconds_after_finished is not None:
        ctx.after(ctx.spec.ttl_seconds_after_finished)
    return True


def _done(ctx: Pass) -> Plan:
    requeue = min(ctx.timers) if ctx.timers else None
    return Plan(_dedupe(ctx.actions), ctx.events, ctx.status.to_wire(), requeue, ctx.decisions)


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
