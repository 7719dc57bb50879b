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
        return Children(pods=[], nodes=[], services=frozenset(), configmaps={})

    monkeypatch.setattr(reconcile_module, "probe_workers", slow_probe)
    monkeypatch.setattr(reconcile_module, "_decide_and_write", decide)
    slots, settings = Slots(1), OperatorSettings(probes_enabled=True)
    jobs = [{"metadata": {"name": f"job-{i}", "namespace": "ml"}, "spec": {}} for i in range(4)]
    results = await asyncio.gather(*(reconcile(None, job, source, settings, slots=slots) for job in jobs))
    assert results == ["written"] * 4
    assert probing.peak == 4, "every job's probe ran at once although there is one slot"
    assert deciding.peak == 1
