"""Keeping a job's replacements off a node that failed under it, for a while."""

from __future__ import annotations

from ..api.status import QuarantinedNode
from .context import Pass
from .decisions import NodeQuarantined

MAX_QUARANTINED = 256
"""Nodes one job keeps in quarantine at once; beyond it the oldest entry goes first. A job
whose pods failed on this many nodes has a cluster problem that avoiding nodes cannot fix,
and every replacement pod carries the list in its node affinity."""


def quarantine(ctx: Pass, node: str) -> None:
    seconds = ctx.spec.fault_tolerance.node_quarantine_seconds
    if seconds <= 0:
        return
    kept = [q for q in ctx.status.quarantined_nodes if q.node != node]
    ctx.status.quarantined_nodes = (kept + [QuarantinedNode(node=node, until=ctx.at(seconds))])[-MAX_QUARANTINED:]
    ctx.decide(NodeQuarantined(node, ctx.at(seconds)))


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
