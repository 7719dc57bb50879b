"""Preemptive caching: a pod whose node-local tier lacks the job's newest checkpoint
starts pulling it there from a job-wide tier (shared filesystem, S3) the moment the pod
starts, while torch imports and the rendezvous forms, so that the restore finds it in
tier 1 and reads it locally.

The launcher starts it (``start``) for the built-in trainer with the DDP engine: its
state is replicated, so which step a node needs does not depend on the ranks it will get.
(A ZeRO rank's shard is known only after the rendezvous; that engine pulls on demand, as
before.) It pulls the newest committed step of the job's config from the fastest tier
holding one, when tier 1 has no step as new: the replicated state and every rank's RNG
file (small), each piece verified as a restore's pull verifies it.

It and the restore's own pull never write one step at once: the launcher marks tier 1
before the ranks start (``llmtrain_store.prefetching``), and a rank's pull waits for the
mark to go, then takes the prefetched copy when it is the step it needs. The prefetch
stages under an owner token of its own and commits without replacing a copy that is
already there.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any

import yaml
from llmtrain_contract.config import TrainerConfig
from llmtrain_store import manifest as mf
from llmtrain_store.build import build_tiers
from llmtrain_store.directory import DirTier
from llmtrain_store.owner import Scope
from llmtrain_store.prefetching import mark
from llmtrain_store.tier import CheckpointError, Committed, StepUnreadable

log = logging.getLogger("llmtrain.checkpoint")

OWNER = "llmtrain-prefetch"
"""The owner whose token keys the prefetch's staging folder (never a run's)."""


def config_of(command: list[str]) -> str | None:
    """The ``--config`` of a torchrun command running the built-in trainer."""
    for i, arg in enumerate(command):
        if arg == "-m" and command[i + 1:i + 2] == ["llmtrain_trainer"]:
            rest = command[i + 2:]
            for j, flag in enumerate(rest):
                if flag == "--config" and j + 1 < len(rest):
                    return rest[j + 1]
                if flag.startswith("--config="):
                    return flag.split("=", 1)[1]
    return None


def newest(cfg: TrainerConfig, tiers: list[Any]) -> Committed | None:
    """The newest committed, complete step of this config in the job-wide tiers, from
    the fastest tier holding it; None when tier 1 has one as new (or none is found)."""
    local, best = tiers[0], None
    try:
        have = [c.step for c in local.list()]
    except StepUnreadable as err:
        have = [c.step for c in err.listed]
    for tier in tiers[1:]:
        try:
            listed = tier.list()
        except StepUnreadable as err:
            listed = err.listed
        except Exception as err:  # noqa: BLE001 - a tier that cannot be listed now is the restore's to report
            log.info("prefetch: the %s tier cannot be listed (%s)", tier.name, type(err).__name__)
            continue
        for c in listed:
            same = c.manifest.get("config_hash") == cfg.config_hash() and c.manifest.get("strategy") == cfg.strategy.kind
            if same and c.complete and (best is None or c.step > best.step):
                best = c
    if best is None or (have and max(have) >= best.step):
        return None
    return best


@dataclass
class Prefetch:
    thread: threading.Thread | None = None
    outcome: str = "running"


def run(cfg: TrainerConfig, tiers: list[Any], commit_timeout: float = 600) -> str:
    """Pull the newest step into tier 1 if it lacks it; what happened, in words."""
    local: DirTier = tiers[0]  # build_tiers makes tier 1 a directory
    flag = mark(local)  # ``start`` wrote it already, before any rank ran
    try:
        found = newest(cfg, tiers)
        if found is None:
            return "tier 1 holds the newest checkpoint already (or there is none)"
        return _pull(cfg, local, found, commit_timeout)
    finally:
        flag.unlink(missing_ok=True)


def _pull(cfg: TrainerConfig, local: DirTier, found: Committed, commit_timeout: float) -> str:
    mine = DirTier(local.name, local.root, scope=Scope.of(OWNER))
    mine.sweep_staging()  # an earlier prefetch's, interrupted
    began = time.perf_counter()
    try:
        if (local.final(found.step) / mf.COMMITTED).exists():
            return f"step {found.step} is in tier 1 already"
        allowed = mf.ENGINE_FILES[cfg.strategy.kind]
        names = sorted(found.manifest["files"])
        staging = mine.staging(found.step)
        records = found.tier.fetch(found, names, staging, allowed)
        mine.write_part(found.step, 0, {"files": records})
        meta = {k: v for k, v in found.manifest.items() if k not in ("files", "ranks", "format", "step", "hash")}
        placed = mine.commit_unless_present(found.step, meta, {0}, found.ranks, commit_timeout)
        if placed is None:
            return f"step {found.step} was pulled into tier 1 meanwhile by a rank; the prefetched copy is dropped"
        size = sum(r["size"] for r in records.values())
        return (f"prefetched step {found.step} from the {found.tier.name} tier into tier 1 "
                f"({size} bytes in {time.perf_counter() - began:.2f}s)")
    except (CheckpointError, OSError, mf.ManifestRejected) as err:
        shutil.rmtree(mine.staging_path(found.step), ignore_errors=True)
        return f"prefetch of step {found.step} from the {found.tier.name} tier failed ({err}); the restore pulls on demand"


def start(command: list[str]) -> Prefetch | None:
    """At pod start: pull the job's newest checkpoint into tier 1 in the background (see
    the module's doc); None when there is nothing this can do for this command."""
    path = config_of(command)
    if path is None:
        return None
    try:
        with open(path) as fh:
            cfg = TrainerConfig.model_validate(yaml.safe_load(fh) or {})
    except Exception:  # noqa: BLE001 - the trainer reads it again and reports what is wrong
        return None
    if cfg.strategy.kind != "ddp" or len(cfg.checkpoint.tiers) < 2:
        return None
    try:
        tiers = build_tiers(cfg.checkpoint.tiers)
        assert isinstance(tiers[0], DirTier)  # build_tiers refuses any other tier 1
        mark(tiers[0])  # before the ranks start: a rank's pull waits for it (prefetching.wait_for)
    except Exception:  # noqa: BLE001 - the trainer builds them again and reports what is wrong
        return None
    handle = Prefetch()

    def work() -> None:
        try:
            handle.outcome = run(cfg, tiers)
        except Exception as err:  # noqa: BLE001 - never the launcher's failure: the restore pulls on demand
            handle.outcome = f"prefetch failed ({type(err).__name__}: {err}); the restore pulls on demand"
        print(f"llmtrain launcher: {handle.outcome}", flush=True)

    handle.thread = threading.Thread(name="ckpt-prefetch", daemon=True, target=work)
    handle.thread.start()
    return handle
