"""What the ranks agree on: one small all-reduce per step, and the few decisions that
every rank must take alike (wait for a checkpoint's write, whether the final one is
durable).

Everything a rank decides from these values is the same on every rank, because every
rank reads the same reduced numbers: the ranks stop at the same step after a SIGTERM,
defer the same checkpoint, save the same steps and offer the same steps to each slower
tier. Packing and unpacking are pure (``pack``/``unpack``), so they are unit-tested
without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, cast

import torch
import torch.distributed as dist

from llmtrain_trainer.world import DistInfo

T = TypeVar("T")


@dataclass(frozen=True)
class Proposal:
    """What one rank brings to a step's agreement."""

    loss: float
    """This rank's mean micro-batch loss."""
    stop: bool
    """This rank got SIGTERM."""
    writing: bool
    """This rank is still writing its previous checkpoint (a new snapshot cannot be taken)."""
    interval: int
    """The checkpoint interval rank 0 proposes (0 on the other ranks: only rank 0's counts)."""
    tiers_busy: list[bool]
    """Per slower tier: this rank is still storing a step into it."""
    local_seconds: float
    """This rank's local share of the step (up to its first wait for the peers)."""


@dataclass(frozen=True)
class Agreed:
    """A step's agreement, the same on every rank."""

    loss: float
    """The global mean loss."""
    stop: bool
    """Some rank got SIGTERM: every rank stops at this step."""
    writing: bool
    """Some rank is still writing: every rank defers a checkpoint that falls due."""
    interval: int
    """Rank 0's checkpoint interval: every rank saves the same steps."""
    tiers_busy: list[bool]
    """Per slower tier, some rank is still storing into it: all offer it the same steps."""
    local_seconds: list[float]
    """Every rank's local share of the step, by rank (the straggler watch's input)."""


def pack(proposal: Proposal, rank: int, world: int) -> list[float]:
    """The proposal as the numbers a sum reduces: flags as 0/1 (a sum above 0 is an
    "any"), and this rank's local seconds in its own slot of a slot per rank."""
    slots = [0.0] * world
    slots[rank] = proposal.local_seconds
    return [proposal.loss, float(proposal.stop), float(proposal.writing), float(proposal.interval),
            *(float(b) for b in proposal.tiers_busy), *slots]


def unpack(values: list[float], tiers: int, world: int) -> Agreed:
    """The agreement from the summed numbers (``tiers``: how many slower tiers)."""
    end = 4 + tiers
    return Agreed(loss=values[0] / world, stop=values[1] > 0, writing=values[2] > 0, interval=int(values[3]),
                  tiers_busy=[x > 0 for x in values[4:end]], local_seconds=list(values[end:end + world]))


def agree(info: DistInfo, proposal: Proposal) -> Agreed:
    """One all-reduce of every rank's proposal (a collective: every rank calls it)."""
    packed = torch.tensor(pack(proposal, info.rank, info.world_size), dtype=torch.float64)
    if info.world_size > 1:
        dist.all_reduce(packed)
    return unpack(packed.tolist(), len(proposal.tiers_busy), info.world_size)


def all_true(info: DistInfo, mine: bool) -> bool:
    """Whether every rank says yes (a collective)."""
    return not any_true(info, not mine)


def any_true(info: DistInfo, mine: bool) -> bool:
    """Whether some rank says yes (a collective)."""
    flag = torch.tensor([1.0 if mine else 0.0], dtype=torch.float64)
    if info.world_size > 1:
        dist.all_reduce(flag)
    return bool(flag[0] > 0)


def gather(info: DistInfo, obj: T) -> list[T]:
    """Every rank's ``obj``, by rank (a collective: torch's ``all_gather_object``)."""
    if info.world_size == 1:
        return [obj]
    out: list[T | None] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return cast("list[T]", out)  # all_gather_object filled every slot with its rank's object
