"""Summarise the observed state into status: counts, phase and conditions."""

from __future__ import annotations

from ...api.vocabulary import ConditionType, Phase, Reason
from ..context import CreateObject, Pass, Verdict
from ..decisions import PhaseChanged

PROBE_INTERVAL_SECONDS = 10.0
"""How often a running job is re-read, to refresh step, checkpoint and the wedge check."""
READINESS_GRACE_SECONDS = 10.0
"""Workers that stop answering without a detected failure (finishing, a slow probe)
keep the job Running this long before it is reported Restarting."""
RECENT_FAILURE_SECONDS = 30.0
"""A failure this recent, not yet recovered from, ends the readiness grace at once."""


def _within_readiness_grace(ctx: Pass) -> bool:
    book = ctx.status.internal
    if book.not_ready_since is None:
        book.not_ready_since = ctx.stamp
    waited = ctx.seconds_since(book.not_ready_since) or 0.0
    if waited < READINESS_GRACE_SECONDS:
        ctx.after(READINESS_GRACE_SECONDS - waited)
        return True
    return False


def _phase(ctx: Pass, ready: int, active: int) -> Phase:
    spec, status = ctx.spec, ctx.status
    previous = status.phase
    in_backoff = bool(status.next_restart_time) and (ctx.seconds_since(status.next_restart_time) or 0) < 0
    since_failure = ctx.seconds_since(status.last_failure.time) if status.last_failure is not None else None
    failed_recently = since_failure is not None and since_failure < RECENT_FAILURE_SECONDS and status.last_recovery_seconds is None
    if ready >= spec.replicas.min and ready > 0:
        status.internal.not_ready_since = None
        return Phase.RUNNING
    if previous == Phase.RUNNING and not failed_recently and _within_readiness_grace(ctx):
        return Phase.RUNNING  # e.g. the final checkpoint, or a probe that missed once
    if previous in (Phase.RUNNING, Phase.RESTARTING) or status.restarts or status.disruptions or in_backoff:
        return Phase.RESTARTING
    if active or ctx.observed.workers() or any(isinstance(a, CreateObject) and a.kind == "Pod" for a in ctx.actions):
        return Phase.CREATED
    return Phase.PENDING


def handle(ctx: Pass) -> Verdict:
    spec, status = ctx.spec, ctx.status
    workers = [p for p in ctx.observed.workers() if p.generation == status.restart_generation]
    ready = sum(1 for p in workers if p.active and p.ready)
    active = sum(1 for p in workers if p.active)
    status.replicas.desired = spec.replicas.max
    status.replicas.ready = ready
    status.replicas.active = active
    status.workers = f"{ready}/{spec.replicas.max}"
    status.observed_generation = ctx.generation
    previous = status.phase
    phase = _phase(ctx, ready, active)
    status.phase = phase
    ctx.condition(ConditionType.CREATED, True, Reason.CHILDREN_CREATED, "workers, rendezvous store, services and config exist")
    running_msg = f"{ready}/{spec.replicas.max} workers ready (min {spec.replicas.min}), world size {status.world_size}"
    ctx.condition(ConditionType.RUNNING, phase == Phase.RUNNING,
                  Reason.TRAINING if phase == Phase.RUNNING else Reason.NOT_ENOUGH_WORKERS, running_msg)
    restarting = phase == Phase.RESTARTING
    ctx.condition(ConditionType.RESTARTING, restarting, Reason.RECOVERING if restarting else Reason.STABLE,
                  status.last_failure.reason if status.last_failure and restarting else "")
    degraded = phase in (Phase.RUNNING, Phase.RESTARTING) and ready < spec.replicas.max
    ctx.condition(ConditionType.DEGRADED, degraded, Reason.REDUCED_WORLD_SIZE if degraded else Reason.FULL_SIZE,
                  f"training with {ready} of {spec.replicas.max} nodes" if degraded else "")
    if not any(c.type == ConditionType.INVALID for c in status.conditions):
        ctx.condition(ConditionType.INVALID, False, Reason.SPEC_VALID, "")  # else it keeps what cleared it
    if phase != previous:
        ctx.decide(PhaseChanged(previous, phase, running_msg))
    if phase in (Phase.RUNNING, Phase.RESTARTING, Phase.CREATED):
        ctx.after(PROBE_INTERVAL_SECONDS)
    return Verdict.CONTINUE
