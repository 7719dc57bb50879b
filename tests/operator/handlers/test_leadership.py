"""Leader election over a Lease: one writer at a time, whatever the timing.

The store below behaves like the API server for one Lease (resourceVersions, 409 on a
stale replace or a second create); the clocks are fake, so every timing is exact."""

from __future__ import annotations

import importlib

import itertools
from dataclasses import replace
from datetime import datetime, timedelta, UTC

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llmtrain_operator.handlers.leadership import Leadership
from llmtrain_operator.probe import LauncherReport
from support.planning import worker
from llmtrain_operator.k8s.lease import LeaseConflict, LeaseRecord

DURATION, RENEW, RETRY = 15.0, 10.0, 2.0


class Store:
    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.versions = itertools.count(1)
        self.down = False

    def get(self) -> LeaseRecord | None:
        if self.down:
            raise OSError("API server unreachable")
        return self.record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise OSError("API server unreachable")
        if self.record is not None:
            raise LeaseConflict("exists")
        self.record = replace(record, resource_version=str(next(self.versions)))
        return self.record

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        if self.down:
            raise OSError("API server unreachable")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("stale")
        self.record = replace(record, resource_version=str(next(self.versions)))
        return self.record


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(store: Store, name: str, clock: Clock) -> Leadership:
    wall = lambda: datetime(2026, 11, 22, tzinfo=UTC) + timedelta(seconds=clock.t)  # noqa: E731
    return Leadership(store, name, DURATION, RENEW, RETRY, clock=clock, wall=wall)


def attempt(e: Leadership) -> bool:
    try:
        return e.try_acquire_or_renew()
    except (LeaseConflict, OSError):
        return False


def test_the_first_replica_takes_the_lease_and_the_second_stands_by():
    store, clock = Store(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert attempt(a) and a.holds()
    assert not attempt(b) and not b.holds()
    for _ in range(20):  # a renews every retry period; b never gets in
        clock.t += RETRY
        assert attempt(a) and not attempt(b)
    assert store.record.holder == "a" and store.record.transitions == 0


def test_two_replicas_racing_for_a_free_lease_cannot_both_win():
    store, clock = Store(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    store.create(LeaseRecord("", None, 1))  # released earlier
    # Both read the same version; the second replace carries a stale resourceVersion.
    seen = store.get()
    store.get = lambda: seen  # type: ignore[method-assign]
    results = [attempt(a), attempt(b)]
    assert results.count(True) == 1


def test_a_killed_holder_is_replaced_after_the_lease_duration_counted_on_the_standbys_clock():
    store, clock = Store(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert attempt(a)
    clock.t += RETRY
    assert not attempt(b)  # b sees a's record now: its clock for the Lease starts here
    observed = clock.t
    # a is killed: no more renewals, no release.
    while not attempt(b):
        clock.t += RETRY
    assert clock.t - observed >= DURATION
    assert clock.t - observed <= DURATION + RETRY
    assert store.record.holder == "b" and store.record.transitions == 1


def test_a_holder_that_cannot_renew_stops_writing_before_anyone_may_take_over():
    store, clock = Store(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert attempt(a)
    last_renewal = clock.t
    assert not attempt(b)
    store.down = True  # a is cut off from the API server; b too, for now
    clock.t += RENEW
    assert not a.holds()  # a stopped writing at renewDeadline
    store.down = False
    first_takeover = None
    while first_takeover is None:
        clock.t += 0.5
        if attempt(b):
            first_takeover = clock.t
    assert first_takeover - last_renewal >= DURATION > RENEW


def test_a_graceful_stop_releases_the_lease_and_the_standby_takes_over_at_its_next_retry():
    store, clock = Store(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert attempt(a)
    assert not attempt(b)
    a.release()
    assert not a.holds() and store.record.holder == ""
    clock.t += RETRY
    assert attempt(b) and b.holds()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["try", "kill", "release", "down", "up"]),
                          st.floats(0.1, 6.0)), min_size=1, max_size=80))
def test_no_two_replicas_ever_hold_the_lease_at_once(steps):
    store, clock = Store(), Clock()
    replicas = {n: elector(store, n, clock) for n in "abc"}
    alive = set(replicas)
    for name, what, dt in steps:
        clock.t += dt
        e = replicas[name]
        if what == "kill":
            alive.discard(name)
            replicas[name] = elector(store, name, clock)  # restarted later with no memory
        elif what == "release" and name in alive:
            e.release()
        elif what == "down":
            store.down = True
        elif what == "up":
            store.down = False
        elif name in alive or what == "try":
            alive.add(name)
            attempt(replicas[name])
        holders = [n for n, r in replicas.items() if n in alive and r.holds()]
        assert len(holders) <= 1, (holders, clock.t)


@pytest.mark.parametrize("down_for", [RENEW - 1, RENEW + 1])
def test_a_short_outage_keeps_the_leader_and_a_long_one_ends_its_term(down_for):
    store, clock = Store(), Clock()
    a = elector(store, "a", clock)
    assert attempt(a)
    store.down = True
    clock.t += down_for
    assert a.holds() == (down_for < RENEW)
    store.down = False
    assert attempt(a) and a.holds()  # nobody else took it: a renews and carries on


def test_renewals_are_not_queued_behind_a_saturated_api_pool():
    """Every thread of the shared pool is blocked (a burst of creates to a slow API
    server): the leader still renews every retry period, on its own thread."""
    import asyncio
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    store = Store()
    renewals: list[float] = []
    real_replace, real_create = store.replace, store.create
    store.replace = lambda record: renewals.append(time.monotonic()) or real_replace(record)  # type: ignore[method-assign]
    store.create = lambda record: renewals.append(time.monotonic()) or real_create(record)  # type: ignore[method-assign]
    e = Leadership(store, "leader", DURATION, RENEW, retry_period=0.05)
    release = threading.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=4))
        blocked = [loop.run_in_executor(None, release.wait, 5) for _ in range(16)]  # the pool is full for 5 s
        stopped = asyncio.Event()
        election = asyncio.create_task(e.run(stopped))
        await asyncio.sleep(0.6)
        stopped.set()
        await election
        release.set()
        await asyncio.gather(*blocked)

    asyncio.run(main())
    assert len(renewals) >= 5, f"{len(renewals)} Lease writes in 0.6 s with the API pool blocked"
    assert store.record is not None and store.record.holder == "", "released on the graceful stop"


def test_each_term_won_counts_once_and_a_pass_of_a_new_term_forgets_what_it_heard_before():
    """What a replica heard of the pods while it led (silences, probe answers) is stale
    when it wins the Lease back: its term moves before ``holds()`` says it leads (the
    renewal runs on a thread; a pass starting meanwhile must not see the old term), and a
    pass of another term starts from nothing (``reconcile.heard_in_term``)."""
    # The package re-exports a function named `reconcile`, which hides the submodule.
    reconcile_module = importlib.import_module("llmtrain_operator.handlers.reconcile")

    store, clock = Store(), Clock()
    a = elector(store, "a", clock)
    assert a.term == 0 and attempt(a) and a.term == 1
    clock.t += RETRY
    assert attempt(a) and a.term == 1, "a renewal is no new term"
    store.down = True
    clock.t += RENEW
    assert not a.holds()
    store.down = False
    assert attempt(a) and a.holds() and a.term == 2
    job, pod = ("ml", "j"), worker(0, uid="u0")
    book, silences = reconcile_module.PROBE_BOOK, reconcile_module.SILENCES
    reconcile_module.heard_in_term(a.term)
    book.first_round(job, [pod], 64)
    book.record(job, [pod], [pod], {}, {pod.name: LauncherReport({})}, False)
    silences.track(job, [pod], {pod.name: object()})
    silences.track(job, [pod], {})  # heard once, silent now
    reconcile_module.heard_in_term(a.term)
    assert book.jobs() == 1 and pod.name in silences.since_answer(job), "the same term keeps what it heard"
    reconcile_module.heard_in_term(a.term + 1)
    assert book.jobs() == 0 and silences.since_answer(job) == {}
