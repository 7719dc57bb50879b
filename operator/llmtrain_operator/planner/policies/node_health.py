"""Health signals before a failure: a node that a health agent reports sick is drained
of the job's pods before a rank fails there.

Two signals, on a node that runs one of the job's workers:
- a node condition True whose type the operator is told counts as a failure
  (``LLMTRAIN_OPERATOR_NODE_FAILURE_CONDITIONS``; node-problem-detector's
  ``KernelDeadlock`` and ``ReadonlyFilesystem`` by default, a GPU health agent's types
  added by the cluster's admin);
- for a job that asks for ``nvidia.com/gpu``: some of the node's GPUs out of allocatable
  (more than none, fewer than capacity). NVIDIA's device plugin takes a GPU it finds
  unhealthy (an XID error) out, and a rank on it is likely next; a plugin restarting
  reports none for a moment, which is not taken for a fault.

The worker is deleted gracefully: SIGTERM reaches the trainer, which saves its emergency
checkpoint within ``sigtermBudgetSeconds`` (at most the step in flight is lost), and the
replacement avoids the node (quarantined for the job). A disruption, not a restart: no
rank failed. Once per pod; a node still sick keeps new workers away by the quarantine."""

from __future__ import annotations

from ...api.observed import NodeView
from ...api.vocabulary import FailureKind, Reason
from ..accounting import charged, record_failure, remember
from ..context import DeletePod, Pass, Verdict
from ..decisions import DisruptionCounted
from ..quarantine import quarantine
from ..manifests import asks_for_gpus


def sickness(node: NodeView, failure_conditions: frozenset[str], uses_gpus: bool = True) -> str | None:
    """Why ``node`` counts as failing, in words; None while it is healthy. A GPU taken out
    of allocatable matters only to a job that uses GPUs."""
    bad = [c for c in node.problems if c in failure_conditions]
    if bad:
        return f"reports {', '.join(bad)}"
    if not uses_gpus:
        return None
    capacity, allocatable = node.gpu_capacity, node.gpu_allocatable
    # Some GPUs out, not all: the device plugin marks a faulty GPU unhealthy one by one,
    # while a plugin restarting reports none for a moment (not a fault).
    if capacity is not None and allocatable is not None and 0 < allocatable < capacity:
        return f"has {allocatable} of its {capacity} nvidia.com/gpu allocatable (a GPU taken out as unhealthy)"
    return None


def handle(ctx: Pass) -> Verdict:
    uses_gpus = asks_for_gpus(ctx.spec)
    for pod in ctx.observed.workers():
        if not pod.active or not pod.node:
            continue
        node = ctx.observed.nodes.get(pod.node)
        why = sickness(node, ctx.node_failure_conditions, uses_gpus) if node is not None else None
        key = f"health:{pod.uid or pod.name}"
        if why is None or charged(ctx, key):
            continue
        remember(ctx, key)
        quarantine(ctx, pod.node)
        ctx.status.disruptions += 1
        ctx.decide(DisruptionCounted(pod.name, Reason.NODE_UNHEALTHY))
        message = f"node {pod.node} {why}"
        record_failure(ctx, FailureKind.EVICTION, Reason.NODE_UNHEALTHY, pod, node=pod.node, message=message, since=ctx.now)
        ctx.event(Reason.NODE_UNHEALTHY, f"{message}: draining pod {pod.name} (its ranks save an emergency checkpoint) "
                  "and keeping this job off the node; not counted as a restart", warning=True)
        ctx.actions.append(DeletePod(pod.name))
    return Verdict.CONTINUE
