"""Bounded concurrency of reconcile passes, like controller-runtime's
``MaxConcurrentReconciles``, with answers to events served first.

A slot is held only for a pass's API work (dependency reads, planning, writes), not while
it scrapes trainers: a probe waits on a pod (up to its timeout), not on the API server,
and slow trainers must not starve every other job of slots. The wait for a slot is
exported as ``llmtrain_operator_reconcile_queue_seconds``, apart from the pass duration,
as controller-runtime separates work-queue wait from reconcile time.

Two queues: a pass that answers a watch event (a pod failed, a spec changed) gets the
next free slot before any pass that only a timer or the periodic resync started, and a
routine pass still waiting when an event about its job comes is moved to the urgent
queue (``promote``): it reads what it plans from once it holds the slot, so it answers
that event. At hundreds of jobs the resyncs alone can keep every slot busy; they then
wait longer (the resync stretches), while a failure is still acted on within a pass.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from .. import metrics


class Slots:
    def __init__(self, count: int):
        self._free = count
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._routine: deque[asyncio.Future[None]] = deque()
        self._waiting: dict[Any, asyncio.Future[None]] = {}
        """A routine pass's turn by its job, while it waits."""
        self._marked: set[Any] = set()
        """Jobs an event came for while their pass was not (yet) waiting: it will be urgent."""

    @asynccontextmanager
    async def held(self, urgent: bool = False, key: Any = None) -> AsyncIterator[float]:
        """Hold a slot; yields how many seconds the wait for it took. ``urgent``: the
        pass answers an event and goes before every routine one waiting; ``key`` (the
        job) lets ``promote`` move a routine pass up while it waits."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        if key is not None and key in self._marked:
            self._marked.discard(key)
            urgent = True
        if self._free > 0 and not self._urgent and not self._routine:
            self._free -= 1
        else:
            turn = loop.create_future()
            (self._urgent if urgent else self._routine).append(turn)
            if not urgent and key is not None:
                self._waiting[key] = turn
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release()  # handed over just as the pass was cancelled: pass it on
                else:
                    for queue in (self._urgent, self._routine):
                        if turn in queue:
                            queue.remove(turn)
                raise
            finally:
                if key is not None and self._waiting.get(key) is turn:
                    del self._waiting[key]
        waited = loop.time() - due
        metrics.record_queue_wait(waited)
        try:
            yield waited
        finally:
            self._release()

    def promote(self, key: Any) -> None:
        """An event about ``key``'s job came while its routine pass waits: it is urgent now."""
        turn = self._waiting.pop(key, None)
        if turn is not None and turn in self._routine:
            self._routine.remove(turn)
            self._urgent.append(turn)
        elif turn is None:
            self._marked.add(key)

    def forget(self, key: Any) -> None:
        """The job is gone."""
        self._marked.discard(key)

    def _release(self) -> None:
        for queue in (self._urgent, self._routine):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1


@asynccontextmanager
async def no_slot(urgent: bool = False) -> AsyncIterator[float]:
    """No bound (API-contract tests, the scale benchmark's listing source)."""
    yield 0.0
