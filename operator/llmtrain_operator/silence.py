"""How long each running worker's launcher has not answered the operator's probes.

A frozen pod (every process stopped, as when its node's kernel stalls) answers nothing,
while its peers' supervisors report their ranks blocked on a peer. The planner replaces
such a pod (``planner/policies/frozen_pods.py``) once its silence is confirmed: it needs to
know for how long the pod has been silent, across passes, which one probe cannot say. The
first unanswered probe in a row is remembered here, in memory and by this process's
monotonic clock (a new leader learns it again from its own first probe: until then the
liveness probe is the line that acts). The operator's passes and ``llmtrain run`` each
keep one ``Silences``.

It also remembers when each launcher last answered (``since_answer``): a kubelet's "not
ready" written before that moment was no verdict on the silence (``frozen_pods``).
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
        self._last_answered: dict[Hashable, dict[str, float]] = {}
        """Job -> pod (name and uid) -> when its launcher last answered."""
        self._since_answer: dict[Hashable, dict[str, float]] = {}
        """Job -> pod name -> seconds since its last answer, for the pods silent at the last
        ``track`` that answered before."""

    def track(self, job: Hashable, probed: Iterable[Any], answered: Mapping[str, Any],
              running: Iterable[Any] | None = None) -> dict[str, float]:
        """Record this pass's probes of ``probed`` (pod views; ``answered``: pod name -> the
        launcher's report) and return pod name -> seconds silent, for the silent ones.
        ``running``: the job's running workers, of which a large job's pass reads only some
        (``handlers/probing.py``; default: ``probed``); what is known of the others is kept,
        and pods no longer running are forgotten, so the book stays bounded by them."""
        now = self._clock()
        before = self._first_unanswered.get(job, {})
        heard_before = self._last_answered.get(job, {})
        book: dict[str, float] = {}
        heard: dict[str, float] = {}
        silent: dict[str, float] = {}
        since_answer: dict[str, float] = {}
        probed = list(probed)
        read = {pod.name for pod in probed}
        for pod in running if running is not None else ():
            key = f"{pod.name}/{pod.uid}"
            if pod.name not in read:
                if key in before:
                    book[key] = before[key]
                if key in heard_before:
                    heard[key] = heard_before[key]
        for pod in probed:
            key = f"{pod.name}/{pod.uid}"
            if pod.name in answered:
                heard[key] = now
                continue
            first = book[key] = before.get(key, now)
            silent[pod.name] = now - first
            if key in heard_before:
                heard[key] = heard_before[key]
                since_answer[pod.name] = now - heard_before[key]
        for books, entries in ((self._first_unanswered, book), (self._last_answered, heard), (self._since_answer, since_answer)):
            if entries:
                books[job] = entries
            else:
                books.pop(job, None)
        return silent

    def since_answer(self, job: Hashable) -> dict[str, float]:
        """Pod name -> seconds since its launcher last answered, for the pods the last
        ``track`` found silent that this process heard before (a pod never heard, or heard
        only by another leader, is absent)."""
        return dict(self._since_answer.get(job, {}))

    def forget(self, job: Hashable) -> None:
        """A deleted job's silences."""
        for books in (self._first_unanswered, self._last_answered, self._since_answer):
            books.pop(job, None)

    def clear(self) -> None:
        """Every job's: what a replica heard before it last led is no longer known."""
        for books in (self._first_unanswered, self._last_answered, self._since_answer):
            books.clear()
