"""Job-level lifecycle: invalid specs, finished jobs and their TTL, suspend/resume,
the active deadline, and time accounting."""

from __future__ import annotations

from ..api.observed import parse_time
from .context import DeleteJob, DeletePod, Pass

TERMINAL = ("Succeeded", "Failed")


def account_time(ctx: Pass) -> None:
    """Advance active and productive seconds by the time since the last pass."""
    status = ctx.status
    if status.start_time is None:
        status.start_time = ctx.stamp
    elapsed = ctx.seconds_since(status.last_reconcile_time)
    status.last_reconcile_time = ctx.stamp
    if elapsed is None or elapsed <= 0 or status.phase in ("Suspended", *TERMINAL):
        return
    status.active_seconds += elapsed
    if status.phase == "Running":
        status.productive_seconds += elapsed
    if status.active_seconds > 0:
        status.goodput = round(min(1.0, status.productive_seconds / status.active_seconds), 4)


def mark_invalid(ctx: Pass, reason: str, message: str) -> None:
    ctx.status.phase = "Invalid"
    if ctx.condition("Invalid", True, reason, message) or not ctx.events:
        ctx.event(reason, message, warning=True)


def clear_invalid(ctx: Pass) -> None:
    if any(c.type == "Invalid" and c.status == "True" for c in ctx.status.conditions):
        ctx.condition("Invalid", False, "SpecValid", "the spec is valid again")
        ctx.event("SpecValid", "the spec is valid again")
        ctx.status.phase = "Pending"


def finish(ctx: Pass, succeeded: bool, reason: str, message: str) -> None:
    """Enter a terminal phase: stop what still runs, keep finished pods for their logs."""
    status = ctx.status
    status.phase = "Succeeded" if succeeded else "Failed"
    status.completion_time = ctx.stamp
    # Nothing trains any more (a success needs every worker finished; a failure stops
    # the rest): the counts say so, not whatever the last running pass saw.
    status.replicas.ready = status.replicas.active = 0
    status.workers = f"0/{status.replicas.desired or ctx.spec.replicas.max}"
    ctx.condition("Succeeded" if succeeded else "Failed", True, reason, message)
    for other in ("Running", "Restarting", "Degraded"):
        ctx.condition(other, False, reason, message)
    ctx.event(reason, message, warning=not succeeded)
    stop_pods(ctx, include_finished=False)


def stop_pods(ctx: Pass, include_finished: bool) -> None:
    for pod in ctx.observed.pods:
        if pod.deleting:
            continue
        if include_finished or pod.active:
            ctx.actions.append(DeletePod(pod.name))


def handle_terminal(ctx: Pass) -> bool:
    """A finished job: clean up stragglers and apply ``ttlSecondsAfterFinished``."""
    if ctx.status.phase not in TERMINAL:
        return False
    stop_pods(ctx, include_finished=False)
    ttl = ctx.spec.ttl_seconds_after_finished
    if ttl is not None:
        done = parse_time(ctx.status.completion_time) or ctx.now
        left = ttl - (ctx.now - done).total_seconds()
        if left <= 0:
            ctx.actions.append(DeleteJob("TTLExpired"))
            ctx.event("TTLExpired", f"deleting the job {ttl}s after it finished")
        else:
            ctx.after(left)
    return True


def handle_suspend(ctx: Pass) -> bool:
    status = ctx.status
    if ctx.spec.suspend:
        stop_pods(ctx, include_finished=True)
        if status.phase != "Suspended":
            status.phase = "Suspended"
            ckpt = ctx.spec.checkpoint
            durable = ckpt.shared is not None or ckpt.s3 is not None or ckpt.local.host_path is not None
            if ckpt.enabled and not durable:
                ctx.event("Suspended", "suspended: pods deleted; checkpoints were only on the pods' emptyDir "
                          "volumes and are lost, so the job will resume from step 0 (configure checkpoint.shared, "
                          "checkpoint.s3 or checkpoint.local.hostPath to keep them)", warning=True)
            else:
                ctx.event("Suspended", "suspended: pods deleted, status and checkpoints kept")
        ctx.condition("Suspended", True, "JobSuspended", "spec.suspend is true")
        ctx.condition("Running", False, "JobSuspended", "")
        ctx.condition("Degraded", False, "JobSuspended", "")
        ctx.condition("Restarting", False, "JobSuspended", "")
        status.replicas.desired = status.replicas.ready = status.replicas.active = 0
        status.workers = "0/0"
        return True
    if status.phase == "Suspended" or any(c.type == "Suspended" and c.status == "True" for c in status.conditions):
        ctx.condition("Suspended", False, "JobResumed", "spec.suspend is false")
        ctx.event("Resumed", "resumed: recreating pods; training continues from the newest checkpoint")
        status.phase = "Pending"
        status.next_restart_time = None
        status.last_progress_time = ctx.stamp
    return False


def handle_deadline(ctx: Pass) -> bool:
    deadline = ctx.spec.active_deadline_seconds
    if deadline is None:
        return False
    left = deadline - ctx.status.active_seconds
    if left <= 0:
        from .failures import record_failure  # noqa: PLC0415

        record_failure(ctx, "Deadline", "DeadlineExceeded", message=f"activeDeadlineSeconds={deadline} exceeded")
        finish(ctx, False, "DeadlineExceeded", f"the job ran longer than activeDeadlineSeconds={deadline}")
        return True
    ctx.after(left)
    return False
