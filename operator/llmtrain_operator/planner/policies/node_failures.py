"""Failed nodes: pods on a node NotReady/Unknown for longer than
``nodeFailureGraceSeconds``, or on a Node object that is gone, are force-deleted (the
kubelet cannot confirm anything), the node is quarantined for this job, and the failure is
charged once per node episode.

Unless the node's zone is disrupted: when most of a zone's nodes are NotReady at once,
the likely cause is the control plane or the network (an API server that restarted, a
controller-manager that could not see the kubelets' heartbeats), not every node at once.
The node lifecycle controller stops evicting in such a zone (its unhealthy-zone rule:
every node NotReady, or more than 2 and at least 55 % of them); so does this policy: the
pods are kept and condition ``NodesDisrupted`` says why. A node still NotReady once its
zone is healthy again is a failure as before (its grace counted from its own NotReady
transition). A deleted Node object is never a disruption."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from ...api.observed import NodeView, PodView
from ...api.vocabulary import ConditionType, FailureKind, Reason
from ..accounting import charged, forget_healed_nodes, node_key, pod_key, record_failure, remember
from ..budget import count_restart
from ..context import DeletePod, Pass, Verdict
from ..quarantine import quarantine
from .. import node_history


UNHEALTHY_ZONE_THRESHOLD = 0.55
"""The node lifecycle controller's ``--unhealthy-zone-threshold`` default."""
DISRUPTION_RECHECK_SECONDS = 5.0


def disrupted_zones(nodes: Iterable[NodeView]) -> dict[str, tuple[int, int]]:
    """Zone -> (NotReady nodes, nodes) for each zone in the node lifecycle controller's
    full or partial disruption: every node NotReady, or more than 2 and at least 55 %."""
    counts: dict[str, list[int]] = {}
    for node in nodes:
        count = counts.setdefault(node.zone, [0, 0])
        count[0] += node.failed
        count[1] += 1
    return {zone: (bad, total) for zone, (bad, total) in counts.items()
            if bad and (bad == total or (bad > 2 and bad / total >= UNHEALTHY_ZONE_THRESHOLD))}


def handle(ctx: Pass) -> Verdict:
    grace = ctx.spec.fault_tolerance.node_failure_grace_seconds
    forget_healed_nodes(ctx)
    disrupted = disrupted_zones(ctx.observed.nodes.values())
    held: set[str] = set()
    failed_nodes: dict[str, list[PodView]] = {}
    for pod in ctx.observed.workers():
        if pod.node is None or pod.terminated:
            continue
        node = ctx.observed.nodes.get(pod.node)
        if node is not None and not node.failed:
            continue
        if node is not None and node.zone in disrupted:
            held.add(node.zone)
            continue
        since = _failed_since(ctx, pod, node, grace)
        elapsed = (ctx.now - since).total_seconds() if since else grace
        if elapsed < grace:
            ctx.after(grace - elapsed, urgent=True)  # the grace's end acts on the failure
            continue
        failed_nodes.setdefault(pod.node, []).append(pod)
    store = ctx.observed.store()
    if store is not None and store.node is not None and not store.terminated:
        node = ctx.observed.nodes.get(store.node)
        since = _failed_since(ctx, store, node, grace)
        if node is not None and node.failed and node.zone in disrupted:
            held.add(node.zone)
        elif (node is None or node.failed) and (since is None or (ctx.now - since).total_seconds() >= grace):
            ctx.actions.append(DeletePod(store.name, grace_seconds=0, force=True))
            ctx.event(Reason.STORE_RESTARTED, f"the rendezvous store's node {store.node} failed; recreating the store elsewhere",
                      warning=True)
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
        # A flapping node: this episode merges with the one charged before (node_history.py).
        if node_history.note(ctx, node_name, not_ready=True).merged:
            ctx.event(Reason.NODE_FAILURE, f"node {node_name} is {what} again within "
                      f"{ctx.spec.fault_tolerance.node_failure_window_seconds}s: force-deleting {names}, the same episode, "
                      "not charged again", warning=True)
            continue
        ctx.event(Reason.NODE_FAILURE, f"node {node_name} is {what}: force-deleting {names} "
                  f"and keeping this job off the node{loss_words(ctx, failed_nodes)}", warning=True)
        if not count_restart(ctx, Reason.NODE_FAILURE, [p.slot for p in pods]):
            return Verdict.FINISHED
    _report_disruption(ctx, {zone: disrupted[zone] for zone in held})
    return Verdict.CONTINUE


def loss_words(ctx: Pass, failed_nodes: dict[str, list[PodView]]) -> str:
    """What the job's other pods do about its lost pods. Under in-process healing, when
    fewer pods than ``replicas.min`` are left, their ranks keep their processes and wait
    for the replacements, which take the lost pods' seats and get the state from them
    (``torchrun_agent.take_offered_seats``); with enough left, torchrun re-forms the job
    without them, as without healing."""
    spec = ctx.spec
    lost = {p.name for pods in failed_nodes.values() for p in pods}
    left = sum(1 for p in ctx.observed.workers() if p.name not in lost and p.active)
    if spec.fault_tolerance.in_process_healing and left < spec.replicas.min:
        return ("; the other pods' ranks keep their processes and wait up to collectiveTimeoutSeconds "
                f"({spec.fault_tolerance.collective_timeout_seconds}s) for the replacement to heal from them")
    return ""


def _report_disruption(ctx: Pass, held: dict[str, tuple[int, int]]) -> None:
    if held:
        zones = "; ".join(f"{bad} of {total} nodes NotReady in zone {zone or '(none)'}" for zone, (bad, total) in sorted(held.items()))
        message = (f"{zones}: most likely the control plane or the network, not the nodes; the job's pods on them are "
                   "kept (a node still NotReady once its zone is healthy again is a node failure)")
        if ctx.condition(ConditionType.NODES_DISRUPTED, True, Reason.ZONE_DISRUPTED, message):
            ctx.event(Reason.ZONE_DISRUPTED, message, warning=True)
        ctx.after(DISRUPTION_RECHECK_SECONDS)
    elif any(c.type == ConditionType.NODES_DISRUPTED and c.status == "True" for c in ctx.status.conditions):
        ctx.condition(ConditionType.NODES_DISRUPTED, False, Reason.NODES_REACHABLE, "")


def _failed_since(ctx: Pass, pod: PodView, node: NodeView | None, grace: int) -> datetime | None:
    """When the node of ``pod`` failed, as far as the grace is concerned (None: long ago)."""
    if node is not None:
        return node.since
    # A Node object that is gone (``kubectl delete node``, a scaled-down group) fails its
    # pods at once, unless the pod is younger than the grace: the node watch may simply
    # not have delivered a brand-new node yet.
    born = pod.started or pod.created
    return born if born is not None and (ctx.now - born).total_seconds() < grace else None
