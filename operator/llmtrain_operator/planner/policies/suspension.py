"""``spec.suspend`` (or Kueue holding a queued job, ``policies/queueing.py``): delete
every pod (the store too) but the failed ones kept for their logs, which hold nothing;
keep status and checkpoints; unsuspending recreates them and training resumes from the
newest checkpoint."""

from __future__ import annotations

from ...api.vocabulary import ConditionType, Phase, Reason
from ..conditions import is_true
from .. import backoff
from ..context import Pass, Verdict
from ..outcome import stop_pods
from ..podgroup import release as release_pod_group
from ..queue import Admission


def handle(ctx: Pass, admission: Admission) -> Verdict:
    """``admission``: what the queue decided in this pass (``policies/queueing.py``)."""
    status = ctx.status
    why = admission.hold or "spec.suspend is true"
    if admission.suspends(ctx.job):
        stop_pods(ctx, include_finished=True)
        release_pod_group(ctx, "the job is suspended")
        if status.phase != Phase.SUSPENDED:
            status.phase = Phase.SUSPENDED
            ckpt = ctx.spec.checkpoint
            durable = ckpt.shared is not None or ckpt.s3 is not None or ckpt.local.host_path is not None
            if admission.hold is not None and not ctx.observed.pods:
                ctx.event(Reason.SUSPENDED, f"suspended: {why}")  # queued before it ever ran
            elif ckpt.enabled and not durable:
                ctx.event(Reason.SUSPENDED, f"suspended ({why}): pods deleted; checkpoints were only on the pods' emptyDir "
                          "volumes and are lost, so the job will resume from step 0 (configure checkpoint.shared, "
                          "checkpoint.s3 or checkpoint.local.hostPath to keep them)", warning=True)
            else:
                ctx.event(Reason.SUSPENDED, "suspended: pods deleted, status and checkpoints kept")
        ctx.condition(ConditionType.SUSPENDED, True, Reason.JOB_SUSPENDED, why)
        ctx.condition(ConditionType.RUNNING, False, Reason.JOB_SUSPENDED, "")
        ctx.condition(ConditionType.DEGRADED, False, Reason.JOB_SUSPENDED, "")
        ctx.condition(ConditionType.RESTARTING, False, Reason.JOB_SUSPENDED, "")
        status.replicas.desired = status.replicas.ready = status.replicas.active = 0
        status.workers = "0/0"
        return Verdict.SUSPENDED
    if status.phase == Phase.SUSPENDED or is_true(status.conditions, ConditionType.SUSPENDED):
        ctx.condition(ConditionType.SUSPENDED, False, Reason.JOB_RESUMED,
                      "admitted by Kueue" if admission.admitted else "spec.suspend is false")
        ctx.event(Reason.RESUMED, "resumed: recreating pods; training continues from the newest checkpoint")
        status.phase = Phase.PENDING
        backoff.clear(ctx)
        status.last_progress_time = ctx.stamp
    return Verdict.CONTINUE
