"""``llmtrain logs``'s follow logic (logscli.follow) with the API replaced by fakes: rank 0's
log, then the next pod's when rank 0 moves, until the job ends; a job that never trained
says so."""

from __future__ import annotations

from collections.abc import Iterator


def _statuses(*steps):
    items = list(steps)

    def read_job():
        return {"status": items.pop(0) if len(items) > 1 else items[0]}
    return read_job


def test_rank_zero_is_followed_across_a_replacement_until_the_job_ends():
    from llmtrain_operator.logscli import follow

    logs = {"w-1": [b"step 5\n", b"step 10\n"], "w-0": [b"step 15\n"]}
    read: list[tuple[str, bool]] = []

    def read_log(pod: str, container: str, following: bool) -> Iterator[bytes]:
        read.append((pod, following))
        yield from logs[pod]

    out, said = [], []
    code = follow(_statuses({"phase": "Running", "rankZero": {"pod": "w-1", "container": "trainer"}},
                            {"phase": "Restarting", "rankZero": {"pod": "w-1", "container": "trainer"}},
                            {"phase": "Running", "rankZero": {"pod": "w-0", "container": "trainer"}},
                            {"phase": "Succeeded", "rankZero": {"pod": "w-0", "container": "trainer"}}),
                  read_log, out.append, said.append, keep_following=True, sleep=lambda s: None)
    assert code == 0 and b"".join(out) == b"step 5\nstep 10\nstep 15\n", "every line once, though read again"
    # Reopened at each poll (a stream may end early), the last time without follow: the job has ended.
    assert read == [("w-1", True), ("w-1", True), ("w-0", True), ("w-0", False)], read
    assert said == ["----- rank 0 moved: pod w-0 (the job restarted) -----"]


def test_without_follow_one_log_and_a_job_that_never_trained_says_so():
    from llmtrain_operator.logscli import follow

    out, said = [], []
    assert follow(_statuses({"phase": "Running", "rankZero": {"pod": "w-0"}}), lambda p, c, f: iter([b"x\n"]), out.append,
                  said.append, keep_following=False) == 0
    assert out == [b"x\n"] and said == []
    assert follow(_statuses({"phase": "Created"}), lambda p, c, f: iter([]), out.append, said.append, keep_following=False) == 1
    assert "no pod holds global rank 0" in said[-1] and "-f waits for one" in said[-1]
    # --pod: that pod's log, whatever rank it holds.
    seen = []
    assert follow(_statuses({"phase": "Running", "rankZero": {"pod": "w-0"}}),
                  lambda p, c, f: (seen.append(p), iter([b"y\n"]))[1], out.append, said.append, keep_following=False, pod="w-3") == 0
    assert seen == ["w-3"]


def test_a_log_that_cannot_be_read_is_said_once_and_fails_the_command_once_the_job_has_ended():
    from llmtrain_operator.logscli import follow

    def unreadable(pod, container, following):
        raise RuntimeError("HTTP 500: no kubelet API")
        yield b""  # a generator, as the real one

    said: list[str] = []
    code = follow(_statuses({"phase": "Running", "rankZero": {"pod": "w-0"}}, {"phase": "Running", "rankZero": {"pod": "w-0"}},
                            {"phase": "Succeeded", "rankZero": {"pod": "w-0"}}),
                  unreadable, lambda b: None, said.append, keep_following=True, sleep=lambda s: None)
    assert code == 1 and said == ["cannot read the log of pod w-0: HTTP 500: no kubelet API"], said


def test_a_stream_that_drops_mid_log_is_reopened_without_printing_anything_twice():
    from llmtrain_operator.logscli import follow

    calls = []

    def read_log(pod, container, following):
        calls.append(following)
        if len(calls) == 1:
            yield b"step 5\nste"
            raise ConnectionResetError("the connection dropped")
        yield b"step 5\nstep 10\n"

    out, said = [], []
    code = follow(_statuses({"phase": "Running", "rankZero": {"pod": "w-0"}}, {"phase": "Succeeded", "rankZero": {"pod": "w-0"}}),
                  read_log, out.append, said.append, keep_following=True, sleep=lambda s: None)
    assert code == 0 and b"".join(out) == b"step 5\nstep 10\n", out
    assert said == ["cannot read the log of pod w-0: the connection dropped"]


def test_a_closed_pipe_ends_the_command_instead_of_reading_the_log_again():
    import pytest
    from llmtrain_operator.logscli import follow

    def closed(chunk):
        raise BrokenPipeError("head exited")

    with pytest.raises(BrokenPipeError):
        follow(_statuses({"phase": "Running", "rankZero": {"pod": "w-0"}}), lambda p, c, f: iter([b"x\n"]), closed, lambda m: None,
               keep_following=True, sleep=lambda s: None)


def test_a_transient_failure_to_read_the_job_is_retried_while_following_and_a_missing_job_fails():
    from llmtrain_operator.jobread import Unreadable
    from llmtrain_operator.logscli import follow

    answers = [Unreadable("cannot read LLMTrainJob ml/gpt: HTTP 503", transient=True),
               {"status": {"phase": "Succeeded", "rankZero": {"pod": "w-0"}}}]

    def read_job():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    out, said = [], []
    assert follow(read_job, lambda p, c, f: iter([b"done\n"]), out.append, said.append, keep_following=True,
                  sleep=lambda s: None) == 0
    assert out == [b"done\n"] and said == ["cannot read LLMTrainJob ml/gpt: HTTP 503"]

    def missing():
        raise Unreadable("no LLMTrainJob gpt in namespace ml")

    said.clear()
    assert follow(missing, lambda p, c, f: iter([]), out.append, said.append, keep_following=True, sleep=lambda s: None) == 1
    assert said == ["no LLMTrainJob gpt in namespace ml"]


def test_a_pod_replaced_under_the_same_name_is_printed_from_its_first_byte_after_a_line_saying_so():
    """Pods keep their names across replacements: counting printed bytes per name would
    skip the start of the new attempt's log (as long as the old one's)."""
    from llmtrain_operator.logscli import follow

    attempts = {"uid-1": [b"attempt one: step 5\n"], "uid-2": [b"attempt two: resumed\n"]}
    current = ["uid-1", "uid-1", "uid-2", "uid-2"]
    which = []

    def identify(pod):
        which.append(current.pop(0) if len(current) > 1 else current[0])
        return which[-1]

    def read_log(pod, container, following):
        yield from attempts[which[-1]]

    out, said = [], []
    running = {"phase": "Running", "rankZero": {"pod": "w-0"}}
    code = follow(_statuses(running, running, running, {"phase": "Succeeded", "rankZero": {"pod": "w-0"}}), read_log, out.append,
                  said.append, keep_following=True, sleep=lambda s: None, identify=identify)
    assert code == 0 and b"".join(out) == b"attempt one: step 5\nattempt two: resumed\n", out
    assert said == ["----- pod w-0 was replaced: its new attempt's log -----"], said


def test_an_unreadable_uid_keeps_the_count_of_the_pod_it_had():
    from llmtrain_operator.logscli import follow

    uids = iter(["uid-1", None, None])
    out = []
    running = {"phase": "Running", "rankZero": {"pod": "w-0"}}
    follow(_statuses(running, running, {"phase": "Succeeded", "rankZero": {"pod": "w-0"}}), lambda p, c, f: iter([b"step 5\n"]),
           out.append, lambda m: None, keep_following=True, sleep=lambda s: None, identify=lambda pod: next(uids, None))
    assert b"".join(out) == b"step 5\n", "printed once: a failed uid read is not a new pod"


def test_failed_reads_a_kept_failed_pods_log_once_and_names_what_is_kept_otherwise():
    from llmtrain_operator.logscli import follow

    status = {"phase": "Running", "rankZero": {"pod": "w-0-1"}, "keptPods": ["w-0", "w-1"]}
    read, out, said = [], [], []

    def read_log(pod, container, following):
        read.append((pod, container, following))
        yield b"the crash\n"

    assert follow(_statuses(status), read_log, out.append, said.append, keep_following=True, failed=2) == 0
    assert read == [("w-1", "trainer", False)] and out == [b"the crash\n"], "not followed: it has ended"
    assert said == ["----- failed pod w-1: its log as it ended -----"]
    said.clear()
    assert follow(_statuses(status), read_log, out.append, said.append, keep_following=False, failed=3) == 1
    assert said == ["the job keeps 2 failed pod(s): w-0, w-1 (status.keptPods, faultTolerance.keepFailedPods); there is no #3"]
    assert follow(_statuses({"phase": "Running"}), read_log, out.append, said.append, keep_following=False, failed=1) == 1
    assert "keeps 0 failed pod(s) (status.keptPods" in said[-1]
    assert follow(_statuses(status), read_log, out.append, said.append, keep_following=False, failed=0) == 1
    assert "counts from 1" in said[-1]


def test_failed_of_a_failed_job_starts_with_the_pod_that_failed_it():
    from llmtrain_operator.logscli import kept_pod

    status = {"phase": "Failed", "lastFailure": {"pod": "w-1-2"}, "keptPods": ["w-1-1", "w-0"]}
    assert [kept_pod(status, n)[0] for n in (1, 2, 3)] == ["w-1-2", "w-1-1", "w-0"]
    running = {**status, "phase": "Running", "lastFailure": {"pod": "w-1-1"}}
    assert kept_pod(running, 1)[0] == "w-1-1", "a running job's last failure is its newest kept pod"


RANKS = [{"pod": "j-worker-1-1", "first": 0, "last": 1}, {"pod": "j-worker-0", "first": 2, "last": 3}]


def test_rank_r_reads_the_pod_holding_it_and_follows_it_when_it_moves():
    from llmtrain_operator.logscli import follow

    logs = {"j-worker-0": [b"rank 2 and 3\n"], "j-worker-2": [b"rank 2 again\n"]}
    read = []

    def read_log(pod, container, following):
        read.append(pod)
        yield from logs[pod]

    out, said = [], []
    moved = [{"pod": "j-worker-1-1", "first": 0, "last": 1}, {"pod": "j-worker-2", "first": 2, "last": 3}]
    code = follow(_statuses({"phase": "Running", "ranks": RANKS}, {"phase": "Running", "ranks": moved},
                            {"phase": "Succeeded", "ranks": moved}),
                  read_log, out.append, said.append, keep_following=True, sleep=lambda s: None, rank=3)
    assert code == 0 and b"".join(out) == b"rank 2 and 3\nrank 2 again\n"
    assert read[0] == "j-worker-0" and set(read[1:]) == {"j-worker-2"}
    assert said == ["----- rank 3 moved: pod j-worker-2 (the job restarted) -----"]
    # A rank no pod holds (past the world size, or not yet scraped) says so, with the world size.
    said.clear()
    assert follow(_statuses({"phase": "Running", "ranks": RANKS, "worldSize": 4}), read_log, out.append, said.append,
                  keep_following=False, rank=4) == 1
    assert said == ["no pod holds global rank 4 now (status.ranks; world size 4, ranks 0-3); -f waits for one"]


def test_rank_zero_comes_from_rank_zero_and_a_forged_ranks_entry_is_not_believed():
    from llmtrain_operator.logscli import rank_holder

    status = {"rankZero": {"pod": "a", "container": "trainer"}, "ranks": RANKS}
    assert rank_holder(status, 0)["pod"] == "a"
    assert rank_holder(status, 1)["pod"] == "j-worker-1-1" and rank_holder(status, 3)["pod"] == "j-worker-0"
    hostile = {"ranks": [{"pod": 7, "first": 0, "last": 9}, {"pod": "x", "first": "0", "last": 9}, "junk",
                         {"pod": "y", "first": 0, "last": None}]}
    assert all(rank_holder(hostile, r) is None for r in range(10))


def _pod(name, slot, attempt, phase="Running", kept=False):
    labels = {"llmtrain.io/slot": str(slot), "llmtrain.io/incarnation": str(attempt)}
    if kept:
        labels["llmtrain.io/kept"] = "true"
    return {"metadata": {"name": name, "labels": labels}, "status": {"phase": phase}}


PODS = [_pod("j-worker-0", 0, 0), _pod("j-worker-1", 1, 0, "Failed", kept=True), _pod("j-worker-1-1", 1, 1),
        _pod("j-worker-1-2", 1, "2x"), _pod("j-worker-1-3", 1, "²")]


def test_attempt_names_the_slots_nth_pod_for_the_rank_or_the_pod_given():
    from llmtrain_operator.logscli import attempt_pod

    status = {"ranks": RANKS, "rankZero": {"pod": "j-worker-1-1"}}
    # Rank 0 lives in slot 1's attempt 1; its attempt 0 failed and is kept with its log.
    assert attempt_pod(status, PODS, 0, 0, None) == (
        "j-worker-1", "----- pod j-worker-1: attempt 0 of worker slot 1 (Failed, kept) -----", True)
    assert attempt_pod(status, PODS, 1, 1, None) == (
        "j-worker-1-1", "----- pod j-worker-1-1: attempt 1 of worker slot 1 (Running) -----", False)
    # From a kept pod to the attempt after it; from another slot.
    assert attempt_pod(status, PODS, 1, 0, "j-worker-1")[0] == "j-worker-1-1"
    assert attempt_pod(status, PODS, 0, 2, None)[0] == "j-worker-0"
    # An attempt that is gone names those left (a label that is not a number is not one).
    pod, line, _ = attempt_pod(status, PODS, 2, 0, None)
    assert pod is None and "worker slot 1 has no attempt 2 left: it has 0 (j-worker-1), 1 (j-worker-1-1)" in line
    assert "keepFailedPods" in line


def test_attempt_refuses_what_names_no_pod_of_the_job():
    from llmtrain_operator.logscli import attempt_pod

    status = {"ranks": RANKS, "rankZero": {"pod": "j-worker-1-1"}, "worldSize": 4}
    assert attempt_pod(status, PODS, -1, 0, None)[:2] == (None, "--attempt counts from 0 (a slot's first pod), not -1")
    assert attempt_pod(status, PODS, 0, 0, "other-job-worker-0")[:2] == (
        None, "pod other-job-worker-0 is not one of the job's worker pods")
    assert attempt_pod(status, PODS, 0, 9, None)[1] == "no pod holds global rank 9 now (status.ranks; world size 4, ranks 0-3)"
    assert attempt_pod(status, [{"metadata": {}}, {"status": {}}, _pod("j-worker-1-1", 1, 1)], 0, 0, None)[0] is None


def test_the_command_refuses_a_negative_rank_and_attempt_with_failed_before_reaching_any_cluster(capsys, monkeypatch):
    import argparse

    from llmtrain_operator import logscli

    monkeypatch.setattr(logscli, "connect", lambda: (_ for _ in ()).throw(AssertionError("no cluster is asked")))
    parser = argparse.ArgumentParser()
    logscli.add_parser(parser.add_subparsers())
    assert logscli.run(parser.parse_args(["logs", "j", "--rank", "-1"])) == 2
    assert "--rank counts from 0" in capsys.readouterr().err
    assert logscli.run(parser.parse_args(["logs", "j", "--failed", "2", "--attempt", "0"])) == 2
    assert "give one of them" in capsys.readouterr().err
