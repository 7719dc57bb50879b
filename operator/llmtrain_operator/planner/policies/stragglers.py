"""Stragglers, as the trainers report them: every rank judges every rank's local step
time (``llmtrain_trainer.train.stragglers``), and each node's local rank 0 exports its node's
straggling ranks. A straggler sets the ``Straggler`` condition and emits an Event naming
the rank, the pod and the node, once per pod and rank; with ``action: Replace`` its pod is
also deleted and its node quarantined for this job (a replacement is created elsewhere,
not charged to the restart budget)."""

from __future__ import annotations

from ...api.vocabulary import ConditionType, Reason
from ..accounting import first_sighting
from ..context import DeletePod, Pass, Verdict
from ..quarantine import quarantine



def handle(ctx: Pass) -> Verdict:
    book = ctx.status.internal
    found = []  # (pod, rank, ratio)
    for pod in ctx.observed.workers():
        probe = ctx.observed.probes.get(pod.name)
        if pod.active and probe is not None:
            found += [(pod, rank, ratio) for rank, ratio in sorted(probe.stragglers.items())]
    if not found:
        if any(c.type == ConditionType.STRAGGLER for c in ctx.status.conditions):  # only a job that had one
            ctx.condition(ConditionType.STRAGGLER, False, Reason.NO_STRAGGLER, "")
        return Verdict.CONTINUE
    spec = ctx.spec.fault_tolerance.stragglers
    said = [f"rank {rank} in pod {pod.name}" + (f" on node {pod.node}" if pod.node else "") + f" ({ratio:.1f}x)"
            for pod, rank, ratio in found]
    ctx.condition(ConditionType.STRAGGLER, True, Reason.STRAGGLER,
                  f"{'; '.join(said)}: local step time above {spec.factor:g}x the other ranks' median for {spec.steps}+ steps")
    for (pod, rank, _ratio), text in zip(found, said):
        key = f"pod:{pod.uid}/{rank}"
        if not first_sighting(book.stragglers_seen, key):
            continue
        if spec.action == "Replace" and not pod.deleting:
            ctx.event(Reason.STRAGGLER_REPLACED, f"straggler {text}: replacing the pod and keeping the job off the node",
                      warning=True)
            if pod.node:
                quarantine(ctx, pod.node)
            ctx.actions.append(DeletePod(pod.name))
        else:
            ctx.event(Reason.STRAGGLER, f"straggler {text}: its local step time stays above {spec.factor:g}x the others'",
                      warning=True)
    return Verdict.CONTINUE
