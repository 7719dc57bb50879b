"""In-place restarts: torchrun restarts a pod's worker group when a local rank fails,
and the pod's launcher (as soon as the next attempt starts) and then the restarted trainer
report why each failed attempt ended (``failed_attempts_total{cause}``).

Each new ``crash`` or ``hang`` attempt of a pod is one failure, charged once (keyed by
pod uid and cause). A ``victim`` attempt (every rank failed because a peer elsewhere
vanished) is the consequence of a failure charged where it happened (a pod crash, a node
loss, a hang), so it is never charged itself.

A crash whose rank the kernel's OOM killer ended looks like any signal death to torchrun;
the launcher reads the container's memory cgroup, and each OOM kill it counts (not yet
used) names one new crash of that pod ``OOMKilled``, with the memory peak and the limit.
The kernel kills before torchrun sees its rank gone, and the launcher's page gives its
crash count before it reads the cgroup, so a page that shows the crash shows the kill. A
crash first reported by the restarted trainer in a pass whose launcher page did not
answer is named ``RestartedInPlace`` (its kill is then used by the pod's next crash, if
any: the count cannot say which crash it was).

A rank out of GPU memory has a cause of its own (``gpu_oom``: the rank said so in its exit
record), charged as ``GPUOutOfMemory`` with a built-in job's memory plan.
"""

from __future__ import annotations

from llmtrain_contract import memplan, oom
from llmtrain_contract.exitcodes import ExitCode, classify_exit
from llmtrain_contract.names import Termination

from ...api.observed import ContainerMemory, PodView
from ...api.status import attempts, attempts_text
from ...api.vocabulary import FailureKind, PodPhase, Reason
from ..accounting import pod_key, record_failure
from ..budget import charge_budget
from ..context import Pass, Verdict
from ..render import trainer_config

CHARGED_CAUSES = {
    "crash": (Reason.RESTARTED_IN_PLACE, FailureKind.PROCESS_CRASH),
    "hang": (classify_exit(ExitCode.HANG).reason, FailureKind.HANG),
    oom.GPU_CAUSE: (oom.GPU_REASON, FailureKind.PROCESS_CRASH),
}
"""Causes that are charged, with their restart reason and failure kind."""


def handle(ctx: Pass) -> Verdict:
    book = ctx.status.internal
    # Ended pods too: a restart just before a pod ended may have had no scrape to show
    # it; the launcher's termination message gives the final counts.
    live = {pod_key(p): p for p in ctx.observed.workers() if p.active or (p.terminated and not p.deleting)}
    # A kept pod's counts stay too: one labelled kept by someone else is judged by them
    # (``pod_failures._charged_in_place``).
    kept = {pod_key(p) for p in ctx.observed.kept_workers()}
    seen = {k: attempts(v) for k, v in book.attempts_seen.items() if k in live or k in kept}
    charges: list[tuple[str, PodView]] = []
    for key, pod in live.items():
        for cause, count in _failed_attempts(ctx, pod).items():
            if cause not in CHARGED_CAUSES:
                continue
            before = seen.get(key, {}).get(cause, 0)
            # A pod's count is its word: one that jumps by millions (a forged or broken
            # endpoint) charges at most what ends the budget, not a list of that length.
            charges += [(cause, pod)] * min(max(0, count - before), ctx.spec.fault_tolerance.max_restarts + 1)
            if count > before:
                seen.setdefault(key, {})[cause] = count
    # Which of the new crashes the OOM killer explains, decided (and its kills marked
    # used) before any charge: the budget may end the pass at any one of them.
    oom_kills = _new_oom_kills(ctx, live, seen)
    named: list[tuple[str, PodView, str, str, str]] = []
    plans: dict[str, str] = {}  # pod key -> its GPU OOM message: a plan per pod, not per claimed charge
    restarted = restart_words(ctx)
    for cause, pod in charges:
        reason, _ = CHARGED_CAUSES[cause]
        where = f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")
        message = f"a rank in {where} {'hung' if cause == 'hang' else 'failed'} and {restarted}"
        if cause == oom.GPU_CAUSE:
            if pod_key(pod) not in plans:
                plans[pod_key(pod)] = gpu_oom_message(ctx, pod, where)
            message = plans[pod_key(pod)]
        memory = _memory(ctx, pod)
        if cause in (oom.GPU_CAUSE, "crash") and memory is not None and oom_kills.get(pod_key(pod), 0) > 0:
            oom_kills[pod_key(pod)] -= 1
            counts = seen.setdefault(pod_key(pod), {})
            counts[OOM] = counts.get(OOM, 0) + 1
            kernel = oom.figures(memory.peak_bytes, memory.limit_bytes)
            if cause == oom.GPU_CAUSE:
                # The attempt had both (a rank killed without a record beside one out of GPU
                # memory): the kill is used here, or it would name a later, unrelated crash.
                message += f"; the kernel's OOM killer also ended a rank of the pod: {kernel}"
            else:
                reason = oom.REASON
                message = f"the kernel's OOM killer ended a rank in {where} ({restarted}): {kernel}"
        named.append((cause, pod, where, reason, message))
    book.attempts_seen = {key: text for key, counts in seen.items() if (text := attempts_text(counts))}
    for cause, pod, where, reason, message in named:
        kind = CHARGED_CAUSES[cause][1]
        record_failure(ctx, kind, reason, pod, message=message)
        ctx.event(Reason.RESTARTED_IN_PLACE, f"a rank in {where} failed ({reason}); {restarted}", warning=True)
        if not charge_budget(ctx, reason, enforce=pod.phase != PodPhase.SUCCEEDED):
            return Verdict.FINISHED
    return Verdict.CONTINUE


def restart_words(ctx: Pass) -> str:
    """What torchrun did about a rank's own failure. Without in-process healing every
    node's agent restarts its worker group through a new rendezvous; with it, only the
    failed rank's agent restarts its group, in place, and the other pods' ranks heal in
    process (``launch/torchrun_agent.restart_in_place``), unless that cannot form, which
    then restarts them as victims (never charged)."""
    if ctx.spec.fault_tolerance.in_process_healing:
        return "torchrun restarted that pod's worker group in place, for the other pods' ranks, if any, to heal in process"
    return "torchrun restarted the worker groups in place"


OOM = "oom"
"""The ``attempts_seen`` slot of the OOM kills already used to name a crash."""


def gpu_oom_message(ctx: Pass, pod: PodView, where: str) -> str:
    """A rank out of GPU memory, restarted in place: its own figures stay in its exit
    record and log (a page gives counts only); a built-in job's memory plan at the job's
    world size, against the node's GPU when NVIDIA's labels give its size."""
    text = (f"a rank in {where} ran out of GPU memory (CUDA's allocator refused an allocation; the rank's log and "
            f"exit record give the allocator's figures) and {restart_words(ctx)}")
    if ctx.spec.trainer.builtin is None:
        return f"{text}; {oom.GPU_ADVICE}"
    node = ctx.observed.nodes.get(pod.node) if pod.node else None
    room = node.gpu_memory_mib << 20 if node is not None and node.gpu_memory_mib else None
    world = ctx.status.world_size or ctx.spec.replicas.min * ctx.spec.procs_per_node
    return f"{text}; {memplan.verdict(memplan.from_config(trainer_config(ctx.job), world), room)}"


def _new_oom_kills(ctx: Pass, live: dict[str, PodView], seen: dict[str, dict[str, int]]) -> dict[str, int]:
    """Pod key -> OOM kills its launcher counts that no charged crash has used yet."""
    out = {}
    for key, pod in live.items():
        memory = _memory(ctx, pod)
        if memory is not None:
            out[key] = max(0, memory.oom_kills - seen.get(key, {}).get(OOM, 0))
    return out


def _memory(ctx: Pass, pod: PodView) -> ContainerMemory | None:
    """The container's memory figures: its launcher's page, or its termination message
    once it has ended (the larger kill count of the two)."""
    page = ctx.observed.launcher_memory.get(pod.name)
    final = pod.termination.get(Termination.MEMORY)
    if final is None:
        return page
    ended = ContainerMemory(final["oomKills"], final["peakBytes"], final["limitBytes"])
    return ended if page is None or ended.oom_kills >= page.oom_kills else page


def _failed_attempts(ctx: Pass, pod: PodView) -> dict[str, int]:
    """cause -> failed attempts of ``pod``. The launcher and the trainer count the same
    attempts from the same exit records, the launcher sooner, and its termination message
    gives them once more at the end: the larger count is the newer truth, and a count seen
    once is never charged again (``attempts_seen``). The message's counts leave out the
    pod's last attempt (its end is the pod's failure, ``pod_failures``)."""
    probe = ctx.observed.probes.get(pod.name)
    counts = dict(probe.failed_attempts) if probe is not None else {}
    sources = [ctx.observed.launcher_attempts.get(pod.name, {}), pod.termination.get(Termination.FAILED_ATTEMPTS) or {}]
    for source in sources:
        for cause, count in source.items():
            counts[cause] = max(count, counts.get(cause, 0))
    return counts
