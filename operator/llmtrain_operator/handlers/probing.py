"""Which of a job's running workers a pass probes, and what it knows of the others.

Reading every running worker's trainer and launcher pages at every pass costs pods x
passes requests: at 1,024 workers, 2,048 pages and 1.85 s of a pass (docs/benchmarks.md,
"Operator scale"), although most pages say what they said the pass before. A job of at
most ``cap`` running workers (not being deleted; ``pods_per_pass``: 64, fewer with many
jobs, 8 at least) is still probed whole at every pass (the fault matrix's jobs: nothing
changes for them). A larger job's pass probes, in a first round:

- the workers whose answer matters now (urgent): one not read yet (a new pod, a new
  uid), one that did not answer last time (silent, or its trainer restarting), one its
  kubelet marks not ready, the one holding global rank 0 (the job's step, loss,
  throughput, checkpoint cadence and numerics come from its page), and for a user's
  script the one whose launcher reported the newest step (a script may report from one
  rank only);
- and ``cap`` more, those read longest ago (the rotation): every worker is read at least
  every ``ceil(N / cap)`` rotations. ``cap`` is ``PROBE_PODS_PER_PASS``, or less when many
  jobs share the operator's page budget (``pods_per_pass``). A pass that answers an event
  leaves the rotation out, so that the answer waits for no page it does not need; a due
  rotation is read by a routine pass right after.

A first-round answer that differs from the same pod's previous one in what the other pods'
pages would show as well (``_changed``: the launcher's attempt, which moves at every
restart of its worker group, a peer's failure or a membership change included; a failed
attempt counted; an OOM kill; a restart, world size, rank, tier health or straggler set
on the trainer's page) makes the same pass read every other running worker too (a
sweep), and the next pass as well, until a pass sees no change: peers restart a moment
apart, and a hang's cause gives its verdict after its victims. So the pod whose rank
failed is read, and charged, in the pass that first sees the group restart. While no
worker is known to hold rank 0 (its pod was replaced) a built-in job's passes read all.

Each pod not read this pass is represented by what lasts of its newest answers
(``lasting_*``): its counts (failed attempts, OOM kills, rollbacks, heals, which only grow and are
charged once), its rank, its tiers' commits and health, its stragglers and skipped
windows. What only its current page can say (its step and time, loss, throughput, world
size, the cadence's inputs, peer waits, whether its workers run, values it sent that were
rejected) is left out, as for a pod that did not answer: a step read sixteen passes ago
must not look like replayed work (``timekeeping``).

The book is this process's memory, like ``silence.Silences``: a new leader, or one that
leads again, reads every worker at its first pass (``reconcile.heard_in_term``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..api.observed import TrainerProbe
from ..probe import LauncherReport


ROTATION_FORCED_AFTER = 3
"""A rotation overdue this many times ``resyncSeconds`` moves even in a pass answering an
event (``ProbeBook.first_round``)."""

DEFERRED_ROTATION_SECONDS = 1.0
"""A pass that left a due rotation out asks for a routine pass this soon after it."""

MIN_PODS_PER_PASS = 8
"""A job of up to this many workers is read whole at every pass however many jobs share
the operator (the fault matrix's have 2 to 4)."""


def pods_per_pass(cap: int, pages_per_second: float, resync_seconds: float, jobs: int) -> int:
    """The workers a pass of each of ``jobs`` jobs reads beyond its urgent ones: ``cap``,
    or fewer when all jobs' passes, each every ``resync_seconds`` and reading two pages a
    worker, would read more than ``pages_per_second`` together; never below
    ``MIN_PODS_PER_PASS``. 0: every worker (``cap`` 0)."""
    if not cap or pages_per_second <= 0:
        return cap
    share = int(pages_per_second * resync_seconds / (2 * max(1, jobs)))
    return max(min(cap, MIN_PODS_PER_PASS), min(cap, share))


@dataclass(frozen=True)
class Answers:
    """One pod's newest answers (from the last pass each page answered) and the pass (this
    book's count) that last read it."""

    trainer: TrainerProbe | None
    launcher: LauncherReport | None
    read: int
    missed: bool
    """A page it should serve did not answer at that pass: read it again at the next."""


def lasting_trainer(probe: TrainerProbe) -> TrainerProbe:
    """What a trainer's page said that still holds while nobody reads it again."""
    return TrainerProbe(failed_attempts=probe.failed_attempts, last_checkpoint=probe.last_checkpoint,
                        tier_degraded=probe.tier_degraded, rank=probe.rank, rollbacks=probe.rollbacks, heals=probe.heals,
                        skipped=probe.skipped, stragglers=probe.stragglers)


def lasting_launcher(report: LauncherReport) -> LauncherReport:
    """What a launcher's page said that still holds while nobody reads it again."""
    return LauncherReport(failed=report.failed, memory=report.memory)


def _changed(before: Answers, trainer: TrainerProbe | None, launcher: LauncherReport | None) -> bool:
    """A new answer shows what the job's other pods would show too: read them all. The
    launcher's attempt moves at every restart of its worker group (a peer's failure, a
    membership change), whether or not it counts one against this pod."""
    if launcher is not None and before.launcher is not None:
        old = before.launcher
        kills = lambda r: r.memory.oom_kills if r.memory is not None else 0  # noqa: E731
        if launcher.failed != old.failed or launcher.attempt != old.attempt or kills(launcher) != kills(old):
            return True
    if trainer is not None and before.trainer is not None:
        was = before.trainer
        facts = lambda t: (t.restarts, t.world_size, t.rank, t.failed_attempts, t.tier_degraded,  # noqa: E731
                           sorted(t.stragglers))
        if facts(trainer) != facts(was):
            return True
    return False


class ProbeBook:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rotated: dict[Hashable, float] = {}
        """Job -> when a pass last read its ``cap`` workers read longest ago."""
        self._deferred: set[Hashable] = set()
        """Jobs whose due rotation an urgent pass left for the pass after."""
        self._passes = 0
        self._books: dict[Hashable, dict[str, Answers]] = {}
        """Job -> pod ("name/uid") -> its newest answers."""
        self._sweep_next: set[Hashable] = set()
        """Jobs whose last pass saw an answer change: the next reads every worker again
        (peers that restart a moment later than the first, a hang's cause whose verdict
        comes after its victims'), until a pass sees none."""

    @staticmethod
    def _key(pod: Any) -> str:
        return f"{pod.name}/{pod.uid}"

    def first_round(self, job: Hashable, running: list[Any], cap: int, urgent_pass: bool = False,
                    rotate_every: float = 0.0) -> list[Any]:
        """The running workers (pod views) this pass reads first: all of them up to ``cap``
        workers not being deleted (0: all, always), or after a pass that saw a change;
        beyond it the urgent ones and the ``cap`` read longest ago. A pass that answers
        an event (``urgent_pass``) reads the urgent ones only: a node lost under 64 jobs
        woke all of them at once, and again when its grace ended, and their rotations'
        pages (15 workers each) took 2-3 s of every pass's probes and the CPU its writes
        needed (docs/benchmarks.md). If the rotation is due (``rotate_every`` seconds
        since it last moved) the job is marked (``rotation_deferred``) for a routine pass
        right after; one overdue three times over moves in the urgent pass as well, so
        that events that keep a job busy never starve it."""
        self._passes += 1
        sweeping = job in self._sweep_next
        self._sweep_next.discard(job)
        if not cap or sweeping or sum(1 for p in running if not p.deleting) <= cap:
            return list(running)
        book = self._books.get(job, {})
        # A user's script has no trainer page: its progress is the step its launcher serves,
        # which a script may report from one rank only; that pod is read at every pass.
        steps = {k: a.launcher.step for k, a in book.items() if a.launcher is not None and a.launcher.step is not None}
        leader = max(steps, key=lambda k: (steps[k], k)) if steps else None
        urgent: list[Any] = []
        rest: list[Any] = []
        for pod in running:
            key = self._key(pod)
            seen = book.get(key)
            unanswered = seen is None or seen.missed
            holds_rank_zero = seen is not None and seen.trainer is not None and seen.trainer.rank == 0
            (urgent if unanswered or not pod.ready or holds_rank_zero or key == leader else rest).append(pod)
        last = self._rotated.get(job)
        age = None if last is None else self._clock() - last
        if urgent_pass and age is not None and age < ROTATION_FORCED_AFTER * rotate_every:
            if age >= rotate_every:
                self._deferred.add(job)
            return urgent
        self._rotated[job] = self._clock()
        self._deferred.discard(job)
        rest.sort(key=lambda p: book[self._key(p)].read)
        return urgent + rest[:cap]

    def record(self, job: Hashable, probed: list[Any], running: list[Any], trainers: Mapping[str, TrainerProbe],
               launchers: Mapping[str, LauncherReport], expect_trainers: bool) -> list[Any]:
        """Remember this round's answers (pod name -> page; a pod absent did not answer)
        and return the running workers still to read in this pass: all the others when
        an answer changed as ``_changed`` says, or when no worker is known to hold rank 0
        (``expect_trainers``); none otherwise. Pods no longer running are forgotten."""
        live = {self._key(p) for p in running}
        book = {k: v for k, v in self._books.get(job, {}).items() if k in live}
        sweep = False
        for pod in probed:
            key = self._key(pod)
            trainer, launcher = trainers.get(pod.name), launchers.get(pod.name)
            before = book.get(key)
            if before is not None and _changed(before, trainer, launcher):
                sweep = True
            missed = launcher is None or (expect_trainers and trainer is None)
            book[key] = Answers(trainer or (before.trainer if before else None),
                                launcher or (before.launcher if before else None), self._passes, missed)
        if book:
            self._books[job] = book
        else:
            self._books.pop(job, None)
        if sweep:
            self._sweep_next.add(job)
        done = {p.name for p in probed}
        left = [p for p in running if p.name not in done]
        if not left:
            return []
        if expect_trainers and not any(a.trainer is not None and a.trainer.rank == 0 for a in book.values()):
            sweep = True
        return left if sweep else []

    def lasting(self, job: Hashable, running: Iterable[Any], probed: Iterable[Any]
                ) -> tuple[dict[str, TrainerProbe], dict[str, LauncherReport]]:
        """Pod name -> what lasts of its newest trainer and launcher answers, for the running
        workers not read this pass."""
        book = self._books.get(job, {})
        done = {p.name for p in probed}
        trainers: dict[str, TrainerProbe] = {}
        launchers: dict[str, LauncherReport] = {}
        for pod in running:
            seen = book.get(self._key(pod))
            if pod.name in done or seen is None:
                continue
            if seen.trainer is not None:
                trainers[pod.name] = lasting_trainer(seen.trainer)
            if seen.launcher is not None:
                launchers[pod.name] = lasting_launcher(seen.launcher)
        return trainers, launchers

    def unasked(self, job: Hashable, pods: list[Any]) -> None:
        """``pods`` could not be asked this pass (the prober's queue): read them first at
        the next, as a pod that did not answer (a pod never read is already)."""
        book = self._books.get(job, {})
        for pod in pods:
            key = self._key(pod)
            if key in book:
                book[key] = replace(book[key], missed=True)

    def rotation_deferred(self, job: Hashable) -> bool:
        """Whether the job's last pass left its due rotation for a routine pass soon."""
        return job in self._deferred

    def jobs(self) -> int:
        """The jobs whose running workers the book reads."""
        return len(self._books)

    def knows(self, job: Hashable) -> bool:
        return job in self._books

    def forget(self, job: Hashable) -> None:
        self._books.pop(job, None)
        self._sweep_next.discard(job)
        self._rotated.pop(job, None)
        self._deferred.discard(job)

    def clear(self) -> None:
        """Every job's: a replica that leads again knows nothing it heard before."""
        self._books.clear()
        self._sweep_next.clear()
        self._rotated.clear()
        self._deferred.clear()

