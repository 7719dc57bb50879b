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
"""

from __future__ import annotations

from llmtrain_contract import oom
from llmtrain_contract.exitcodes import ExitCode, classify_exit
from llmtrain_contract.names import Termination

from ...api.observed import ContainerMemory, PodView
from ...api.status import attempts, attempts_text
from ...api.vocabulary import FailureKind, PodPhase, Reason
from ..accounting import pod_key, record_failure
from ..budget import charge_budget
from ..context import Pass, Verdict

CHARGED_CAUSES = {
    "crash": (Reason.RESTARTED_IN_PLACE, FailureKind.PROCESS_CRASH),
    "hang": (classify_exit(ExitCode.HANG).reason, FailureKind.HANG),
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
    for cause, pod in charges:
        reason, _ = CHARGED_CAUSES[cause]
        where = f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")
        message = f"a rank in {where} {'hung' if cause == 'hang' else 'failed'} and torchrun restarted the worker group in place"
        memory = _memory(ctx, pod)
        if cause == "crash" and memory is not None and oom_kills.get(pod_key(pod), 0) > 0:
            oom_kills[pod_key(pod)] -= 1
            counts = seen.setdefault(pod_key(pod), {})
            counts[OOM] = counts.get(OOM, 0) + 1
            reason = oom.REASON
            message = (f"the kernel's OOM killer ended a rank in {where} (torchrun restarted the worker group in place): "
                       + oom.figures(memory.peak_bytes, memory.limit_bytes))
        named.append((cause, pod, where, reason, message))
    book.attempts_seen = {key: text for key, counts in seen.items() if (text := attempts_text(counts))}
    for cause, pod, where, reason, message in named:
        kind = CHARGED_CAUSES[cause][1]
        record_failure(ctx, kind, reason, pod, message=message)
        ctx.event(Reason.RESTARTED_IN_PLACE, f"a rank in {where} failed ({reason}); torchrun restarted the worker groups in place",
                  warning=True)
        if not charge_budget(ctx, reason, enforce=pod.phase != PodPhase.SUCCEEDED):
            return Verdict.FINISHED
    return Verdict.CONTINUE


OOM = "oom"
"""The ``attempts_seen`` slot of the OOM kills already used to name a crash."""


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
