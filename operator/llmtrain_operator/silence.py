"""How long each running worker's launcher has not answered the operator's probes.

A frozen pod (every process stopped, as when its node's kernel stalls) answers nothing,
while its peers' supervisors report their ranks blocked on a peer. The planner replaces
such a pod (``planner/policies/frozen_pods.py``) once its silence is confirmed: it needs to
know for how long the pod has been silent, across passes, which one probe cannot say. The
first unanswered probe in a row is remembered here, in memory and by this process's
monotonic clock (a new leader learns it again from its own first probe: until then the
liveness probe is the line that acts). The operator's passes and ``llmtrain run`` each
keep one ``Silences``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any


class Silences:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._first_unanswered: dict[Hashable, dict[str, float]] = {}
        """Job -> pod (name and uid) -> when its launcher first did not answer, in a row."""

    def track(self, job: Hashable, probed: Iterable[Any], answered: Mapping[str, Any]) -> dict[str, float]:
        """Record this pass's probes of ``probed`` (pod views; ``answered``: pod name -> the
        launcher's report) and return pod name -> seconds silent, for the silent ones. Pods
        no longer probed are forgotten, so the book stays bounded by the job's running pods."""
        now = self._clock()
        before = self._first_unanswered.get(job, {})
        book: dict[str, float] = {}
        silent: dict[str, float] = {}
        for pod in probed:
            if pod.name in answered:
                continue
            key = f"{pod.name}/{pod.uid}"
            first = book[key] = before.get(key, now)
            silent[pod.name] = now - first
        if book:
            self._first_unanswered[job] = book
        else:
            self._first_unanswered.pop(job, None)
        return silent

    def forget(self, job: Hashable) -> None:
        """A deleted job's silences."""
        self._first_unanswered.pop(job, None)
