"""One asyncio loop per LLMTrainJob, owned by the operator (not a kopf daemon).

kopf daemons need a finalizer on every object, which every replica would write; these
loops are started and stopped from the job's watch events instead, so kopf itself never
writes and every write the operator makes goes through the leader gate.

Each loop: wait to be the leader -> one reconcile pass -> sleep until the planner's next
timer or a watch event that wakes it (at most ``resyncSeconds``). Which events wake a
job is decided here and in ``wakes.py`` (docs/operator.md, "What wakes a job"): a change
to the job's status alone does not, since the operator wrote it itself.

A deadline the planner marks urgent (a node's grace ending, a replacement's backoff:
``Plan.urgent_after``) wakes the loop as a watch event does: its pass goes ahead of the
routine ones (``slots.py``) and its latency is counted from the deadline. At 64 jobs a
node lost under all of them ended 64 graces at once, and their passes queued behind the
resyncs.

Event to action: the loop remembers when the earliest watch event it has not acted on
arrived. A pass that completes (its writes acknowledged) reports the time since then
(``llmtrain_operator_event_to_action_seconds``); a pass that fails leaves the event
pending, so the retry's latency counts from the original event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Awaitable, Callable

from .wakes import beyond_status

log = logging.getLogger("llmtrain.loops")

Key = tuple[str, str]


@dataclass(frozen=True)
class Next:
    """When a job's next pass is due: ``after`` seconds at the latest, and
    (``urgent_after``) an urgent deadline's, if any."""

    after: float
    urgent_after: float | None = None


class JobLoops:
    def __init__(self, body_of_pass: Callable[[Key], Awaitable[float | Next]], on_acted: Callable[[float], None] | None = None,
                 on_wake: Callable[[Key], None] | None = None, clock: Callable[[], float] = time.monotonic):
        """``body_of_pass(key)`` runs one pass and returns the seconds until the next (or
        a ``Next``); it calls ``observe(key)`` when it reads what it plans from, and
        ``acted(key)`` once its writes are acknowledged. ``on_acted`` receives each
        event-to-action latency; ``on_wake(key)`` hears of every event that wakes a job (a
        pass of it that waits for a slot is then promoted)."""
        self._pass = body_of_pass
        self._on_acted = on_acted
        self._on_wake = on_wake
        self._clock = clock
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._wake: dict[Key, asyncio.Event] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._pending: dict[Key, float] = {}
        """The arrival of the earliest event about the job that no pass has acted on yet."""
        self._taken: dict[Key, float] = {}
        """The event the running pass answers."""

    def body(self, key: Key) -> dict[str, Any] | None:
        """The newest body the watch delivered for the job (None once deleted)."""
        return self._bodies.get(key)

    def bodies(self) -> dict[Key, dict[str, Any]]:
        return self._bodies

    def seen(self, key: Key, event_type: str | None, body: dict[str, Any]) -> bool:
        """A watch event about the job itself. Returns whether it woke the job's loop:
        not when only the status (or the resourceVersion) changed."""
        if event_type == "DELETED":
            self._bodies.pop(key, None)
            task = self._tasks.pop(key, None)
            if task is not None:
                task.cancel()
            self._wake.pop(key, None)
            self._pending.pop(key, None)
            self._taken.pop(key, None)
            return False
        before = self._bodies.get(key)
        self._bodies[key] = body
        if key not in self._tasks:
            self._wake[key] = asyncio.Event()
            self._tasks[key] = asyncio.create_task(self._loop(key), name=f"job {key[0]}/{key[1]}")
        elif before is not None and not beyond_status(before, body):
            return False
        self.wake(key)
        return True

    def wake(self, key: Key) -> None:
        event = self._wake.get(key)
        if event is not None:
            self._pending.setdefault(key, self._clock())
            event.set()
            if self._on_wake is not None:
                self._on_wake(key)

    def observe(self, key: Key) -> None:
        """The running pass reads the job's state now: it answers every event so far (a
        later one wakes the loop again)."""
        wake = self._wake.get(key)
        pending = self._pending.pop(key, None)
        if wake is None or pending is None:
            return
        wake.clear()
        self._taken[key] = min(pending, self._taken.get(key, pending))

    def keys(self) -> list[Key]:
        return list(self._tasks)

    def answering(self, key: Key) -> bool:
        """Whether the running pass answers a watch event (not only a timer)."""
        return key in self._taken

    def count_from_now(self, key: Key) -> None:
        """The running pass waited to lead: the events it answers count from now (a
        standby's events wait for the takeover, which is not the pass's latency)."""
        if key in self._taken:
            self._taken[key] = self._clock()

    def acted(self, key: Key) -> None:
        """The running pass's writes are acknowledged: the event it answers is done."""
        since = self._taken.pop(key, None)
        if since is not None and self._on_acted is not None:
            self._on_acted(self._clock() - since)

    async def _loop(self, key: Key) -> None:
        wake = self._wake[key]
        while key in self._bodies:
            wake.clear()
            taken = self._pending.pop(key, None)
            if taken is not None:
                self._taken[key] = taken
            try:
                due = await self._pass(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the job's loop (logged with its traceback)
                log.exception("job %s/%s: reconcile pass failed", *key)
                due = 10.0
            nxt = due if isinstance(due, Next) else Next(due)
            unanswered = self._taken.pop(key, None)
            if unanswered is not None and key in self._bodies:  # the pass failed: the event is still to act on
                self._pending[key] = min(unanswered, self._pending.get(key, unanswered))
            urgent = nxt.urgent_after is not None and nxt.urgent_after <= nxt.after
            try:
                await asyncio.wait_for(wake.wait(), timeout=nxt.urgent_after if urgent else nxt.after)
            except TimeoutError:
                if urgent and key in self._bodies:
                    self._pending.setdefault(key, self._clock())  # the deadline, answered as an event

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
