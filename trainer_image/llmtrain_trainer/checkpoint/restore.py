"""Choosing the checkpoint to resume from: the newest step every rank can load.

1. Every rank lists the committed checkpoints of every tier (node-local disk, shared
   filesystem, S3), checks each manifest (names, sizes, slices; ``llmtrain_store.manifest``)
   and drops what fails, saying why.
2. The listings are all-gathered, so every rank computes the same candidate order.
3. For each candidate step, newest first, each rank verifies what it would load, from its
   fastest tier first (a directory copy: every byte against its hash; S3: names and
   sizes, the bytes are hashed as they are fetched), falling back to slower tiers; the
   results are all-gathered; the first step that works for everybody wins. Every
   rejected copy is logged with the reason.

How a step can be loaded depends on the strategy:
- *replicated* state (DDP): any one verified copy suffices. Ranks without a copy (a
  replacement node with an empty local disk) receive the state by broadcast from the
  lowest rank that has one.
- *sharded* state (DeepSpeed ZeRO): at the same world size each rank needs the model file
  and its own shard; at another world size a complete copy is converted into a universal
  checkpoint: from one node's disk when every rank is on that node, else from a job-wide
  tier (shared or S3) that every node pulls.

A copy in a slower tier is first pulled into tier 1 (by the node leader, verified piece by
piece), then loaded from there: the next restart of this node restores locally.

The decision functions here are pure, so they are unit-tested without processes.
"""

from __future__ import annotations

import bisect
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from llmtrain_store import manifest as mf
from llmtrain_store.health import classify
from llmtrain_store.owner import lineage_of
from llmtrain_store.tier import StepUnreadable

from llmtrain_trainer.checkpoint.protocol import Choice, Mode

log = logging.getLogger("llmtrain.restore")

Listing = dict[int, list[dict[str, Any]]]
"""step -> copies, fastest tier first: {tier, index, location, world, ranks, samples, max_steps};
``ranks`` as ``rank_ranges``."""
RankRanges = list[tuple[int, int]]


def rank_ranges(ranks: list[int]) -> RankRanges:
    """Sorted ranks as ``[start, stop)`` runs: what a copy holds, in the size of its runs
    (one for a complete copy), not of the world. Every rank gathers every rank's listing,
    so a list of ranks there would cost each rank the world size squared."""
    out: RankRanges = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r:
            out[-1] = (out[-1][0], r + 1)
        else:
            out.append((r, r + 1))
    return out


def holds(ranges: RankRanges, rank: int) -> bool:
    i = bisect.bisect_right(ranges, rank, key=lambda run: run[0]) - 1
    return i >= 0 and ranges[i][0] <= rank < ranges[i][1]


def covers(ranges: RankRanges, world: int) -> bool:
    """The copy holds every rank of its world (a complete copy)."""
    return len(ranges) == 1 and tuple(ranges[0]) == (0, world)


@dataclass(frozen=True)
class Candidate:
    step: int
    mode: Mode
    samples: int
    saved_world: int
    source_rank: int = 0
    """``broadcast``: the rank that reads from disk."""
    universal_tier: str | None = None
    """``universal``: the tier holding a complete copy every node can reach."""
    saved_max_steps: int | None = None
    """``maxSteps`` of the run that saved it (None: not recorded)."""
    data: dict | None = field(default=None, hash=False, compare=False)
    """The data position it recorded: skipped windows, rollbacks (None: none)."""
    lineage: tuple[str, ...] = ()
    """The owners whose history it continues (``llmtrain_store.owner``)."""


class TierUnavailable(Exception):
    """A tier cannot be listed for a reason that may pass (unreachable, 5xx, timeout) and
    no other tier holds a checkpoint: whether committed progress exists cannot be told,
    so the trainer exits retryable instead of starting over."""


CONFIG_REASONS = {"CredentialsRefused", "NoCredentials", "NoSuchBucket", "PermissionDenied"}
"""Tier failures that waiting does not cure: the restore goes on without the tier."""
LIST_RETRIES = (2.0, 4.0, 8.0)
"""Seconds between tries to list a tier that fails for a reason that may pass."""


@dataclass
class Unlisted:
    tier: str
    reason: str
    message: str
    unreadable: bool = False
    """The tier listed a step it could not read (``StepUnreadable``): committed progress
    may be there, whatever the reason, so this never lets a job start over."""

    @property
    def transient(self) -> bool:
        return self.unreadable or self.reason not in CONFIG_REASONS


def _list(tier: Any, on_error: Callable[[str, BaseException], object],
          sleep: Callable[[float], None]) -> tuple[list[Any] | None, Unlisted | None]:
    for pause in (*LIST_RETRIES, None):
        try:
            return tier.list(), None
        except Exception as err:  # noqa: BLE001 - classified; an unreachable tier must not crash a restore
            on_error(tier.name, err)
            found = classify(err)
            if isinstance(err, StepUnreadable) and pause is None:
                # The steps that were read are candidates; the others may be newer progress:
                # named, and with nothing found anywhere the run exits retryable.
                return err.listed, Unlisted(tier.name, found.reason, f"{err.what}: {found.message}", True)
            if (found.reason in CONFIG_REASONS and not isinstance(err, StepUnreadable)) or pause is None:
                return None, Unlisted(tier.name, found.reason, found.message)
            log.warning("%s tier: cannot list checkpoints (%s); trying again in %.0fs", tier.name, found.message, pause)
            sleep(pause)
    return None, None  # unreachable: the loop returns


def listing_of(tiers: list[Any], config_hash: str, strategy: str, allowed: re.Pattern[str], problems: list[str],
               on_error: Callable[[str, BaseException], object] = lambda tier, err: None,
               sleep: Callable[[float], None] = time.sleep, excluded: frozenset[tuple[str, int]] = frozenset(),
               ) -> tuple[Listing, dict[tuple[str, str], Any], list[Unlisted]]:
    """This rank's view of every tier, fastest first: the candidates, the committed
    checkpoints by (tier, location), and the tiers that could not be listed. A checkpoint
    of another config or strategy, or whose manifest fails its checks, is not a candidate
    (with the reason)."""
    out: Listing = {}
    found: dict[tuple[str, str], Any] = {}
    unlisted: list[Unlisted] = []
    for index, tier in enumerate(tiers):
        committed, failure = _list(tier, on_error, sleep)
        if failure is not None:
            unlisted.append(failure)
        if committed is None:
            continue
        for c in committed:
            man = c.manifest
            if (tier.name, c.step) in excluded:
                continue  # its pull failed in an earlier round of this restore
            if man.get("config_hash") != config_hash:
                problems.append(f"{tier.name}: step {c.step} was written by another config ({str(man.get('config_hash'))[:40]}; "
                                f"this run's is {config_hash}: the model, data, optimizer, batch, seed, freeze or lora differ)")
                continue
            if man.get("strategy") != strategy:
                problems.append(f"{tier.name}: step {c.step} was written by strategy {man.get('strategy')}")
                continue
            try:
                mf.entries(man, allowed)
                world, ranks, samples = int(man["world_size"]), [int(r) for r in man["ranks"]], int(man["samples_consumed"])
            except (mf.ManifestRejected, KeyError, TypeError, ValueError) as err:
                problems.append(f"{tier.name}: step {c.step} rejected: {err}")
                continue
            found[(tier.name, c.location)] = c
            out.setdefault(c.step, []).append({
                "tier": tier.name, "index": index, "location": c.location, "world": world, "ranks": rank_ranges(ranks),
                "samples": samples, "max_steps": man.get("max_steps"), "data": man.get("data"),
                "lineage": tuple(lineage_of(man)),
            })
    return out, found, unlisted


def candidates(listings: list[Listing], world: int, sharded: bool) -> list[Candidate]:
    """Every step some rank lists, newest first, each with the ways it could be loaded
    (cheapest first)."""
    steps = sorted({s for listing in listings for s in listing}, reverse=True)
    out: list[Candidate] = []
    for step in steps:
        copies = [listing.get(step, []) for listing in listings]
        first = next(c[0] for c in copies if c)
        samples, saved_world, saved_max, data = first["samples"], first["world"], first.get("max_steps"), first.get("data")
        lineage = first.get("lineage", ())
        if not sharded:
            holders = [r for r, c in enumerate(copies) if c]
            if len(holders) == len(copies):
                out.append(Candidate(step, "local", samples, saved_world, saved_max_steps=saved_max, data=data, lineage=lineage))
            # The source should read from its fastest copy: prefer a rank holding it in tier 1.
            # Every holder is a candidate source, so that one bad copy (which fails its
            # source's check) falls back to another rank's copy of the same step, not to
            # an older step.
            for source in sorted(holders, key=lambda r: (copies[r][0]["index"], r)):
                out.append(Candidate(step, "broadcast", samples, saved_world, source_rank=source, saved_max_steps=saved_max,
                                     data=data, lineage=lineage))
            continue
        if saved_world == world and all(any(holds(c["ranks"], r) for c in cs) for r, cs in enumerate(copies)):
            out.append(Candidate(step, "local", samples, saved_world, saved_max_steps=saved_max, data=data, lineage=lineage))
        tier = _complete_everywhere(copies)
        if tier:
            out.append(Candidate(step, "universal", samples, saved_world, universal_tier=tier, saved_max_steps=saved_max,
                                 data=data, lineage=lineage))
    return out


def _complete_everywhere(copies: list[list[dict[str, Any]]]) -> str | None:
    """A tier holding a complete copy that every rank can reach: the same location in
    every rank's listing (one node's disk, all ranks on it), else a job-wide tier."""
    complete = [{(c["tier"], c["location"]) for c in cs if covers(c["ranks"], c["world"])} for cs in copies]
    common = set.intersection(*complete) if complete else set()
    return min(common)[0] if common else None


def can_serve(candidate: Candidate, copy: dict[str, Any], rank: int, sharded: bool) -> bool:
    """Whether one tier's copy can serve this rank for this way of loading."""
    if candidate.mode == "universal":
        return copy["tier"] == candidate.universal_tier
    if candidate.mode == "local" and sharded:
        return holds(copy["ranks"], rank)
    return True


def files_to_verify(candidate: Candidate, manifest_files: list[str], rank: int, file_rank: Callable[[str], int | None],
                    node_ranks: list[int]) -> list[str]:
    """Files this rank loads (and must verify first): the shared engine files and its
    own, or (a universal conversion) every file; plus its RNG state when the world size is
    the same. The ranks of a node share its tier 1, so the node leader also fetches its
    local ranks' files (``node_ranks``)."""
    mine = set(node_ranks)
    if candidate.mode == "universal":
        names = [n for n in manifest_files if not mf.RNG_NAME.fullmatch(n)]
    else:
        names = [n for n in manifest_files if not mf.RNG_NAME.fullmatch(n) and (file_rank(n) is None or file_rank(n) in mine)]
    rng = [n for n in manifest_files if mf.RNG_NAME.fullmatch(n) and int(n[9:14]) in mine]
    return names + rng


class NoLoadableCheckpoint(Exception):
    """Checkpoints exist, but no step can be loaded by every rank."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("no checkpoint can be loaded by every rank: " + "; ".join(problems[:10]))


def find_restore_point(
    tiers: list[Any],
    rank: int,
    world: int,
    node_ranks: list[int],
    config_hash: str,
    strategy: str,
    sharded: bool,
    allowed: re.Pattern[str],
    file_rank: Callable[[str], int | None],
    gather: Callable[[Any], list[Any]],
    on_error: Callable[[str, BaseException], object] = lambda tier, err: None,
    sleep: Callable[[float], None] = time.sleep,
    excluded: frozenset[tuple[str, int]] = frozenset(),
) -> Choice | None:
    """Run the agreement (``gather`` is an all-gather of Python objects). Returns None when
    no checkpoint exists anywhere (a fresh start); raises NoLoadableCheckpoint when some
    exist but none is loadable by everybody, and TierUnavailable when none was found
    but a tier could not be listed for a reason that may pass. Every rejection is logged.
    ``on_error`` hears of each tier that fails (its health); ``excluded`` (tier, step)
    copies are not considered (their pull failed)."""
    problems: list[str] = []
    listing, committed, unlisted = listing_of(tiers, config_hash, strategy, allowed, problems, on_error, sleep, excluded)
    listings = gather(listing)
    everyone_unlisted = [u for us in gather(unlisted) for u in us]
    if rank == 0:
        for problem in sorted({p for ps in gather(problems) for p in ps}):
            log.warning("checkpoint skipped: %s", problem)
        for u in {(u.tier, u.message): u for u in everyone_unlisted}.values():
            if u.unreadable:
                log.error("%s tier: %s; restoring from the steps that could be read", u.tier, u.message)
            else:
                log.error("%s tier: cannot list checkpoints: %s; restoring without it", u.tier, u.message)
    else:
        gather(problems)
    for cand in candidates(listings, world, sharded):
        ok, copy, tier_name, why, names = _check(cand, listing.get(cand.step, []), committed, rank, sharded, allowed, file_rank,
                                                 node_ranks)
        results = gather((ok, why, tier_name))
        if all(r[0] for r in results):
            source_tier = results[cand.source_rank][2] if cand.mode == "broadcast" else tier_name
            return Choice(cand.step, cand.mode, cand.samples, cand.saved_world, copy, tier_name, cand.source_rank, source_tier,
                          cand.saved_max_steps, names, cand.data, list(cand.lineage))
        reasons = [f"step {cand.step} ({cand.mode}): {r[1]}" for r in results if not r[0] and r[1]]
        if rank == 0:
            for reason in reasons:
                log.warning("falling back from %s", reason)
        problems.extend(reasons)
    all_problems = [p for ps in gather(problems) for p in ps]
    if any(listings) or all_problems:
        raise NoLoadableCheckpoint(sorted(set(all_problems)) or ["no step is held by every rank"])
    transient = sorted({f"{u.tier} tier: {u.message}" for u in everyone_unlisted if u.transient})
    if transient:
        raise TierUnavailable("no checkpoint found, and whether one exists cannot be told: " + "; ".join(transient))
    return None


def _usable_rng(found: Any, names: list[str], allowed: re.Pattern[str], step: int) -> list[str]:
    """The RNG files that verify. One that does not costs only its rank's exact random
    stream (the rank derives one), not the step: it is dropped with a warning."""
    usable = []
    for name in (n for n in names if mf.RNG_NAME.fullmatch(n)):
        why = found.tier.verify(found, [name], allowed)
        if why is None:
            usable.append(name)
        else:
            log.warning("step %d: %s tier: %s; that rank derives its RNG state", step, found.tier.name, why)
    return usable


def _check(cand: Candidate, copies: list[dict[str, Any]], committed: dict[tuple[str, str], Any], rank: int, sharded: bool,
           allowed: re.Pattern[str], file_rank: Callable[[str], int | None], node_ranks: list[int]
           ) -> tuple[bool, Any | None, str | None, str, list[str]]:
    if cand.mode == "broadcast" and rank != cand.source_rank:
        return True, None, None, "", []
    reasons = []
    for copy in copies:
        if not can_serve(cand, copy, rank, sharded):
            continue
        found = committed.get((copy["tier"], copy["location"]))
        if found is None:
            continue
        names = files_to_verify(cand, list(found.manifest["files"]), rank, file_rank, node_ranks)
        engine = [n for n in names if not mf.RNG_NAME.fullmatch(n)]
        why = found.tier.verify(found, engine, allowed)
        if why is None:
            return True, found, found.tier.name, "", engine + _usable_rng(found, names, allowed, cand.step)
        reasons.append(f"rank {rank}, {found.tier.name} tier: {why}")
        # Said by the rank that saw it, even when a slower tier serves the step after all.
        log.warning("step %d: not using the %s tier's copy: %s", cand.step, found.tier.name, why)
    return False, None, None, "; ".join(reasons) or f"rank {rank} has no copy", []
