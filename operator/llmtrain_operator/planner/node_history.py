"""Node health from history: a node that keeps killing the job's pods is quarantined
for the job, and its kills are charged once per episode.

A quarantine used to follow only a NotReady episode longer than ``nodeFailureGraceSeconds``.
A node that loses every process and comes back within the grace (a reboot loop, a kernel
that keeps panicking, a device plugin that keeps killing its containers) then cost a
charged restart per kill, and the replacement landed on the same node.

The rule (documented in docs/operator.md):

- A pod failure *points at its node* when the pod's launcher did not report it: the
  container was killed by a signal, or ended with no exit at all, and there is no
  termination message (the launcher writes one for every exit it sees: an exception, a
  hang, a permanent error). The kubelet's ``OOMKilled`` is the job's memory, not the
  node's, and does not count.
- Such failures on one node within ``nodeFailureWindowSeconds`` of the episode's first,
  charged one are that *episode*: they replace their pod uncharged (all pods, with
  ``restartPolicy: RestartAll``). The first one after the window is charged again: a node
  that never stops costs one restart per window until the budget ends the job.
- The ``nodeFailureThreshold``-th within the window quarantines the node for the job for
  ``nodeQuarantineSeconds`` (replacements avoid it), with an Event.
- A node's NotReady episodes (``node_failures.py``) less than the window apart merge the
  same way (a node that flaps past the grace); they are kept apart from its kills.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.observed import PodView
from .context import Pass
from .quarantine import active_quarantine, quarantine

MAX_KEPT = 20
"""Stamps kept per node (only those within the window matter); ``nodeFailureThreshold``
is at most this."""
MAX_NODES_KEPT = 32
"""Nodes whose history ``internal.nodeFailures`` keeps at once (up to four keys each: its
kills, its NotReady episodes and their charges); a node's keys go once nothing of it is
within the window. A failure on one more node while 32 are followed is not followed: it
is charged as an episode of its own, each time, and counted alone for the quarantine.
The nodes already followed keep their episodes (dropping one to make room would charge
its next failure again, and a cycle of failures over more nodes than the room would
charge every one). Failures on more than 32 nodes within one window are a cluster's, not
a node's."""
MAX_KEYS = 4 * MAX_NODES_KEPT


def points_at_node(pod: PodView) -> bool:
    if pod.termination or pod.disruption or pod.reason == "OOMKilled":
        return False
    code = pod.exit_code
    return code is None or code > 128 or code < 0


NOT_READY = "notready:"
"""The book's key prefix for a node's NotReady episodes (kept apart from its kills: a node
that kills a pod and later goes NotReady has two episodes, charged once each)."""
CHARGED = "charged:"
"""The book's key prefix for when a node's current episode was charged."""


@dataclass(frozen=True)
class Noted:
    merged: bool
    """Within the window of the episode's charged failure: not charged again."""
    count: int
    """Failures of this kind on the node within the window, this one included."""
    quarantined: bool
    """This failure put the node in quarantine (it was not already)."""


def _recent(ctx: Pass, stamps: list[str], window: float) -> list[str]:
    # A stamp that is not a time (a hand edit: the CRD does not check ``internal``) is not recent.
    return [t for t in stamps if (since := ctx.seconds_since(t)) is not None and since < window]


def _node_of(key: str) -> str:
    return key.removeprefix(CHARGED).removeprefix(NOT_READY)


def note(ctx: Pass, node: str, not_ready: bool = False) -> Noted:
    """Record a kill that points at ``node`` (or, ``not_ready``, one of its NotReady
    episodes). An episode is counted from its charged failure: failures within the window
    after it merge; the first one after the window is charged again, so a node that kills
    pods forever still costs one restart per window (the budget ends it). Kills quarantine
    the node at the threshold (a NotReady episode quarantines it anyway)."""
    spec = ctx.spec.fault_tolerance
    book = ctx.status.internal.node_failures
    window = spec.node_failure_window_seconds
    key = f"{NOT_READY}{node}" if not_ready else node
    # Keys with nothing recent are dropped: the bookkeeping stays bounded by the nodes in use.
    for other in [k for k, stamps in book.items() if not _recent(ctx, stamps, window)]:
        del book[other]
    recent = (_recent(ctx, book.get(key, []), window) + [ctx.stamp])[-MAX_KEPT:]
    followed = {_node_of(k) for k in book}
    if node in followed or len(followed) < MAX_NODES_KEPT:
        book[key] = recent
        merged = bool(_recent(ctx, book.get(CHARGED + key, []), window))
        if not merged:
            book[CHARGED + key] = [ctx.stamp]
    else:
        merged = False  # not followed (``MAX_NODES_KEPT``): an episode of its own
    quarantined = False
    if not not_ready and len(recent) >= spec.node_failure_threshold and spec.node_quarantine_seconds > 0:
        quarantined = node not in active_quarantine(ctx)
        quarantine(ctx, node)
    return Noted(merged, len(recent), quarantined)
