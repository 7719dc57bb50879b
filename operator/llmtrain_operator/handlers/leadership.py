"""Leader election over a ``coordination.k8s.io`` Lease, as controller-runtime does it
(client-go's ``leaderelection``), so that exactly one operator replica writes.

- Every replica runs the watches and keeps its indexes warm; only the Lease holder
  plans and writes. A standby takes over without re-listing anything.
- The holder renews every ``retryPeriod``. It may write only until ``renewDeadline``
  after the start of its last successful renewal: if it cannot renew (API server
  unreachable, a long pause), it stops writing on its own before the Lease can expire
  (``leaseDuration`` > ``renewDeadline``), so two replicas never act at once.
- A standby counts the Lease's age on its own clock, from when it last saw the record
  change, never from the holder's timestamps (clock skew cannot hand the Lease over
  early). A holder killed outright is replaced within ``leaseDuration`` plus up to two
  retry periods; one that stops gracefully releases the Lease and the standby takes
  over at its next retry.
- Acquiring and renewing are replaces carrying the resourceVersion just read: of two
  replicas racing for an expired Lease exactly one wins.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, UTC
from typing import Any, Protocol

from .. import metrics
from ..k8s.lease import LeaseConflict, LeaseRecord, micro_time

log = logging.getLogger("llmtrain.leadership")


class LeaseStore(Protocol):
    def get(self) -> LeaseRecord | None: ...
    def create(self, record: LeaseRecord) -> LeaseRecord: ...
    def replace(self, record: LeaseRecord) -> LeaseRecord: ...


class Gate(Protocol):
    """What the reconcile loops ask before they plan and before they write."""

    term: int

    def holds(self) -> bool: ...
    async def wait(self) -> None: ...


class AlwaysLeader:
    """Leader election off (one replica, tests, ``llmtrain run``)."""

    identity = "standalone"
    term = 1

    def holds(self) -> bool:
        return True

    async def wait(self) -> None:
        return None


class Leadership:
    def __init__(self, lease: LeaseStore, identity: str, duration: float, renew_deadline: float, retry_period: float,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.lease = lease
        self.term = 0
        """One more each time this replica starts to hold the Lease (a renewal is no new
        term): what a pass remembers of the pods from an earlier term is stale
        (``reconcile.heard_in_term``)."""
        self.identity = identity
        self.duration = duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.wall = wall
        self._valid_until = 0.0
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._was_leader = False
        self._changed = asyncio.Event()

    # ------------------------------------------------------------------ the gate

    def holds(self) -> bool:
        """True while this replica may write."""
        return self.clock() < self._valid_until

    async def wait(self) -> None:
        """Until this replica holds the Lease."""
        while not self.holds():
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=self.retry_period)
            except TimeoutError:
                pass

    # ------------------------------------------------------------------ one attempt

    def try_acquire_or_renew(self) -> bool:
        """One round of client-go's ``tryAcquireOrRenew``. Returns True when this replica
        holds the Lease afterwards. Blocking (run it in a thread)."""
        started = self.clock()
        now = micro_time(self.wall())
        current = self.lease.get()
        if current is None:
            written = self.lease.create(LeaseRecord(self.identity, now, int(self.duration), 0, now))
            return self._won(written, started)
        if self._observed is None or (current.holder, current.renew_time, current.resource_version) != (
                self._observed.holder, self._observed.renew_time, self._observed.resource_version):
            self._observed, self._observed_at = current, started
        held_by_other = current.holder not in ("", self.identity)
        expires = self._observed_at + (current.duration_seconds or self.duration)
        if held_by_other and started < expires:
            return False
        mine = current.holder == self.identity
        record = LeaseRecord(
            holder=self.identity, renew_time=now, duration_seconds=int(self.duration),
            transitions=current.transitions + (0 if mine else 1),
            acquire_time=current.acquire_time if mine else now, resource_version=current.resource_version,
        )
        return self._won(self.lease.replace(record), started)

    def _won(self, written: LeaseRecord, started: float) -> bool:
        self._observed, self._observed_at = written, started
        if not self.holds():
            self.term += 1  # before holds() says so: no pass of the new term sees the old one
        self._valid_until = started + self.renew_deadline
        return True

    def release(self) -> None:
        """Give the Lease up on a graceful stop, so a standby need not wait for it to
        expire (client-go's ``ReleaseOnCancel``)."""
        if not self.holds() or self._observed is None:
            return
        self._valid_until = 0.0
        now = micro_time(self.wall())
        try:
            self.lease.replace(LeaseRecord("", now, 1, self._observed.transitions, self._observed.acquire_time,
                                           self._observed.resource_version))
            log.info("released the leader Lease (%s)", self.identity)
        except Exception as err:  # noqa: BLE001 - it expires on its own anyway
            log.warning("could not release the leader Lease: %s", err)

    # ------------------------------------------------------------------ the loop

    async def run(self, stopped: asyncio.Event) -> None:
        """Acquire, then renew every retry period, on a thread of its own: never queued
        behind the reconcile passes' API calls in the shared pool (a burst of creates or a
        slow API server there must not cost the leader its Lease). The Lease's client
        should have connections of its own too (``handlers.configure``)."""
        loop = asyncio.get_running_loop()
        own = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leader-election")
        try:
            await self._run(stopped, lambda fn: loop.run_in_executor(own, fn))
        finally:
            own.shutdown(wait=False)

    async def _run(self, stopped: asyncio.Event, call: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        while not stopped.is_set():
            try:
                await call(self.try_acquire_or_renew)
            except LeaseConflict as err:
                log.debug("%s", err)
            except Exception as err:  # noqa: BLE001 - the API server may be away; keep trying
                log.warning("leader election: %s", err)
            self._report()
            try:
                await asyncio.wait_for(stopped.wait(), timeout=self.retry_period)
            except TimeoutError:
                pass
        await call(self.release)
        self._report()

    def _report(self) -> None:
        leading = self.holds()
        if leading != self._was_leader:
            if leading:
                log.info("became the leader (%s): reconciling jobs", self.identity)
            else:
                log.warning("no longer the leader (%s): could not renew the Lease within %.0fs; standing by",
                            self.identity, self.renew_deadline)
            self._was_leader = leading
            self._changed.set()
        metrics.set_leader(leading)
