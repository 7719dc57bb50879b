"""The bookkeeping behind counted Events (k8s/event_series.py)."""

from __future__ import annotations

from llmtrain_operator.k8s.event_series import EventSeries


def test_a_series_counts_the_repeats_its_event_took_and_a_forgotten_or_evicted_one_starts_again():
    series = EventSeries(size=2)
    a, b, c = (EventSeries.key("ns", "uid", "Warning", "PodFailed", m) for m in ("a", "b", "c"))
    assert series.repeat(a) is None
    series.started(a, "job.1", "t0")
    second = series.repeat(a)
    assert (second.name, second.count) == ("job.1", 2)
    assert series.repeat(a).count == 2, "a patch that did not take leaves the count as it was"
    series.counted(a, second)
    assert series.repeat(a).count == 3
    series.started(b, "job.2", "t1")
    series.repeat(a)  # a is now the newest used
    series.started(c, "job.3", "t2")  # over the size: b, the least recently used, goes
    assert series.repeat(b) is None and series.repeat(a).count == 3
    series.forget(a)
    assert series.repeat(a) is None


def test_events_that_differ_in_any_part_are_separate_series():
    base = ("ns", "uid", "Warning", "PodFailed", "message")
    keys = {EventSeries.key(*base)} | {EventSeries.key(*(base[:i] + ("other",) + base[i + 1:])) for i in range(5)}
    assert len(keys) == 6
