"""Each tier's health, as this rank sees it: logged on every change, exported as metrics
(the operator turns them into the job's ``CheckpointTierDegraded`` condition).

The reason is one of ``llmtrain_store.health.REASONS``, classified from the error;
the raw text of a remote error (which may quote a rejected key) is never logged.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from llmtrain_store.health import Degraded, classify

log = logging.getLogger("llmtrain.checkpoint")


class Health:
    def __init__(self, metrics: Any, tiers: list[str]):
        self.metrics = metrics
        self._state: dict[str, Degraded | None] = {}
        self._lock = threading.Lock()
        for tier in tiers:
            metrics.tier_health(tier, None)

    def failed(self, tier: str, err: BaseException, retry_in: float | None = None) -> Degraded:
        degraded = classify(err)
        with self._lock:
            changed = self._state.get(tier) != degraded
            self._state[tier] = degraded
        self.metrics.checkpoint_failed(tier, degraded.reason)
        if changed:
            again = f"; retrying in {retry_in:.0f}s" if retry_in else ""
            log.warning("%s tier degraded: %s; training goes on%s", tier, degraded.message, again)
        return degraded

    def ok(self, tier: str, step: int) -> None:
        with self._lock:
            was = self._state.get(tier)
            self._state[tier] = None
        self.metrics.tier_health(tier, None)
        if was is not None:
            log.warning("%s tier healthy again: caught up at step %d", tier, step)

    def of(self, tier: str) -> Degraded | None:
        with self._lock:
            return self._state.get(tier)
