"""Failed nodes: pods on a node NotReady/Unknown for longer than
``nodeFailureGraceSeconds``, or on a Node object that is gone, are force-deleted (the
kubelet cannot confirm anything), the node is quarantined for this job, and the failure is
charged once per node episode."""

from __future__ import annotations

from datetime import datetime

from ...api.observed import NodeView, PodView
from ...api.vocabulary import FailureKind, Reason
from ..accounting import charged, forget_healed_nodes, node_key, pod_key, record_failure, remember
from ..budget import count_restart
from ..context import DeletePod, Pass, Verdict
from ..quarantine import quarantine


def handle(ctx: Pass) -> Verdict:
    grace = ctx.spec.fault_tolerance.node_failure_grace_seconds
    forget_healed_nodes(ctx)
    failed_nodes: dict[str, list[PodView]] = {}
    for pod in ctx.observed.workers():
        if pod.node is None or pod.terminated:
            continue
        node = ctx.observed.nodes.get(pod.node)
        if node is not None and not node.failed:
            continue
        since = _failed_since(ctx, pod, node, grace)
        elapsed = (ctx.now - since).total_seconds() if since else grace
        if elapsed < grace:
            ctx.after(grace - elapsed)
            continue
        failed_nodes.setdefault(pod.node, []).append(pod)
    store = ctx.observed.store()
    if store is not None and store.node is not None and not store.terminated:
        node = ctx.observed.nodes.get(store.node)
        since = _failed_since(ctx, store, node, grace)
        if (node is None or node.failed) and (since is None or (ctx.now - since).total_seconds() >= grace):
            ctx.actions.append(DeletePod(store.name, grace_seconds=0, force=True))
            ctx.event(Reason.STORE_RESTARTED, f"the rendezvous store's node {store.node} failed; recreating the store elsewhere", warning=True)
    for node_name, pods in failed_nodes.items():
        names = ", ".join(p.name for p in pods)
        for pod in pods:
            ctx.actions.append(DeletePod(pod.name, grace_seconds=0, force=True))
        # One charge per node failure: new only if this episode of the node was not
        # charged yet and it took a pod not charged yet (a pod lost with the node is
        # never charged again, as a node failure or as a pod failure).
        key = node_key(ctx, node_name)
        fresh = not charged(ctx, key) and any(not charged(ctx, pod_key(p)) for p in pods)
        remember(ctx, key, *(pod_key(p) for p in pods))
        if not fresh:
            continue  # only the force-deletes are repeated, until the pods are gone
        quarantine(ctx, node_name)
        node_view = ctx.observed.nodes.get(node_name)
        what = f"NotReady/unreachable for more than {grace}s" if node_view is not None else "gone (its Node object was deleted)"
        record_failure(ctx, FailureKind.NODE_FAILURE, Reason.NODE_NOT_READY, pods[0], node=node_name,
                       message=f"node {node_name} is {what}",
                       since=node_view.since if node_view is not None else None)
        ctx.event(Reason.NODE_FAILURE, f"node {node_name} is {what}: force-deleting {names} "
                  "and keeping this job off the node", warning=True)
        if not count_restart(ctx, Reason.NODE_FAILURE):
            return Verdict.FINISHED
    return Verdict.CONTINUE


def _failed_since(ctx: Pass, pod: PodView, node: NodeView | None, grace: int) -> datetime | None:
    """When the node of ``pod`` failed, as far as the grace is concerned (None: long ago)."""
    if node is not None:
        return node.since
    # A Node object that is gone (``kubectl delete node``, a scaled-down group) fails its
    # pods at once, unless the pod is younger than the grace: the node watch may simply
    # not have delivered a brand-new node yet.
    born = pod.started or pod.created
    return born if born is not None and (ctx.now - born).total_seconds() < grace else None
