"""At most MAX_CONCURRENT_RECONCILES passes run at once, and the wait for a slot is
measured apart from the pass (the scale target depends on both)."""

from __future__ import annotations

import asyncio

import llmtrain_operator.handlers as handlers
from llmtrain_operator import metrics


def _queue_count() -> float:
    return metrics.REGISTRY.get_sample_value("llmtrain_operator_reconcile_queue_seconds_count") or 0.0


def _queue_sum() -> float:
    return metrics.REGISTRY.get_sample_value("llmtrain_operator_reconcile_queue_seconds_sum") or 0.0


async def test_a_burst_of_passes_runs_at_most_the_slot_count_at_once(monkeypatch):
    running, peak = 0, 0

    async def fake_reconcile(k8s, body, source, settings):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return body["metadata"]["name"]

    monkeypatch.setattr(handlers, "reconcile", fake_reconcile)
    monkeypatch.setattr(handlers, "_SLOTS", asyncio.Semaphore(3))
    count, total = _queue_count(), _queue_sum()
    bodies = [{"metadata": {"name": f"job-{i}"}} for i in range(12)]
    done = await asyncio.gather(*(handlers._pass(b, None) for b in bodies))
    assert done == [f"job-{i}" for i in range(12)]  # every pass ran, each on its own body
    assert peak == 3
    assert _queue_count() - count == 12
    # 12 passes of 50 ms through 3 slots: the last ones waited about 3 x 50 ms.
    assert _queue_sum() - total >= 0.05 * (0 + 0 + 0 + 1 + 1 + 1 + 2 + 2 + 2 + 3 + 3 + 3) * 0.8
