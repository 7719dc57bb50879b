"""Failed worker pods kept for their logs (``faultTolerance.keepFailedPods``), as a Job
keeps its failed pods: a failed pod whose failure was handled is labelled kept
(``outcome.retire``) instead of deleted, its slot takes a new pod under a new name, and
here the oldest kept pods beyond the limit are deleted and the rest listed in
``status.keptPods``, newest first."""

from __future__ import annotations

from ..context import DeletePod, Pass, Verdict


def handle(ctx: Pass) -> Verdict:
    kept = [p for p in ctx.observed.kept_workers() if not p.deleting]
    limit = ctx.spec.fault_tolerance.keep_failed_pods
    for pod in kept[limit:]:
        ctx.actions.append(DeletePod(pod.name))
    ctx.status.kept_pods = [p.name for p in kept[:limit]]
    return Verdict.CONTINUE
