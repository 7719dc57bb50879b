"""Summarise the observed state into status: counts, trainer progress, phase and
conditions."""

from __future__ import annotations

from ..api.status import CheckpointRecord
from .context import Pass

TIER_DURABILITY = {"local": 0, "shared": 1, "s3": 2}
PROBE_INTERVAL_SECONDS = 10.0
"""How often a running job is re-read, to refresh step, checkpoint and the wedge check."""


def absorb_probes(ctx: Pass) -> None:
    """Step, world size and the newest checkpoint, from the workers' metrics."""
    status = ctx.status
    probes = [ctx.observed.probes[p.name] for p in ctx.observed.workers() if p.name in ctx.observed.probes]
    steps = [p.step for p in probes if p.step is not None]
    if steps and max(steps) > status.step:
        status.step = max(steps)
        status.last_progress_time = ctx.stamp
    _recovery(ctx, [p.last_step_time for p in probes if p.last_step_time])
    worlds = [p.world_size for p in probes if p.world_size]
    if worlds:
        status.world_size = max(worlds)
    best: tuple[int, int, str] | None = None
    for probe in probes:
        for tier, step in probe.last_checkpoint.items():
            candidate = (step, TIER_DURABILITY.get(tier, 0), tier)
            if best is None or candidate > best:
                best = candidate
    current = status.last_checkpoint
    if best is not None and (current is None or (best[0], TIER_DURABILITY.get(best[2], 0)) > (current.step, TIER_DURABILITY.get(current.tier, 0))):
        status.last_checkpoint = CheckpointRecord(step=best[0], tier=best[2], time=ctx.stamp, summary=f"{best[0]}@{best[2]}")


READINESS_GRACE_SECONDS = 10.0
"""Workers that stop answering without a detected failure (finishing, a slow probe)
keep the job Running this long before it is reported Restarting."""


def _within_readiness_grace(ctx: Pass) -> bool:
    status = ctx.status
    if status.not_ready_since is None:
        status.not_ready_since = ctx.stamp
    waited = ctx.seconds_since(status.not_ready_since) or 0.0
    if waited < READINESS_GRACE_SECONDS:
        ctx.after(READINESS_GRACE_SECONDS - waited)
        return True
    return False


def _recovery(ctx: Pass, step_times: list[float]) -> None:
    """Recovery ends with the first training step finished after the failure was
    detected (DESIGN: failure -> first new step), as timed by the trainer itself."""
    status = ctx.status
    if status.last_failure is None or status.last_recovery_seconds is not None or not step_times:
        return
    from ..api.observed import parse_time  # noqa: PLC0415

    detected = parse_time(status.last_failure.time)
    newest = max(step_times)
    if detected is not None and newest > detected.timestamp():
        status.last_recovery_seconds = round(newest - detected.timestamp(), 3)


def summarise(ctx: Pass) -> None:
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
    in_backoff = bool(status.next_restart_time) and (ctx.seconds_since(status.next_restart_time) or 0) < 0
    since_failure = ctx.seconds_since(status.last_failure.time) if status.last_failure is not None else None
    failed_recently = since_failure is not None and since_failure < 30 and status.last_recovery_seconds is None
    if ready >= spec.replicas.min and ready > 0:
        phase = "Running"
        status.not_ready_since = None
    elif previous == "Running" and not failed_recently and _within_readiness_grace(ctx):
        phase = "Running"  # e.g. the final checkpoint, or a probe that missed once
    elif previous in ("Running", "Restarting") or status.restarts or status.disruptions or in_backoff:
        phase = "Restarting"
    elif active or ctx.observed.workers() or any(
        getattr(a, "kind", None) == "Pod" for a in ctx.actions
    ):
        phase = "Created"
    else:
        phase = "Pending"
    status.phase = phase
    ctx.condition("Created", True, "ChildrenCreated", "workers, rendezvous store, services and config exist")
    running_msg = f"{ready}/{spec.replicas.max} workers ready (min {spec.replicas.min}), world size {status.world_size}"
    ctx.condition("Running", phase == "Running", "Training" if phase == "Running" else "NotEnoughWorkers", running_msg)
    ctx.condition("Restarting", phase == "Restarting", "RecoveringFromFailure" if phase == "Restarting" else "Stable",
                  status.last_failure.reason if status.last_failure and phase == "Restarting" else "")
    degraded = phase in ("Running", "Restarting") and ready < spec.replicas.max
    ctx.condition("Degraded", degraded, "ReducedWorldSize" if degraded else "FullSize",
                  f"training with {ready} of {spec.replicas.max} nodes" if degraded else "")
    ctx.condition("Invalid", False, "SpecValid", "")
    if phase != previous:
        ctx.event(phase, f"{previous} -> {phase}: {running_msg}", warning=phase == "Restarting")
    if phase in ("Running", "Restarting", "Created"):
        ctx.after(PROBE_INTERVAL_SECONDS)
