"""Pulling the agreed restore point into tier 1, where this rank reads it.

A copy in a slower tier (shared filesystem, S3), or a tier-1 copy stored in slices, is
pulled by the node leader into its tier 1, verified piece by piece, and committed there;
the node's other ranks wait for that commit. The next restart of this node then restores
locally. A pull that fails leaves a note in tier 1 so that the waiting ranks stop too,
and the agreement moves on to another copy.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmtrain_store import manifest as mf
from llmtrain_store.directory import DirTier
from llmtrain_store.health import classify
from llmtrain_store.prefetching import wait_for as wait_for_prefetch
from llmtrain_store.tier import CheckpointError, StepUnreadable

from llmtrain_trainer.checkpoint.health import Health
from llmtrain_trainer.checkpoint.protocol import Choice
from llmtrain_trainer.world import DistInfo

log = logging.getLogger("llmtrain.checkpoint")

PULL_FAILED = ".pull-failed-"
"""In tier 1: the node leader's pull of a step failed (the message); its ranks stop waiting."""


class Puller:
    def __init__(self, local: DirTier, info: DistInfo, allowed: re.Pattern[str], health: Health, metrics: Any,
                 commit_timeout: float, heartbeat: Callable[[], None]):
        self.local = local
        self.info = info
        self.allowed = allowed
        self.health = health
        self.metrics = metrics
        self.commit_timeout = commit_timeout
        self.heartbeat = heartbeat

    def forget_failed(self) -> None:
        """Before an agreement (whose collectives order this before any rank looks): the
        node leader removes the failure notes of earlier pulls."""
        if self.info.is_node_leader:
            for note in self.local.root.glob(PULL_FAILED + "*"):
                note.unlink(missing_ok=True)

    def localize(self, choice: Choice, timeout: float) -> Path:
        """Where this rank reads ``choice``'s files: in place when its copy is a tier-1
        folder holding them whole; else the node leader pulls the node's files into tier 1
        and the node's other ranks wait for that commit. Raises CheckpointError when the
        pull fails (on the leader, and on the ranks waiting for it)."""
        copy = choice.copy
        assert copy is not None
        if copy.tier is self.local:
            files = mf.entries(copy.manifest, self.allowed)
            if not any(files[n].sliced for n in choice.names if n in files):
                return Path(copy.location)
        if self.info.is_node_leader:
            self._pull(choice)
        else:
            self._wait_for_leader(choice.step, timeout)
        return self.local.final(choice.step)

    def _failure_note(self, step: int) -> Path:
        return self.local.root / f"{PULL_FAILED}{mf.step_dir(step)}"

    def _pull(self, choice: Choice) -> None:
        copy = choice.copy
        assert copy is not None
        failed = self._failure_note(choice.step)
        began = time.perf_counter()
        optional = frozenset(n for n in choice.names if mf.RNG_NAME.fullmatch(n))
        # A copy committed here already is either one that failed its check at the
        # agreement (this pull replaces it), or the pod's prefetch (the launcher's
        # prefetch.py) committed after the agreement listed tier 1: it is taken if it
        # verifies, and never replaced under a reader. One that appears while this
        # waits is the prefetch's, verified piece by piece as it was pulled.
        try:
            bad_copy = self._bad_copy(choice)
            self.local.root.mkdir(parents=True, exist_ok=True)
            failed.unlink(missing_ok=True)
            if bad_copy is False or (bad_copy is None and wait_for_prefetch(self.local, choice.step, self.commit_timeout,
                                                                            self.heartbeat)):
                log.info("step %d was prefetched into tier 1 when the pod started: read locally", choice.step)
                return
            staging = self.local.staging(choice.step)
            records = copy.tier.fetch(copy, choice.names, staging, self.allowed, self.heartbeat, optional=optional)
            self.local.write_part(choice.step, self.info.rank, {"files": records})
            meta = {k: v for k, v in copy.manifest.items() if k not in ("files", "ranks", "format", "step", "hash")}
            ranks = set(self.info.ranks_on_node())
            if bad_copy is True:
                self.local.commit(choice.step, meta, {self.info.rank}, ranks, self.commit_timeout, self.heartbeat)
            elif self.local.commit_unless_present(choice.step, meta, {self.info.rank}, ranks, self.commit_timeout) is None:
                log.info("step %d: the pod's prefetch committed it first; its copy is read", choice.step)
                return
        except Exception as err:  # any failure of a pull sends the agreement to another copy
            why = str(err) if isinstance(err, CheckpointError) else f"{copy.tier.name} tier: {classify(err).message}"
            self.health.failed(copy.tier.name, err)
            shutil.rmtree(self.local.staging(choice.step), ignore_errors=True)
            try:
                failed.write_text(why)  # the node's other ranks stop waiting
            except OSError:
                pass
            raise CheckpointError(f"pulling step {choice.step}: {why}") from err
        size = sum(r["size"] for r in records.values())
        seconds = time.perf_counter() - began
        self.metrics.restored_bytes(copy.tier.name, size, seconds)
        log.info("pulled step %d from the %s tier into tier 1 (%d bytes) in %.2fs", choice.step, copy.tier.name, size, seconds)

    def _bad_copy(self, choice: Choice) -> bool | None:
        """Whether tier 1's committed copy of the step fails its check: None when there is
        none, False when it holds the chosen files intact."""
        if not (self.local.final(choice.step) / mf.COMMITTED).exists():
            return None
        try:
            listed = self.local.list()
        except StepUnreadable as err:  # another step unreadable: this one may be listed still
            listed = err.listed
        copy = next((c for c in listed if c.step == choice.step), None)
        return copy is None or self.local.verify(copy, choice.names, self.allowed) is not None

    def _wait_for_leader(self, step: int, timeout: float) -> None:
        target = self.local.final(step)
        failed = self._failure_note(step)
        deadline = time.monotonic() + timeout
        while not (target / mf.COMMITTED).exists():
            if failed.exists():
                raise CheckpointError(f"pulling step {step}: the node leader's pull failed: {failed.read_text()}")
            if time.monotonic() > deadline:
                raise CheckpointError(f"the node leader did not pull step {step} into tier 1 within {timeout:.0f}s")
            self.heartbeat()
            time.sleep(0.1)
