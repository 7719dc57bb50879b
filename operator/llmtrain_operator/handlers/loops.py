"""One asyncio loop per LLMTrainJob, owned by the operator (not a kopf daemon).

kopf daemons need a finalizer on every object, which every replica would write; these
loops are started and stopped from the job's watch events instead, so kopf itself never
writes and every write the operator makes goes through the leader gate.

Each loop: wait to be the leader -> one reconcile pass -> sleep until the planner's next
timer or a watch event about the job, its pods or a node (at most ``resyncSeconds``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

log = logging.getLogger("llmtrain.loops")

Key = tuple[str, str]


class JobLoops:
    def __init__(self, body_of_pass: Callable[[Key], Awaitable[float]]):
        """``body_of_pass(key)`` runs one pass and returns the seconds until the next."""
        self._pass = body_of_pass
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._wake: dict[Key, asyncio.Event] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}

    def body(self, key: Key) -> dict[str, Any] | None:
        """The newest body the watch delivered for the job (None once deleted)."""
        return self._bodies.get(key)

    def seen(self, key: Key, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event about the job itself."""
        if event_type == "DELETED":
            self._bodies.pop(key, None)
            task = self._tasks.pop(key, None)
            if task is not None:
                task.cancel()
            self._wake.pop(key, None)
            return
        self._bodies[key] = body
        if key not in self._tasks:
            self._wake[key] = asyncio.Event()
            self._tasks[key] = asyncio.create_task(self._loop(key), name=f"job {key[0]}/{key[1]}")
        self.wake(key)

    def wake(self, key: Key) -> None:
        event = self._wake.get(key)
        if event is not None:
            event.set()

    def wake_all(self) -> None:
        for event in self._wake.values():
            event.set()

    def keys(self) -> list[Key]:
        return list(self._tasks)

    async def _loop(self, key: Key) -> None:
        wake = self._wake[key]
        while key in self._bodies:
            wake.clear()
            try:
                delay = await self._pass(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug must not end the job's loop
                log.exception("job %s/%s: reconcile pass failed", *key)
                delay = 10.0
            try:
                await asyncio.wait_for(wake.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
