"""Failed worker pods, classified by their exit (the launcher's termination message,
the kubelet's reason) with the shared exit-code table. A replaced pod is kept for its log
(``outcome.retire``, ``policies/kept.py``) unless the job keeps none:

| exit                                | action                                  |
|-------------------------------------|-----------------------------------------|
| retryable (signal, OOM, hang, 1 ...) | replace the pod (or RestartAll); charge |
| permanent (config, data, checkpoint) | Failed with the reason                  |
| eviction / DisruptionTarget / 81     | replace; a disruption, not charged      |
| pre-flight failed (87)               | the same, and the node quarantined      |

A pod that ends with the hang its launcher had already counted in place (its last attempt
hung, the launcher counted it at once expecting torchrun to restart it, and the agent
ended instead) is replaced without a second charge, if this operator saw that count
(``attempts_seen``); otherwise the exit is the only report of the failure and is charged.
"""

from __future__ import annotations

from llmtrain_contract import oom
from llmtrain_contract.exitcodes import Classification, ExitCode, FailureClass, classify_exit
from llmtrain_contract.names import Termination

from ...api.observed import PodView
from ...api.status import attempts
from ...api.vocabulary import FailureKind, PodPhase, Reason
from ..accounting import charged, pod_key, record_failure, remember, unhandled_kept
from ..budget import count_restart, restart_all
from ..context import Pass, Verdict
from ..decisions import DisruptionCounted
from ..outcome import finish, retire
from ..quarantine import quarantine
from .. import node_history


def _charged_in_place(ctx: Pass, pod: PodView, key: str) -> bool:
    counted = pod.termination.get(Termination.COUNTED_IN_PLACE)
    if not isinstance(counted, int) or isinstance(counted, bool):
        return False
    return attempts(ctx.status.internal.attempts_seen.get(key, "")).get("hang", 0) >= counted


def classify_pod(pod: PodView) -> Classification:
    if pod.disruption:
        return Classification(FailureClass.DISRUPTION, Reason.EVICTED if pod.reason == "Evicted" else Reason.DISRUPTION_TARGET)
    if pod.termination.get(Termination.OOM):
        return Classification(FailureClass.RETRYABLE, oom.REASON)  # its launcher saw the OOM killer end a rank
    code = pod.termination.get(Termination.CODE, pod.exit_code)
    if code is None:
        return Classification(FailureClass.RETRYABLE, pod.reason or Reason.POD_FAILED)
    return classify_exit(int(code), pod.reason)


def handle(ctx: Pass) -> Verdict:
    # Every worker but those kept for their logs, and any pod labelled kept that this
    # operator never handled (``accounting.unhandled_kept``).
    for pod in ctx.observed.workers() + unhandled_kept(ctx):
        key = pod_key(pod)
        if pod.deleting and pod.disruption and not charged(ctx, key):
            # Evicted through the Eviction API (drain, preemption): the pod is already on
            # its way out; count the disruption once, the slot is refilled when it is gone.
            remember(ctx, key)
            ctx.status.disruptions += 1
            ctx.decide(DisruptionCounted(pod.name, Reason.DISRUPTION_TARGET))
            record_failure(ctx, FailureKind.EVICTION, Reason.DISRUPTION_TARGET, pod, message=pod.message)
            ctx.event(Reason.POD_DISRUPTED, f"pod {pod.name} is being evicted; it will be replaced (not counted as a restart)",
                      warning=True)
            continue
        if pod.phase != PodPhase.FAILED or pod.deleting:
            continue
        if charged(ctx, key):
            retire(ctx, pod)  # an earlier keep or delete did not go through
            continue
        remember(ctx, key)
        verdict = classify_pod(pod)
        code = pod.termination.get(Termination.CODE, pod.exit_code)
        detail = pod.termination.get(Termination.MESSAGE) or pod.message or ""
        if verdict.reason == oom.REASON and not pod.termination.get(Termination.OOM):
            # The whole container went (the kubelet's OOMKilled; memory.oom.group under
            # cgroup v2): no launcher was left to read the peak, the limit is the spec's.
            limit = ((ctx.spec.resources.limits if ctx.spec.resources else None) or {}).get("memory")
            detail = (f"the kernel's OOM killer ended the container at its memory limit ({limit}). " if limit
                      else "the kernel's OOM killer ended the container (no memory limit: the node ran out). ") + oom.ADVICE
        elif not pod.termination and code == 128 + 9:
            # The launcher reports every exit it sees; a SIGKILL from outside leaves it no time.
            detail = detail or ("killed (SIGKILL) before the launcher could report: a failed liveness probe "
                                "(a frozen launcher or pod), the OOM killer, or a user")
        where = f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")
        if verdict.failure_class == FailureClass.PERMANENT:
            record_failure(ctx, FailureKind.PERMANENT, verdict.reason, pod, exit_code=code, message=detail)
            finish(ctx, False, verdict.reason, f"{where} failed permanently (exit {code}, {verdict.reason}): {detail}".strip())
            return Verdict.FINISHED
        if verdict.reason == Reason.PREFLIGHT_FAILED:
            # The node's network fell short before the pod joined (the launcher's check):
            # the node's fault, not the job's; the replacement goes elsewhere.
            ctx.status.disruptions += 1
            ctx.decide(DisruptionCounted(pod.name, verdict.reason))
            record_failure(ctx, FailureKind.NODE_FAILURE, verdict.reason, pod, exit_code=code, message=detail)
            if pod.node:
                quarantine(ctx, pod.node)
            ctx.event(Reason.PREFLIGHT_FAILED, f"{where}: {detail}; keeping this job off the node and replacing the pod "
                      "(not counted as a restart)", warning=True)
            retire(ctx, pod)
            continue
        if verdict.failure_class == FailureClass.DISRUPTION:
            ctx.status.disruptions += 1
            ctx.decide(DisruptionCounted(pod.name, verdict.reason))
            record_failure(ctx, FailureKind.EVICTION, verdict.reason, pod, exit_code=code, message=detail)
            ctx.event(Reason.POD_DISRUPTED, f"{where} was disrupted ({verdict.reason}); replacing it (not counted as a restart)",
                      warning=True)
            retire(ctx, pod)
            continue
        kind = FailureKind.HANG if verdict.reason == classify_exit(ExitCode.HANG).reason else FailureKind.PROCESS_CRASH
        if kind == FailureKind.HANG and _charged_in_place(ctx, pod, key):
            ctx.event(Reason.POD_FAILED, f"{where} failed (exit {code}, {verdict.reason}), the hang already charged when "
                      "it was detected; replacing it", warning=True)
            retire(ctx, pod)
            continue
        record_failure(ctx, kind, verdict.reason, pod, exit_code=code, message=detail)
        if pod.node and node_history.points_at_node(pod):
            noted = node_history.note(ctx, pod.node)
            window = ctx.spec.fault_tolerance.node_failure_window_seconds
            if noted.quarantined:
                ctx.event(Reason.NODE_QUARANTINED, f"node {pod.node}: {noted.count} of this job's pods killed there within "
                          f"{window}s with no report from their launcher; keeping this job off the node", warning=True)
            if noted.merged:
                ctx.event(Reason.POD_FAILED, f"{where} failed (exit {code}, {verdict.reason}), the node's failure {noted.count} "
                          f"within {window}s: the same episode, replacing it without another charge", warning=True)
                if ctx.spec.fault_tolerance.restart_policy == "RestartAll":
                    restart_all(ctx, f"{where} failed")
                else:
                    retire(ctx, pod)
                continue
        ctx.event(Reason.POD_FAILED, f"{where} failed (exit {code}, {verdict.reason}); replacing it", warning=True)
        if not count_restart(ctx, verdict.reason, [pod.slot]):
            return Verdict.FINISHED
        if ctx.spec.fault_tolerance.restart_policy == "RestartAll":
            restart_all(ctx, f"{where} failed")
        else:
            retire(ctx, pod)
    return Verdict.CONTINUE
