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
- Such failures on one node less than ``nodeFailureWindowSeconds`` apart are one
  *episode*: the first is charged as a restart, the rest replace their pod uncharged.
- The ``nodeFailureThreshold``-th within the window quarantines the node for the job for
  ``nodeQuarantineSeconds`` (replacements avoid it), with an Event.
- A node's NotReady episodes (``node_failures.py``) less than the window apart merge the
  same way (a node that flaps past the grace); they are kept apart from its kills.
"""

from __future__ import annotations

from ..api.observed import PodView
from .context import Pass
from .quarantine import quarantine

MAX_KEPT = 20
"""Stamps kept per node (only those within the window matter)."""


def points_at_node(pod: PodView) -> bool:
    if pod.termination or pod.disruption or pod.reason == "OOMKilled":
        return False
    code = pod.exit_code
    return code is None or code > 128 or code < 0


NOT_READY = "notready:"
"""The book's key prefix for a node's NotReady episodes (kept apart from its kills: a node
that kills a pod and later goes NotReady has two episodes, charged once each)."""


def note(ctx: Pass, node: str, not_ready: bool = False) -> tuple[bool, int]:
    """Record a kill that points at ``node`` (or, ``not_ready``, one of its NotReady
    episodes): (it belongs to an episode already charged, the failures of that kind on
    the node within the window, this one included). Kills quarantine the node at the
    threshold (a NotReady episode quarantines it anyway)."""
    spec = ctx.spec.fault_tolerance
    book = ctx.status.internal.node_failures
    window = spec.node_failure_window_seconds
    key = f"{NOT_READY}{node}" if not_ready else node
    recent = [t for t in book.get(key, []) if (ctx.seconds_since(t) or 0) < window]
    merged = bool(recent)
    recent = (recent + [ctx.stamp])[-MAX_KEPT:]
    book[key] = recent
    # Keys with nothing recent are dropped: the bookkeeping stays bounded by the nodes in use.
    for other in [k for k, stamps in book.items() if k != key and not any((ctx.seconds_since(t) or 0) < window for t in stamps)]:
        del book[other]
    if not not_ready and len(recent) >= spec.node_failure_threshold:
        quarantine(ctx, node)
    return merged, len(recent)
