"""Pods a deleted job leaves Terminating on a dead node.

Deleting a job lets the garbage collector delete its pods, but a pod on a node whose
kubelet no longer answers stays ``Terminating`` until that kubelet comes back: only the
kubelet confirms a graceful deletion (Kubernetes' rule; Kubeflow's trainer has the same
gap, kubeflow/trainer#2072). While the job lives, the planner force-deletes such pods
after ``nodeFailureGraceSeconds``; once the job is gone there is no spec and no pass, so
the operator sweeps them here: a pod whose job is gone (or being deleted), whose own
deletion was asked, and whose node has been not Ready for ``STRANDED_GRACE_SECONDS`` (or
whose Node object is gone) is force-deleted. The node controller marks a node not Ready
only after its kubelet missed heartbeats for the node monitor's grace period (40-50 s
by default), so the extra grace is short. No finalizer: deleting a job never waits on
the operator, which may be gone for good.
"""

from __future__ import annotations

from datetime import datetime

from ..api.observed import NodeView, PodView

STRANDED_GRACE_SECONDS = 10.0


def stranded(pods: list[PodView], nodes: dict[str, NodeView], now: datetime,
             grace: float = STRANDED_GRACE_SECONDS) -> list[PodView]:
    """The pods of a job that is gone to force-delete now."""
    out = []
    for pod in pods:
        if not pod.deleting or not pod.node:
            continue
        node = nodes.get(pod.node)
        if node is None:
            out.append(pod)  # its Node object is gone: no kubelet will ever confirm
            continue
        if node.failed and node.since is not None and (now - node.since).total_seconds() >= grace:
            out.append(pod)
    return out
