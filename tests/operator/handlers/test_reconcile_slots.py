"""At most MAX_CONCURRENT_RECONCILES passes do API work at once, the wait for a slot is
measured apart from the pass, and trainer probes run outside the slots (a slow trainer
must not hold a slot other jobs need)."""

from __future__ import annotations

import asyncio
import importlib

from llmtrain_operator import metrics
from llmtrain_operator.handlers.reconcile import Children, reconcile
from llmtrain_operator.handlers.slots import Slots
from llmtrain_operator.settings import OperatorSettings
from support.planning import job

# The package re-exports a function named `reconcile`, which hides the submodule attribute.
reconcile_module = importlib.import_module("llmtrain_operator.handlers.reconcile")


def _queue(stat: str) -> float:
    return metrics.REGISTRY.get_sample_value(f"llmtrain_operator_reconcile_queue_seconds_{stat}") or 0.0


class Peak:
    """Counts how many callers are inside at once."""

    def __init__(self):
        self.now = self.peak = 0

    async def inside(self, seconds: float) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(seconds)
        self.now -= 1


async def test_a_burst_holds_at_most_the_slot_count_and_the_wait_is_measured():
    slots, work = Slots(3), Peak()
    count, total = _queue("count"), _queue("sum")

    async def one_pass():
        async with slots.held() as waited:
            await work.inside(0.05)
            return waited

    waits = sorted(await asyncio.gather(*(one_pass() for _ in range(12))))
    assert work.peak == 3
    assert _queue("count") - count == 12
    # 12 passes of 50 ms through 3 slots: three waited ~0, three ~50 ms, ... three ~150 ms.
    assert max(waits[:3]) < 0.02
    assert min(waits[-3:]) >= 0.12
    assert abs((_queue("sum") - total) - sum(waits)) < 1e-6


async def test_probes_run_outside_the_slots(monkeypatch):
    probing, deciding = Peak(), Peak()

    async def slow_probe(pods, port, timeout):
        await probing.inside(0.2)  # a trainer that answers slowly (or not at all)
        return {}

    async def decide(*args, **kwargs):
        await deciding.inside(0.01)
        return "written"

    async def source(namespace, name):
        return Children(pods=[], nodes=[], services=[], configmaps=[])

    monkeypatch.setattr(reconcile_module, "probe_workers", slow_probe)
    monkeypatch.setattr(reconcile_module, "_decide_and_write", decide)
    slots, settings = Slots(1), OperatorSettings(probes_enabled=True)
    jobs = [job({"metadata.name": f"job-{i}"}) for i in range(4)]
    results = await asyncio.gather(*(reconcile(None, job, source, settings, slots=slots) for job in jobs))
    assert results == ["written"] * 4
    assert probing.peak == 4, "every job's probe ran at once although there is one slot"
    assert deciding.peak == 1


async def test_a_pass_that_answers_an_event_gets_the_next_slot_before_routine_passes():
    slots, order = Slots(1), []
    release = asyncio.Event()

    async def holder():
        async with slots.held():
            await release.wait()

    async def one(name, urgent):
        async with slots.held(urgent):
            order.append(name)
            await asyncio.sleep(0.01)

    first = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(one(f"resync-{i}", False)) for i in range(3)]
    await asyncio.sleep(0.01)
    waiting.append(asyncio.create_task(one("pod-failed", True)))
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(first, *waiting)
    assert order == ["pod-failed", "resync-0", "resync-1", "resync-2"]


async def test_a_cancelled_waiter_gives_no_slot_away_and_loses_none():
    slots, peak = Slots(2), Peak()
    release = asyncio.Event()

    async def holder():
        async with slots.held():
            await release.wait()

    holders = [asyncio.create_task(holder()) for _ in range(2)]
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    waiter.cancel()
    release.set()
    await asyncio.gather(*holders, return_exceptions=True)
    await asyncio.gather(waiter, return_exceptions=True)

    async def worker():
        async with slots.held():
            await peak.inside(0.02)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(6))), timeout=5)
    assert peak.peak == 2, "the cancelled waiter leaked or took a slot"


async def test_an_event_promotes_its_jobs_waiting_routine_pass_or_the_pass_it_is_about_to_start():
    slots, order = Slots(1), []
    release = asyncio.Event()

    async def holder():
        async with slots.held():
            await release.wait()

    async def one(name, key=None):
        async with slots.held(False, key):
            order.append(name)

    first = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(one("a")), asyncio.create_task(one("b")), asyncio.create_task(one("job-x", ("ns", "x")))]
    await asyncio.sleep(0.01)
    slots.promote(("ns", "x"))  # its pod failed while its resync pass waited
    slots.promote(("ns", "y"))  # its pass is still probing: it will ask for a slot in a moment
    waiting.append(asyncio.create_task(one("job-y", ("ns", "y"))))
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(first, *waiting)
    assert order == ["job-x", "job-y", "a", "b"]


async def test_a_pass_that_waited_plans_from_what_happened_meanwhile(monkeypatch):
    """A pass reads its children again once it holds its slot: a pod that failed while it
    waited is in what it plans from."""
    seen = []
    state = {"pods": ["before"]}

    def pod(name):
        return {"metadata": {"name": name, "ownerReferences": [{"uid": "uid-a"}]}}

    async def source(namespace, name):
        return Children(pods=[pod(p) for p in state["pods"]], nodes=[], services=[], configmaps=[],
                        body={"metadata": {"name": name, "namespace": namespace, "uid": "uid-a"}, "spec": {},
                              "status": {"seen": True}})

    async def decide(k8s, body, received, settings, now, started, observed, gate, *rest):
        seen.append((body["status"], [p.name for p in observed.pods]))
        return "written"

    monkeypatch.setattr(reconcile_module, "_decide_and_write", decide)
    slots = Slots(1)
    release = asyncio.Event()

    async def holder():
        async with slots.held():
            await release.wait()

    first = asyncio.create_task(holder())
    await asyncio.sleep(0.01)
    body = {"metadata": {"name": "a", "namespace": "ml", "uid": "uid-a"}, "spec": {}}
    waiting = asyncio.create_task(reconcile(None, body, source, OperatorSettings(probes_enabled=False), slots=slots))
    await asyncio.sleep(0.01)
    state["pods"] = ["after"]
    release.set()
    await asyncio.gather(first, waiting)
    assert seen == [({"seen": True}, ["after"])]
