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

from ..api.observed import PodView, format_time
from ..api.status import FailureRecord, QuarantinedNode
from .context import DeletePod, Pass
from .lifecycle import finish

MAX_COUNTED = 200
"""Failure keys kept in status (oldest dropped first). Only a key whose pod still exists
matters, and a failed pod is deleted right after its failure is charged."""


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
    record = ctx.status.last_failure
    ctx.decide(f"failure recorded: {kind}/{reason} pod={record.pod or '-'} node={record.node or '-'} exit={exit_code}")


def count_restart(ctx: Pass, reason: str) -> bool:
    """Count one restart against the budget and start the backoff before replacements.
    Returns False (and fails the job) when the budget is exhausted. The survivors' worker
    groups fail too when a peer vanishes; those are victims, never charged
    (``handle_in_place_restarts``)."""
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
    ctx.decide(f"restart charged ({reason}): {status.restarts} of faultTolerance.maxRestarts={budget}")
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


def pod_key(pod: PodView) -> str:
    """The identity of a pod's failure: its uid (a replacement under the same stable name
    is another pod, so another failure)."""
    return f"pod:{pod.uid}" if pod.uid else f"pod:{pod.name}@{pod.created.isoformat() if pod.created else ''}"


def node_key(ctx: Pass, name: str) -> str:
    """The identity of a node failure: the node and when its Ready condition last changed
    (a node that heals and fails again fails anew). A node whose object is gone has no
    transition time; that key lasts until the node is seen Ready again."""
    view = ctx.observed.nodes.get(name)
    return f"node:{name}@{format_time(view.since)}" if view is not None and view.since else f"node:{name}@gone"


def charged(ctx: Pass, key: str) -> bool:
    return key in ctx.status.counted_failures


def remember(ctx: Pass, *keys: str) -> None:
    """Record failure keys in the status being built. They go out in the same status
    write as the charge itself, and every charge checks them first, so a failure is
    charged once whatever the order and timing of passes (a pass planned from an older
    status cannot write: status writes are conditional on its resourceVersion)."""
    new = [k for k in dict.fromkeys(keys) if k not in ctx.status.counted_failures]
    if new:
        ctx.status.counted_failures = (ctx.status.counted_failures + new)[-MAX_COUNTED:]


def forget_healed_nodes(ctx: Pass) -> None:
    """A node seen Ready again starts a new history: its next failure is a new one."""
    healthy = {n.name for n in ctx.observed.nodes.values() if not n.failed}
    kept = [k for k in ctx.status.counted_failures if not (k.startswith("node:") and k[5:].rsplit("@", 1)[0] in healthy)]
    if len(kept) != len(ctx.status.counted_failures):
        ctx.status.counted_failures = kept


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
        if pod.deleting and pod.disruption and not charged(ctx, pod_key(pod)):
            # Evicted through the Eviction API (drain, preemption): the pod is already on
            # its way out; count the disruption once, the slot is refilled when it is gone.
            remember(ctx, pod_key(pod))
            ctx.status.disruptions += 1
            ctx.decide(f"disruption counted: {pod.name} is being evicted")
            record_failure(ctx, "Eviction", "DisruptionTarget", pod, message=pod.message)
            ctx.event("PodDisrupted", f"pod {pod.name} is being evicted; it will be replaced (not counted as a restart)", warning=True)
            continue
        if pod.phase != "Failed" or pod.deleting:
            continue
        if charged(ctx, pod_key(pod)):
            ctx.actions.append(DeletePod(pod.name))  # an earlier delete did not go through
            continue
        remember(ctx, pod_key(pod))
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
            ctx.actions.append(DeletePod(pod.name))
    return False


def handle_node_failures(ctx: Pass) -> bool:
    """Pods on a node that has been NotReady/Unknown/unreachable for longer than the
    grace are force-deleted (the kubelet cannot confirm anything) and the node is
    quarantined for this job. Returns True when the job reached a terminal phase."""
    grace = ctx.spec.fault_tolerance.node_failure_grace_seconds
    forget_healed_nodes(ctx)
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
        record_failure(ctx, "NodeFailure", "NodeNotReady", pods[0], node=node_name,
                       message=f"node {node_name} failed for more than {grace}s",
                       since=node_view.since if node_view is not None else None)
        ctx.event("NodeFailure", f"node {node_name} is NotReady/unreachable for more than {grace}s: force-deleting {names} and keeping this job off the node", warning=True)
        if not count_restart(ctx, "NodeFailure"):
            return True
    return False


def quarantine(ctx: Pass, node: str) -> None:
    seconds = ctx.spec.fault_tolerance.node_quarantine_seconds
    if seconds <= 0:
        return
    kept = [q for q in ctx.status.quarantined_nodes if q.node != node]
    ctx.status.quarantined_nodes = kept + [QuarantinedNode(node=node, until=ctx.at(seconds))]
    ctx.decide(f"node {node} quarantined for this job until {ctx.at(seconds)}")


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


CHARGED_CAUSES = {"crash": ("RestartedInPlace", "ProcessCrash"), "hang": ("Hang", "Hang")}
"""Causes of an in-place restart that are charged, with their reason and failure kind.
A ``victim`` attempt (every rank failed because a peer elsewhere vanished) is the
consequence of a failure charged where it happened (a pod crash, a node loss, a hang),
so it is never charged itself."""


def handle_in_place_restarts(ctx: Pass) -> bool:
    """torchrun restarts a pod's workers in place when a local rank fails; the trainers
    report why each failed attempt ended. Each new crash or hang attempt of a pod is one
    failure, charged once (keyed by pod uid and cause). Returns True when the budget ran
    out."""
    status = ctx.status
    live = {pod_key(p): p for p in ctx.observed.workers() if p.active}
    seen = {k: v for k, v in status.attempts_seen.items() if k.split("/", 1)[0] in live}
    charges: list[tuple[str, PodView, str]] = []
    for key, pod in live.items():
        probe = ctx.observed.probes.get(pod.name)
        if probe is None:
            continue
        for cause, count in probe.failed_attempts.items():
            if cause not in CHARGED_CAUSES:
                continue
            slot = f"{key}/{cause}"
            charges += [(cause, pod, slot)] * max(0, count - seen.get(slot, 0))
            seen[slot] = max(count, seen.get(slot, 0))
    status.attempts_seen = seen
    for cause, pod, _ in charges:
        reason, kind = CHARGED_CAUSES[cause]
        record_failure(ctx, kind, reason, pod, message=f"a rank in {pod.name} {'hung' if cause == 'hang' else 'failed'} "
                       "and torchrun restarted the worker group in place")
        ctx.event("RestartedInPlace", f"a rank in pod {pod.name} failed ({reason}); torchrun restarted the worker groups in place",
                  warning=True)
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
