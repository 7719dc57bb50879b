"""Detect, classify and account failures (DESIGN §4's taxonomy).

| signal                               | action                                              |
|--------------------------------------|-----------------------------------------------------|
| all workers exit 0                   | Succeeded                                           |
| retryable exit (signal, OOM, hang)   | replace the pod (or RestartAll); count a restart    |
| permanent exit (config/data error)   | Failed with the reason                              |
| eviction / DisruptionTarget / 81     | replace; count a disruption, not a restart          |
| node NotReady/Unknown/unreachable    | after the grace: force-delete, quarantine, replace  |
| step not advancing (wedged)          | RestartAll                                          |
| restarts > maxRestarts               | Failed (BackoffLimitExceeded)                       |
"""

from __future__ import annotations

from datetime import datetime

from llmtrain_trainer.exitcodes import Classification, FailureClass, classify_exit

from ..api.observed import PodView
from ..api.status import FailureRecord, QuarantinedNode
from .context import DeletePod, Pass
from .lifecycle import finish

MAX_COUNTED = 50


def backoff_seconds(ctx: Pass, restarts: int) -> float:
    b = ctx.spec.fault_tolerance.backoff
    return min(b.max_seconds, b.initial_seconds * (b.factor ** max(0, restarts - 1)))


def record_failure(ctx: Pass, kind: str, reason: str, pod: PodView | None = None, node: str | None = None,
                   exit_code: int | None = None, message: str | None = None, since: datetime | None = None) -> None:
    """``since``: when the failure happened (default: the pod's exit), for time-to-detect."""
    happened = since or (pod.finished if pod else None)
    ctx.status.last_recovery_seconds = None  # until the first step after this failure
    ctx.status.last_failure = FailureRecord(
        kind=kind, reason=reason, pod=pod.name if pod else None, node=node or (pod.node if pod else None),
        exit_code=exit_code, message=(message or "")[:2000] or None, time=ctx.stamp,
        detect_seconds=round((ctx.now - happened).total_seconds(), 3) if happened else None,
    )


def count_restart(ctx: Pass, reason: str) -> bool:
    """Count one restart against the budget. Returns False (and fails the job) when the
    budget is exhausted. Survivors restart in place after every failure; that one
    in-place restart is expected and not counted again."""
    if not charge_budget(ctx, reason):
        return False
    delay = backoff_seconds(ctx, ctx.status.restarts)
    ctx.status.next_restart_time = ctx.at(delay)
    ctx.after(delay)
    return True


def charge_budget(ctx: Pass, reason: str) -> bool:
    """Add one restart to the never-reset counters; on exceeding the budget, fail the job
    with BackoffLimitExceeded and return False."""
    status = ctx.status
    status.restarts += 1
    status.restarts_by_reason[reason] = status.restarts_by_reason.get(reason, 0) + 1
    budget = ctx.spec.fault_tolerance.max_restarts
    if status.restarts > budget:
        finish(ctx, False, "BackoffLimitExceeded", f"{status.restarts} restarts exceed faultTolerance.maxRestarts={budget}; last: {reason}")
        return False
    return True


def restart_all(ctx: Pass, reason: str, message: str) -> None:
    """RestartAll: bump the generation; pods of older generations are replaced."""
    ctx.status.restart_generation += 1
    ctx.event("RestartAll", f"{message}; restarting every worker (generation {ctx.status.restart_generation})", warning=True)
    for pod in ctx.observed.workers():
        if not pod.deleting:
            ctx.actions.append(DeletePod(pod.name))


def _already_counted(ctx: Pass, pod: PodView) -> bool:
    key = f"{pod.name}@{pod.created.isoformat() if pod.created else ''}"
    if key in ctx.status.counted_failures:
        return True
    ctx.status.counted_failures = (ctx.status.counted_failures + [key])[-MAX_COUNTED:]
    return False


def classify_pod(pod: PodView) -> Classification:
    if pod.disruption:
        return Classification(FailureClass.DISRUPTION, "Evicted" if pod.reason == "Evicted" else "DisruptionTarget")
    code = pod.termination.get("code", pod.exit_code)
    if code is None:
        return Classification(FailureClass.RETRYABLE, pod.reason or "PodFailed")
    return classify_exit(int(code), pod.reason)


def handle_pod_failures(ctx: Pass) -> bool:
    """Returns True when the job reached a terminal phase."""
    for pod in ctx.observed.workers():
        if pod.deleting and pod.disruption and not _already_counted(ctx, pod):
            # Evicted through the Eviction API (drain, preemption): the pod is already on
            # its way out; count the disruption once, the slot is refilled when it is gone.
            ctx.status.disruptions += 1
            ctx.status.expected_in_place += SURVIVOR_RESTARTS_PER_REPLACEMENT
            record_failure(ctx, "Eviction", "DisruptionTarget", pod, message=pod.message)
            ctx.event("PodDisrupted", f"pod {pod.name} is being evicted; it will be replaced (not counted as a restart)", warning=True)
            continue
        if pod.phase != "Failed" or pod.deleting:
            continue
        if _already_counted(ctx, pod):
            ctx.actions.append(DeletePod(pod.name))  # an earlier delete did not go through
            continue
        verdict = classify_pod(pod)
        code = pod.termination.get("code", pod.exit_code)
        detail = pod.termination.get("message") or pod.message or ""
        where = f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")
        if verdict.failure_class == FailureClass.PERMANENT:
            record_failure(ctx, "Permanent", verdict.reason, pod, exit_code=code, message=detail)
            finish(ctx, False, verdict.reason, f"{where} failed permanently (exit {code}, {verdict.reason}): {detail}".strip())
            return True
        if verdict.failure_class == FailureClass.DISRUPTION:
            ctx.status.disruptions += 1
            record_failure(ctx, "Eviction", verdict.reason, pod, exit_code=code, message=detail)
            ctx.event("PodDisrupted", f"{where} was disrupted ({verdict.reason}); replacing it (not counted as a restart)", warning=True)
            ctx.status.expected_in_place += SURVIVOR_RESTARTS_PER_REPLACEMENT
            ctx.actions.append(DeletePod(pod.name))
            continue
        kind = "Hang" if verdict.reason == "Hang" else "ProcessCrash"
        record_failure(ctx, kind, verdict.reason, pod, exit_code=code, message=detail)
        ctx.event("PodFailed", f"{where} failed (exit {code}, {verdict.reason}); replacing it", warning=True)
        if not count_restart(ctx, verdict.reason):
            return True
        if ctx.spec.fault_tolerance.restart_policy == "RestartAll":
            restart_all(ctx, verdict.reason, f"{where} failed")
        else:
            ctx.status.expected_in_place += SURVIVOR_RESTARTS_PER_REPLACEMENT
            ctx.actions.append(DeletePod(pod.name))
    return False


def handle_node_failures(ctx: Pass) -> bool:
    """Pods on a node that has been NotReady/Unknown/unreachable for longer than the
    grace are force-deleted (the kubelet cannot confirm anything) and the node is
    quarantined for this job. Returns True when the job reached a terminal phase."""
    grace = ctx.spec.fault_tolerance.node_failure_grace_seconds
    failed_nodes: dict[str, list[PodView]] = {}
    for pod in ctx.observed.workers():
        if pod.node is None or pod.terminated:
            continue
        node = ctx.observed.nodes.get(pod.node)
        if node is not None and not node.failed:
            continue
        since = node.since if node is not None and node.since else None
        elapsed = (ctx.now - since).total_seconds() if since else grace
        if elapsed < grace:
            ctx.after(grace - elapsed)
            continue
        failed_nodes.setdefault(pod.node, []).append(pod)
    store = ctx.observed.store()
    if store is not None and store.node is not None and not store.terminated:
        node = ctx.observed.nodes.get(store.node)
        since = node.since if node is not None else None
        if (node is None or node.failed) and (since is None or (ctx.now - since).total_seconds() >= grace):
            ctx.actions.append(DeletePod(store.name, grace_seconds=0, force=True))
            ctx.event("StoreRestarted", f"the rendezvous store's node {store.node} failed; recreating the store elsewhere", warning=True)
    for node_name, pods in failed_nodes.items():
        names = ", ".join(p.name for p in pods)
        for pod in pods:
            ctx.actions.append(DeletePod(pod.name, grace_seconds=0, force=True))
        quarantine(ctx, node_name)
        if all(p.deleting for p in pods) and _already_counted_node(ctx, node_name):
            continue
        node_view = ctx.observed.nodes.get(node_name)
        record_failure(ctx, "NodeFailure", "NodeNotReady", pods[0], node=node_name,
                       message=f"node {node_name} failed for more than {grace}s",
                       since=node_view.since if node_view is not None else None)
        ctx.event("NodeFailure", f"node {node_name} is NotReady/unreachable for more than {grace}s: force-deleting {names} and keeping this job off the node", warning=True)
        if not count_restart(ctx, "NodeFailure"):
            return True
        ctx.status.expected_in_place += SURVIVOR_RESTARTS_PER_REPLACEMENT
    return False


def _already_counted_node(ctx: Pass, node: str) -> bool:
    key = f"node:{node}"
    if key in ctx.status.counted_failures:
        return True
    ctx.status.counted_failures = (ctx.status.counted_failures + [key])[-MAX_COUNTED:]
    return False


def quarantine(ctx: Pass, node: str) -> None:
    seconds = ctx.spec.fault_tolerance.node_quarantine_seconds
    if seconds <= 0:
        return
    kept = [q for q in ctx.status.quarantined_nodes if q.node != node]
    ctx.status.quarantined_nodes = kept + [QuarantinedNode(node=node, until=ctx.at(seconds))]


def active_quarantine(ctx: Pass) -> list[str]:
    """Quarantined nodes still in effect (expired entries are dropped)."""
    live = []
    for entry in ctx.status.quarantined_nodes:
        left = -(ctx.seconds_since(entry.until) or 0)
        if left > 0:
            live.append(entry)
            ctx.after(left)
    ctx.status.quarantined_nodes = live
    return [q.node for q in live]


SURVIVOR_RESTARTS_PER_REPLACEMENT = 1
"""A lost pod makes each survivor's worker group fail once (its peer vanished) and
torchrun counts that restart; growing back later is a membership change, not counted."""


def handle_in_place_restarts(ctx: Pass) -> bool:
    """torchrun restarts a pod's workers in place when a local rank fails. One failure
    restarts every pod's group once, so the job-level count is the *largest* increase
    any worker reports, minus the re-rendezvous expected from failures already counted.
    Returns True when the budget ran out."""
    status = ctx.status
    live = {f"{p.name}@{p.created.isoformat() if p.created else ''}": p for p in ctx.observed.workers() if p.active}
    seen = {k: v for k, v in status.torchrun_restarts.items() if k in live}
    hangs = {k: v for k, v in status.hangs_seen.items() if k in live}
    increase = hung = 0
    for key, pod in live.items():
        probe = ctx.observed.probes.get(pod.name)
        if probe is None or probe.restarts is None:
            continue
        increase = max(increase, probe.restarts - seen.get(key, 0))
        seen[key] = max(probe.restarts, seen.get(key, 0))
        if probe.hangs is not None:
            hung = max(hung, probe.hangs - hangs.get(key, 0))
            hangs[key] = max(probe.hangs, hangs.get(key, 0))
    status.torchrun_restarts, status.hangs_seen = seen, hangs
    absorbed = min(increase, status.expected_in_place)
    status.expected_in_place -= absorbed
    for i in range(increase - absorbed):
        # The trainers tell a hang (watchdog exit) apart from other rank failures.
        reason, kind = ("Hang", "Hang") if i < hung else ("RestartedInPlace", "ProcessCrash")
        record_failure(ctx, kind, reason, message="torchrun restarted a worker group in place"
                       + (" after the hang watchdog fired" if kind == "Hang" else ""))
        ctx.event("RestartedInPlace", f"a rank failed ({reason}) and torchrun restarted the worker groups in place", warning=True)
        if not charge_budget(ctx, reason):
            return True
    return False


def handle_wedge(ctx: Pass) -> bool:
    """No step progress for ``progressTimeoutSeconds`` while Running: RestartAll."""
    limit = ctx.spec.fault_tolerance.progress_timeout_seconds
    status = ctx.status
    if not limit or status.phase != "Running":
        return False
    idle = ctx.seconds_since(status.last_progress_time)
    if idle is None:
        status.last_progress_time = ctx.stamp
        ctx.after(limit)
        return False
    if idle < limit:
        ctx.after(limit - idle)
        return False
    record_failure(ctx, "Wedged", "NoProgress", message=f"step {status.step} did not advance for {idle:.0f}s")
    if not count_restart(ctx, "Wedged"):
        return True
    restart_all(ctx, "Wedged", f"step {status.step} did not advance for {idle:.0f}s (progressTimeoutSeconds={limit})")
    status.last_progress_time = ctx.stamp
    return False
