"""A pod frozen whole (every process stopped: SIGSTOP, a cgroup freezer, a debugger) on a
node whose kubelet lives can report nothing: its launcher's supervisor is frozen with its
ranks.
Its peers can: their supervisors judge their own ranks victims, blocked in a collective on
a peer that stopped participating, once their steps are ``hangTimeoutSeconds`` old, and
their launchers serve how long they have waited (``Observed.peer_waits``).

A pod is replaced as the cause, charged as a ``Hang`` on that pod, when

- some other worker pod of the job reports its ranks blocked on a peer,
- its own launcher has not answered the operator's probes for ``CONFIRM_SECONDS`` at least
  (the confirmation: two probes or more, a second apart while a pod is silent), and for at
  least as long as those peers have waited (so a replacement still starting after the wait
  began is never taken for the cause), and
- its own kubelet has marked it not ready (its readiness probe fails): the kubelet is
  alive and sees the pod broken. A pod on a partitioned node is silent too, and its peers
  wait on it, but nobody reports it not ready until the node is NotReady: a node's
  failure, left to ``node_failures`` (and to its grace), as is any pod of a failed node.
  So a "not ready" counts only if it was written after this operator last heard the
  launcher (``Observed.since_answer``, where it knows that moment; with a second's slack:
  transition times are whole seconds): one written before (a pod still starting, a probe
  failed once under load) is the last word of a kubelet that may since have been cut
  off with its node, no verdict on the silence.

It is force-deleted (a frozen process ignores SIGTERM: the kubelet kills it) and counts
against its node like a kill with no report
(``node_history``). The liveness probe on the launcher stays the second line: it fires
later (``manifests.LIVENESS_MARGIN_SECONDS``) and alone covers a job of one pod, which has
no peer to report it. While any worker is silent the job is looked at every
``RECHECK_SECONDS``, so the peers' reports are acted on within seconds of their verdict.
"""

from __future__ import annotations

from datetime import timedelta

from ...api.observed import PodView
from ...api.vocabulary import FailureKind, PodPhase, Reason
from ..accounting import charged, pod_key, record_failure, remember
from ..budget import count_restart, restart_all
from ..context import DeletePod, Pass, Verdict
from .. import node_history

CONFIRM_SECONDS = 2.0
"""A silent launcher is believed frozen only after this long without an answer."""
RECHECK_SECONDS = 1.0
"""Pass interval while a worker's launcher is silent, for as long as its peers' verdict
could still come (``hangTimeoutSeconds`` and ``WATCH_SLACK_SECONDS``): a launcher the
operator can never reach (a NetworkPolicy) costs a pass a second only that long."""
WATCH_SLACK_SECONDS = 30.0
HANG = "Hang"
"""The charge's reason, as for a hang the pod's own supervisor ends (exit code ``HANG``)."""


def _silent_workers(ctx: Pass) -> list[tuple[PodView, float]]:
    silent = ctx.observed.silent
    return [(p, silent[p.name]) for p in ctx.observed.workers()
            if p.name in silent and p.phase == PodPhase.RUNNING and not p.deleting]


TIMESTAMP_SLACK_SECONDS = 1.0
"""A Ready transition time is truncated to the second."""


def _kubelet_says_broken(ctx: Pass, pod: PodView) -> bool:
    if pod.ready:
        return False
    heard = ctx.observed.since_answer.get(pod.name)
    if heard is None or pod.ready_since is None:
        return True  # nothing to date it against: the kubelet's word as it stands
    return pod.ready_since >= ctx.now - timedelta(seconds=heard + TIMESTAMP_SLACK_SECONDS)


def handle(ctx: Pass) -> Verdict:
    silent = _silent_workers(ctx)
    if not silent:
        return Verdict.CONTINUE
    if min(quiet for _, quiet in silent) <= ctx.spec.fault_tolerance.hang_timeout_seconds + WATCH_SLACK_SECONDS:
        ctx.after(RECHECK_SECONDS)
    names = {p.name for p, _ in silent}
    waits = {p.name: ctx.observed.peer_waits[p.name] for p in ctx.observed.workers()
             if p.name in ctx.observed.peer_waits and p.name not in names and p.active}
    if not waits:
        return Verdict.CONTINUE
    longest = max(waits.values())
    for pod, quiet in silent:
        node = ctx.observed.nodes.get(pod.node) if pod.node else None
        if quiet < max(CONFIRM_SECONDS, longest) or (node is not None and node.failed) or not _kubelet_says_broken(ctx, pod):
            continue
        key = pod_key(pod)
        if charged(ctx, key):
            continue
        if not _replace(ctx, pod, quiet, waits):
            return Verdict.FINISHED
    return Verdict.CONTINUE


def _replace(ctx: Pass, pod: PodView, quiet: float, waits: dict[str, float]) -> bool:
    """Charge the hang on ``pod`` and force-delete it; False when the budget is spent."""
    remember(ctx, pod_key(pod))
    hang = ctx.spec.fault_tolerance.hang_timeout_seconds
    peers = ", ".join(f"{name} ({seconds:.0f}s)" for name, seconds in sorted(waits.items()))
    where = f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")
    message = (f"{where} is frozen: its kubelet reports it not ready and its launcher has not answered for {quiet:.0f}s "
               f"while the ranks of {peers} are blocked waiting for a peer (their supervisors' verdict after "
               f"hangTimeoutSeconds={hang})")
    record_failure(ctx, FailureKind.HANG, HANG, pod, message=message)
    ctx.actions.append(DeletePod(pod.name, grace_seconds=0, force=True))
    noted = node_history.note(ctx, pod.node) if pod.node else None
    if noted is not None and noted.quarantined:
        window = ctx.spec.fault_tolerance.node_failure_window_seconds
        ctx.event(Reason.NODE_QUARANTINED, f"node {pod.node}: {noted.count} of this job's pods killed or frozen there within "
                  f"{window}s; keeping this job off the node", warning=True)
    if noted is not None and noted.merged:
        ctx.event(Reason.POD_UNRESPONSIVE, f"{message}; the node's failure {noted.count} within the window: the same "
                  "episode, replacing it without another charge", warning=True)
    else:
        ctx.event(Reason.POD_UNRESPONSIVE, f"{message}; replacing it", warning=True)
        if not count_restart(ctx, HANG, [pod.slot]):
            return False
    if ctx.spec.fault_tolerance.restart_policy == "RestartAll":
        restart_all(ctx, f"{where} froze")
    return True
