"""The memory plan (``llmtrain_contract.memplan``) against the GPUs the job can land on:
a built-in job that asks for ``nvidia.com/gpu`` and whose rank would need more memory than
the largest GPU of the candidate nodes gets ``GPUMemoryFits=False`` with a change that fits
(activation checkpointing, a smaller micro-batch, a ZeRO stage), before an OOM after
scheduling would say it. Candidate nodes: those with NVIDIA's GPU feature discovery label
``nvidia.com/gpu.memory``, narrowed to ``nvidia.com/gpu.product`` when the job's
nodeSelector names one. No such node, no condition. Advice only: nothing is blocked (the
plan is a model, docs/benchmarks.md "Memory plan"). The plan is for the job's smallest
world (``replicas.min`` pods), where a rank's share of a ZeRO partition is largest."""

from __future__ import annotations

from llmtrain_contract import memplan

from ...api.observed import GPU_PRODUCT_LABEL, NodeView
from ...api.vocabulary import ConditionType, Reason
from ..context import Pass, Verdict
from ..manifests import asks_for_gpus
from ..render import trainer_config

MIB = 1 << 20


def candidates(ctx: Pass) -> list[NodeView]:
    nodes = [n for n in ctx.observed.nodes.values() if n.gpu_memory_mib]
    scheduling = ctx.spec.scheduling
    wanted = (scheduling.node_selector or {}).get(GPU_PRODUCT_LABEL) if scheduling else None
    return [n for n in nodes if n.gpu_product == wanted] if wanted else nodes


def handle(ctx: Pass) -> Verdict:
    if ctx.spec.trainer.builtin is None or not asks_for_gpus(ctx.spec):
        return Verdict.CONTINUE
    nodes = candidates(ctx)
    if not nodes:
        # No labelled node (any more): no condition, rather than a verdict on nodes gone.
        ctx.status.conditions = [c for c in ctx.status.conditions if c.type != ConditionType.GPU_MEMORY_FITS]
        return Verdict.CONTINUE
    largest = max(nodes, key=lambda n: n.gpu_memory_mib or 0)
    room = (largest.gpu_memory_mib or 0) * MIB
    world = ctx.spec.replicas.min * ctx.spec.procs_per_node
    job = memplan.from_config(trainer_config(ctx.job), world)
    plan = memplan.plan(job)
    gpu = f"{room / memplan.GIB:.0f} GiB ({largest.gpu_product or 'GPU'} on node {largest.name})"
    if memplan.fits(job, room):
        ctx.condition(ConditionType.GPU_MEMORY_FITS, True, Reason.FITS_GPU_MEMORY,
                      f"a rank's planned peak at world size {world}, {memplan.size(plan.peak)}, fits the largest GPU: {gpu}")
        return Verdict.CONTINUE
    message = (f"a rank's planned peak at world size {world}, {memplan.size(plan.peak)}, does not fit the largest GPU the job "
               f"can land on, {gpu}, with {memplan.HEADROOM:.0%} of it usable; {memplan.advice(job, room)} ({plan.describe()})")
    if ctx.condition(ConditionType.GPU_MEMORY_FITS, False, Reason.EXCEEDS_GPU_MEMORY, message):
        ctx.event(Reason.EXCEEDS_GPU_MEMORY, message, warning=True)
    return Verdict.CONTINUE
