"""Bounded concurrency of reconcile passes, like controller-runtime's
``MaxConcurrentReconciles``.

A slot is held only for a pass's API work (dependency reads, planning, writes), not while
it scrapes trainers: a probe waits on a pod (up to its timeout), not on the API server,
and slow trainers must not starve every other job of slots. The wait for a slot is
exported as ``llmtrain_operator_reconcile_queue_seconds``, apart from the pass duration,
as controller-runtime separates work-queue wait from reconcile time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .. import metrics


class Slots:
    def __init__(self, count: int):
        self._free = asyncio.Semaphore(count)

    @asynccontextmanager
    async def held(self) -> AsyncIterator[float]:
        """Hold a slot; yields how many seconds the wait for it took."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        async with self._free:
            waited = loop.time() - due
            metrics.record_queue_wait(waited)
            yield waited


@asynccontextmanager
async def no_slot() -> AsyncIterator[float]:
    """No bound (API-contract tests, the scale benchmark's listing source)."""
    yield 0.0
