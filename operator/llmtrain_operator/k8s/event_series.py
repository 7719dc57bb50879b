"""Repeated Events counted on one object, as client-go's recorder does (its EventCorrelator):
the same Event again (same object, type, reason and message) raises the ``count`` and
``lastTimestamp`` of the one already posted instead of creating another, so that
`kubectl describe` shows "x5 over 3m" and etcd holds one object, not five.

Pure bookkeeping; the client (client.py) does the I/O. Only exact repeats are merged:
client-go's second stage, which folds ten *similar* Events (same reason, other messages)
into one "(combined from similar events)", is not done, since our messages name the pod,
node or step that makes each of them worth reading."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

CACHE_SIZE = 4096
"""Series remembered (client-go's LRU holds 4096): the oldest is forgotten first, and its
next repeat starts a new Event."""


@dataclass(frozen=True)
class Series:
    name: str
    """The Event object posted first, which repeats update."""
    count: int
    first_timestamp: str


class EventSeries:
    """Which Event a repeat belongs to. Thread-safe: Events are posted from worker threads."""

    def __init__(self, size: int = CACHE_SIZE):
        self._size = size
        self._series: OrderedDict[tuple[str, ...], Series] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(namespace: str, uid: str, type_: str, reason: str, message: str) -> tuple[str, ...]:
        return (namespace, uid, type_, reason, message)

    def repeat(self, key: tuple[str, ...]) -> Series | None:
        """The series ``key`` continues, with the count its Event should now have (kept
        only once ``counted``: a patch that failed leaves the count as it was), or None
        when it starts one."""
        with self._lock:
            known = self._series.get(key)
            if known is None:
                return None
            self._series.move_to_end(key)
            return Series(known.name, known.count + 1, known.first_timestamp)

    def counted(self, key: tuple[str, ...], series: Series) -> None:
        """The Event of ``key`` now shows ``series``' count."""
        with self._lock:
            if key in self._series:
                self._series[key] = series

    def started(self, key: tuple[str, ...], name: str, timestamp: str) -> None:
        """A new Event ``name`` was created for ``key`` (first seen, or its old one gone)."""
        with self._lock:
            self._series[key] = Series(name, 1, timestamp)
            self._series.move_to_end(key)
            while len(self._series) > self._size:
                self._series.popitem(last=False)

    def forget(self, key: tuple[str, ...]) -> None:
        """The Event of ``key`` is gone (the API server's Event TTL, or deleted)."""
        with self._lock:
            self._series.pop(key, None)
