"""The operator's memory of each running worker's silent launcher (``silence.py``):
seconds since the first unanswered probe in a row, reset by an answer, by a new pod under
the same name (another uid) and forgotten with the pod or the job."""

from __future__ import annotations

from llmtrain_operator.silence import Silences
from support.planning import worker

JOB = ("ml", "tiny-elastic")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_silence_counts_from_the_first_unanswered_probe_in_a_row():
    clock = Clock()
    silence = Silences(clock)
    pods = [worker(0, uid="a"), worker(1, uid="b")]
    assert silence.track(JOB, pods, {"tiny-elastic-worker-0": object()}) == {"tiny-elastic-worker-1": 0.0}
    clock.now += 3
    assert silence.track(JOB, pods, {"tiny-elastic-worker-0": object()}) == {"tiny-elastic-worker-1": 3.0}
    # An answer ends the silence; the next one counts anew.
    clock.now += 1
    answered = {"tiny-elastic-worker-0": object(), "tiny-elastic-worker-1": object()}
    assert silence.track(JOB, pods, answered) == {}
    clock.now += 1
    assert silence.track(JOB, pods, {}) == {"tiny-elastic-worker-0": 0.0, "tiny-elastic-worker-1": 0.0}
    # Another pod under the same name (a new uid) is silent from its own first probe.
    clock.now += 5
    renewed = [worker(0, uid="a"), worker(1, uid="c")]
    assert silence.track(JOB, renewed, {}) == {"tiny-elastic-worker-0": 5.0, "tiny-elastic-worker-1": 0.0}
    # A pod no longer probed (gone, or no longer running) is forgotten.
    clock.now += 1
    assert silence.track(JOB, [worker(1, uid="c")], {}) == {"tiny-elastic-worker-1": 1.0}
    assert silence.track(JOB, renewed, {})["tiny-elastic-worker-0"] == 0.0


def test_a_deleted_jobs_silences_are_forgotten_and_each_job_keeps_its_own():
    clock = Clock()
    silence = Silences(clock)
    silence.track(("ml", "other"), [worker(0, uid="a")], {})
    silence.track(JOB, [worker(0, uid="a")], {})
    clock.now += 10
    silence.forget(JOB)
    assert silence.track(JOB, [worker(0, uid="a")], {}) == {"tiny-elastic-worker-0": 0.0}
    assert silence.track(("ml", "other"), [worker(0, uid="a")], {}) == {"tiny-elastic-worker-0": 10.0}


def test_since_answer_dates_each_silent_pods_last_answer_and_knows_nothing_of_a_pod_never_heard():
    clock = Clock()
    silence = Silences(clock)
    pods = [worker(0, uid="a"), worker(1, uid="b")]
    silence.track(JOB, pods, {"tiny-elastic-worker-0": object()})
    assert silence.since_answer(JOB) == {}, "worker-1 was never heard"
    clock.now += 2
    silence.track(JOB, pods, {"tiny-elastic-worker-1": object()})
    assert silence.since_answer(JOB) == {"tiny-elastic-worker-0": 2.0}
    clock.now += 3
    silence.track(JOB, pods, {})
    assert silence.since_answer(JOB) == {"tiny-elastic-worker-0": 5.0, "tiny-elastic-worker-1": 3.0}
    # A new pod under the same name (another uid) was never heard; an answer clears it.
    clock.now += 1
    silence.track(JOB, [worker(0, uid="a"), worker(1, uid="c")], {"tiny-elastic-worker-0": object()})
    assert silence.since_answer(JOB) == {}
    silence.forget(JOB)
    clock.now += 1
    silence.track(JOB, [worker(0, uid="a")], {})
    assert silence.since_answer(JOB) == {}, "forgotten with the job"
