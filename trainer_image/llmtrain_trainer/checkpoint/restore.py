"""Choosing the checkpoint to resume from: the newest step every rank can load.

1. Every rank lists the committed checkpoints of every tier (cheap: no hashing).
2. The listings are all-gathered, so every rank computes the same candidate order.
3. For each candidate step, newest first, each rank verifies (sha256) the files it would
   load, from its fastest tier first, falling back to slower tiers; the results are
   all-gathered; the first step that works for everybody wins.

How a step can be loaded depends on the strategy:
- *replicated* state (DDP): any one verified copy suffices. Ranks without a copy (a
  replacement node with an empty local disk) receive the state by broadcast from the
  lowest rank that has one.
- *sharded* state (DeepSpeed ZeRO): at the same world size each rank needs the shared
  model file and its own shard; at another world size a complete copy visible to every
  rank (the shared tier, or one node's disk when every rank is on that node) is
  converted into a universal checkpoint.

The decision functions here are pure, so they are unit-tested without processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

Listing = dict[int, list[dict[str, Any]]]
"""step -> copies, fastest tier first: {tier, path, world, ranks, samples, max_steps}."""

Mode = Literal["local", "broadcast", "universal"]


@dataclass(frozen=True)
class Candidate:
    step: int
    mode: Mode
    samples: int
    saved_world: int
    source_rank: int = 0
    """``broadcast``: the rank that reads from disk. ``universal``: the converter."""
    shared_path: str | None = None
    """``universal``: the complete copy every rank can see."""
    saved_max_steps: int | None = None
    """``maxSteps`` of the run that saved it (None: saved before it was recorded)."""


@dataclass
class Choice:
    step: int
    mode: Mode
    samples: int
    saved_world: int
    path: Path | None
    """The folder this rank reads (None when it receives the state by broadcast)."""
    tier: str | None
    """The tier this rank reads (None when it receives the state by broadcast)."""
    source_rank: int = 0
    source_tier: str | None = None
    """The tier the state came from: the source rank's tier for a broadcast or universal
    load, this rank's own tier for a local one. Logged and exported, so the message is the
    same whichever node rank 0 lands on."""
    saved_max_steps: int | None = None


@dataclass
class Survey:
    """What one rank found, for the final error message when nothing is loadable."""

    problems: list[str] = field(default_factory=list)


def listing_of(tiers: list[Any], config_hash: str, strategy: str, problems: list[str]) -> Listing:
    """This rank's view of every tier, fastest first. Checkpoints of another config or
    strategy are not candidates (resuming them would silently change the run)."""
    out: Listing = {}
    for tier in tiers:
        for committed in tier.list():
            man = committed.manifest
            if man.get("config_hash") != config_hash:
                problems.append(f"{tier.name}: step {committed.step} was written by another config ({man.get('config_hash')})")
                continue
            if man.get("strategy") != strategy:
                problems.append(f"{tier.name}: step {committed.step} was written by strategy {man.get('strategy')}")
                continue
            out.setdefault(committed.step, []).append(
                {
                    "tier": tier.name,
                    "path": str(committed.path),
                    "world": committed.world_size,
                    "ranks": sorted(committed.ranks),
                    "samples": int(man["samples_consumed"]),
                    "max_steps": man.get("max_steps"),
                }
            )
    return out


def candidates(listings: list[Listing], world: int, sharded: bool) -> list[Candidate]:
    """Every step some rank lists, newest first, each with the ways it could be loaded
    (cheapest first)."""
    steps = sorted({s for listing in listings for s in listing}, reverse=True)
    out: list[Candidate] = []
    for step in steps:
        copies = [listing.get(step, []) for listing in listings]
        first = next(c[0] for c in copies if c)
        samples, saved_world, saved_max = first["samples"], first["world"], first.get("max_steps")
        if not sharded:
            holders = [r for r, c in enumerate(copies) if c]
            if len(holders) == len(copies):
                out.append(Candidate(step, "local", samples, saved_world, saved_max_steps=saved_max))
            out.append(Candidate(step, "broadcast", samples, saved_world, source_rank=holders[0], saved_max_steps=saved_max))
            continue
        if saved_world == world and all(any(r in c["ranks"] for c in cs) for r, cs in enumerate(copies)):
            out.append(Candidate(step, "local", samples, saved_world, saved_max_steps=saved_max))
        shared = _complete_everywhere(copies)
        if shared:
            out.append(Candidate(step, "universal", samples, saved_world, shared_path=shared, saved_max_steps=saved_max))
    return out


def _complete_everywhere(copies: list[list[dict[str, Any]]]) -> str | None:
    """A path holding a complete copy that every rank can see, if any."""
    seen = [{c["path"] for c in cs if c["ranks"] == list(range(c["world"]))} for cs in copies]
    common = set.intersection(*seen) if seen else set()
    return min(common) if common else None


def can_serve(candidate: Candidate, copy: dict[str, Any], rank: int, sharded: bool) -> bool:
    """Whether one tier's copy can serve this rank for this way of loading."""
    if candidate.mode == "universal":
        return copy["path"] == candidate.shared_path
    if candidate.mode == "local" and sharded:
        return rank in copy["ranks"]
    return True


def files_to_verify(candidate: Candidate, manifest_files: list[str], rank: int, file_rank: Callable[[str], int | None]) -> list[str]:
    """Files this rank must verify before the load. The others verify nothing when one
    rank reads for everybody (broadcast source, universal converter)."""
    shared = [n for n in manifest_files if file_rank(n) is None]
    if candidate.mode == "universal":
        return manifest_files if rank == candidate.source_rank else []
    if candidate.mode == "broadcast":
        return shared if rank == candidate.source_rank else []
    return shared + [n for n in manifest_files if file_rank(n) == rank]


class NoLoadableCheckpoint(Exception):
    """Checkpoints exist, but no step can be loaded by every rank."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("no checkpoint can be loaded by every rank: " + "; ".join(problems[:10]))


def find_restore_point(
    tiers: list[Any],
    rank: int,
    world: int,
    config_hash: str,
    strategy: str,
    sharded: bool,
    file_rank: Callable[[str], int | None],
    gather: Callable[[Any], list[Any]],
) -> Choice | None:
    """Run the agreement (``gather`` is an all-gather of Python objects). Returns None when
    no checkpoint exists anywhere (a fresh start); raises NoLoadableCheckpoint when some
    exist but none is loadable by everybody."""
    problems: list[str] = []
    listing = listing_of(tiers, config_hash, strategy, problems)
    committed = {str(c.path): (t, c) for t in tiers for c in t.list()}
    listings = gather(listing)
    for cand in candidates(listings, world, sharded):
        ok, path, tier_name, why = _check(cand, listing.get(cand.step, []), committed, rank, sharded, file_rank)
        results = gather((ok, why, tier_name))
        if all(r[0] for r in results):
            source_tier = tier_name if cand.mode == "local" else results[cand.source_rank][2]
            return Choice(cand.step, cand.mode, cand.samples, cand.saved_world, path, tier_name, cand.source_rank, source_tier,
                          cand.saved_max_steps)
        problems.extend(f"step {cand.step} ({cand.mode}): {r[1]}" for r in results if not r[0] and r[1])
    all_problems = [p for ps in gather(problems) for p in ps]
    if any(listings) or all_problems:
        raise NoLoadableCheckpoint(sorted(set(all_problems)) or ["no step is held by every rank"])
    return None


def _check(
    cand: Candidate,
    copies: list[dict[str, Any]],
    committed: dict[str, Any],
    rank: int,
    sharded: bool,
    file_rank: Callable[[str], int | None],
) -> tuple[bool, Path | None, str | None, str]:
    if cand.mode == "broadcast" and rank != cand.source_rank:
        return True, None, None, ""
    if cand.mode == "universal" and rank != cand.source_rank:
        tier, _ = committed.get(cand.shared_path, (None, None))
        return True, Path(cand.shared_path), tier.name if tier else None, ""
    reasons = []
    for copy in copies:
        if not can_serve(cand, copy, rank, sharded):
            continue
        tier, found = committed[copy["path"]]
        names = files_to_verify(cand, list(found.manifest["files"]), rank, file_rank)
        why = tier.verify_cached(found, names)
        if why is None:
            return True, found.path, tier.name, ""
        reasons.append(f"rank {rank}, {tier.name} tier: {why}")
    return False, None, None, "; ".join(reasons) or f"rank {rank} has no copy"
