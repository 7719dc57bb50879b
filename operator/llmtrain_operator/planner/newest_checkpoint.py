"""``status.lastCheckpoint``: the newest committed step, from the trainers' scrapes
(policies/progress.py) and from the termination messages of pods that ended
(policies/checkpoints.py: the final checkpoint is committed after the last scrape)."""

from __future__ import annotations

from ..api.status import CheckpointRecord, TierName
from .context import Pass

TIER_DURABILITY: dict[TierName, int] = {"local": 0, "shared": 1, "s3": 2}
"""Of two copies of one step, the one in the more durable tier is named."""


def note(ctx: Pass, step: int, tier: TierName) -> None:
    """``step`` is committed in ``tier``: the newest checkpoint if no newer (or no equally
    new, more durable) one is known."""
    current = ctx.status.last_checkpoint
    if current is None or (step, TIER_DURABILITY[tier]) > (current.step, TIER_DURABILITY.get(current.tier, 0)):
        ctx.status.last_checkpoint = CheckpointRecord(step=step, tier=tier, time=ctx.stamp, summary=f"{step}@{tier}")
