"""Failed worker pods kept for their logs (``faultTolerance.keepFailedPods``), as a Job
keeps its failed pods: a failed pod whose failure was handled is labelled kept
(``outcome.retire``) instead of deleted, its slot takes a new pod under a new name, and
here the oldest kept pods beyond the limit are deleted and the rest listed in
``status.keptPods``, newest first."""

from __future__ import annotations

from ..accounting import unhandled_kept
from ..context import DeletePod, Pass, Verdict


def handle(ctx: Pass) -> Verdict:
    """First in every pass (a finished job's list stays true too). A pod labelled kept
    that this operator never handled is left to ``pod_failures`` (charged there, listed
    from the next pass on)."""
    foreign = {p.name for p in unhandled_kept(ctx)}
    kept = [p for p in ctx.observed.kept_workers() if not p.deleting and p.name not in foreign]
    limit = ctx.spec.fault_tolerance.keep_failed_pods
    for pod in kept[limit:]:
        ctx.actions.append(DeletePod(pod.name))
    ctx.status.kept_pods = [p.name for p in kept[:limit]]
    return Verdict.CONTINUE
