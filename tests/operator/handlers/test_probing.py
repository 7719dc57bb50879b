"""Which of a job's running workers a pass reads (``handlers/probing.py``): a job up to
the cap is read whole at every pass; a larger one reads its urgent workers and the cap
read longest ago, every worker within ceil(N / cap) passes, and all of them in the same
pass when an answer shows a failure or a restart. The planner sees what lasts of the
others' answers, never a step read passes ago."""

from __future__ import annotations

import importlib
import math
from dataclasses import replace

import pytest

from llmtrain_operator.api.observed import ContainerMemory, TrainerProbe
from llmtrain_operator.handlers.probing import MIN_PODS_PER_PASS, ProbeBook, lasting_launcher, lasting_trainer, pods_per_pass
from llmtrain_operator.probe import UNASKED, LauncherReport
from llmtrain_operator.settings import OperatorSettings
from llmtrain_operator.silence import Silences
from support.planning import worker

reconcile_module = importlib.import_module("llmtrain_operator.handlers.reconcile")

JOB = ("ml", "big")


def workers(n: int, ready: bool = True) -> list:
    return [worker(i, uid=f"u{i}", ready=ready) for i in range(n)]


def trainer_pages(pods, step: int = 7, restarts: int = 0, failed: dict | None = None) -> dict[str, TrainerProbe]:
    return {p.name: TrainerProbe(step=step, world_size=len(pods), restarts=restarts, rank=i, last_step_time=1000.0 + step,
                                 failed_attempts=dict(failed or {}), loss=2.5, tokens_per_second=100.0)
            for i, p in enumerate(pods)}


def launcher_pages(pods, failed: dict[str, dict[str, int]] | None = None, attempt: int | dict[str, int] = 0,
                   steps: dict[str, int] | None = None) -> dict[str, LauncherReport]:
    failed, steps = failed or {}, steps or {}
    attempts = attempt if isinstance(attempt, dict) else {p.name: attempt for p in pods}
    return {p.name: LauncherReport(dict(failed.get(p.name, {})), workers_running=True, peer_wait=None,
                                   memory=ContainerMemory(0, 10, 100), attempt=attempts.get(p.name, 0),
                                   step=steps.get(p.name)) for p in pods}


def one_pass(book: ProbeBook, running, cap: int, trainers, launchers, builtin: bool = True) -> list:
    """A pass as ``reconcile.read_workers`` runs it; returns every pod read."""
    first = book.first_round(JOB, running, cap)
    answer = lambda pods, pages: {p.name: pages[p.name] for p in pods if p.name in pages}  # noqa: E731
    rest = book.record(JOB, first, running, answer(first, trainers), answer(first, launchers), builtin)
    if rest:
        book.record(JOB, rest, running, answer(rest, trainers), answer(rest, launchers), builtin)
    return first + rest


def test_a_pass_answering_an_event_leaves_the_rotation_to_a_routine_pass_unless_it_is_long_overdue():
    """A node lost under 64 jobs woke every one of them at once, and again when its grace
    ended: their rotations' pages slowed the answers (docs/benchmarks.md, "Operator scale")."""
    now = [0.0]
    book, pods = ProbeBook(clock=lambda: now[0]), workers(200)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 16, trainers, launchers)  # knows nobody: reads all
    assert len(book.first_round(JOB, pods, 16)) == 17, "a routine pass: rank 0 and the rotation"
    now[0] = 4.0
    assert book.first_round(JOB, pods, 16, urgent_pass=True, rotate_every=10.0) == [pods[0]], "rank 0 only"
    assert not book.rotation_deferred(JOB), "the rotation was not due"
    fresh = workers(201)[-1]  # a replacement not read yet
    assert book.first_round(JOB, [*pods, fresh], 16, urgent_pass=True, rotate_every=10.0) == [pods[0], fresh]
    now[0] = 12.0
    assert book.first_round(JOB, pods, 16, urgent_pass=True, rotate_every=10.0) == [pods[0]]
    assert book.rotation_deferred(JOB), "due: a routine pass is asked for right after"
    assert len(book.first_round(JOB, pods, 16)) == 17 and not book.rotation_deferred(JOB), "the routine pass rotates"
    now[0] = 42.0
    assert len(book.first_round(JOB, pods, 16, urgent_pass=True, rotate_every=10.0)) == 17, \
        "overdue three times over: an urgent pass rotates too (events keeping a job busy never starve it)"
    one_pass(book, pods, 16, trainers, launcher_pages(pods, attempt=1))  # a group restart: the next pass sweeps
    assert len(book.first_round(JOB, pods, 16, urgent_pass=True, rotate_every=10.0)) == 200, "a sweep reads all"


def test_a_job_up_to_the_cap_is_read_whole_at_every_pass():
    book, pods = ProbeBook(), workers(64)
    for _ in range(3):
        assert one_pass(book, pods, 64, trainer_pages(pods), launcher_pages(pods)) == pods
    assert one_pass(book, pods, 0, trainer_pages(pods), launcher_pages(pods)) == pods, "0: every worker, every pass"


@pytest.mark.parametrize(("n", "cap"), [(200, 16), (1024, 64), (130, 64)])
def test_a_large_job_reads_its_rank_zero_and_the_cap_read_longest_ago_and_every_worker_in_time(n, cap):
    book, pods = ProbeBook(), workers(n)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    assert len(one_pass(book, pods, cap, trainers, launchers)) == n, "the first pass knows nobody: it reads all"
    rounds = math.ceil((n - 1) / cap)
    seen: dict[str, int] = {}
    for i in range(3 * rounds):
        read = one_pass(book, pods, cap, trainers, launchers)
        assert len(read) == cap + 1, f"pass {i}: {len(read)} read"
        assert pods[0] in read, "the pod of global rank 0 is read at every pass"
        for p in read:
            if p is not pods[0]:
                assert i - seen.get(p.name, -rounds) >= rounds - 1, f"{p.name} read again before the others"
                seen[p.name] = i
    assert len(seen) == n - 1, "every worker was read within the rounds"


def test_silent_new_and_unready_workers_are_read_at_every_pass():
    book, pods = ProbeBook(), workers(100)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 8, trainers, launchers)
    # Worker 50's launcher stops answering the pass it is read; worker 60 goes not ready;
    # worker 70 is replaced (another uid).
    quiet = {k: v for k, v in launchers.items() if k != pods[50].name}
    pods[60] = worker(60, uid="u60", ready=False)
    pods[70] = worker(70, uid="u70-new")
    first = {p.name: p.uid for p in one_pass(book, pods, 8, trainers, quiet)}
    assert first.get(pods[70].name) == "u70-new", "a new uid is read at the first pass it runs"
    for _ in range(12):
        names = {p.name for p in one_pass(book, pods, 8, trainers, quiet)}
        assert {pods[0].name, pods[60].name} <= names
        if pods[50].name in names:
            break
    for _ in range(3):
        names = {p.name for p in one_pass(book, pods, 8, trainers, quiet)}
        assert pods[50].name in names, "a worker that did not answer is read again at every pass"
        assert pods[60].name in names, "a worker its kubelet marks not ready is read at every pass"
        assert len(names) == 11, "and otherwise rank 0's pod and the rotation"


def test_a_crash_anywhere_is_read_in_the_pass_that_sees_the_group_restart_and_lagging_peers_after():
    """An in-place crash of pod 237's ranks: its launcher counts a crash; torchrun restarts
    every pod's worker group (each launcher's attempt moves) without counting anything on
    the others, and rank 0's page shows nothing new. The first pass that reads a moved
    attempt (rank 0's pod, read every pass) reads every worker, so the crash is seen in
    that pass; the next passes read all again while answers still change (a peer that
    restarts a moment later), then the rotation resumes."""
    book, pods = ProbeBook(), workers(300)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 16, trainers, launchers)
    one_pass(book, pods, 16, trainers, launchers)
    # Rank 0's group restarted first; the others, pod 237 among them, a moment later.
    lagging = launcher_pages(pods, attempt={pods[0].name: 1})
    assert len(one_pass(book, pods, 16, trainers, lagging)) == 300
    later = launcher_pages(pods, {pods[237].name: {"crash": 1}}, attempt=1)
    read = one_pass(book, pods, 16, trainers, later)
    assert len(read) == 300 and pods[237] in read, "the pass after a change reads every worker again"
    assert len(one_pass(book, pods, 16, trainers, later)) == 300, "it saw changes: once more"
    assert len(one_pass(book, pods, 16, trainers, later)) == 17, "a pass without a change: back to the rotation"


@pytest.mark.parametrize("change", ["oom", "failed", "attempt", "world", "rank", "tier", "straggler", "nothing"])
def test_a_change_others_would_show_reads_every_worker_and_progress_alone_does_not(change):
    book, pods = ProbeBook(), workers(100)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 8, trainers, launchers)
    zero, launcher = trainers[pods[0].name], launchers[pods[0].name]
    if change == "oom":
        launchers = {**launchers, pods[0].name: replace(launcher, memory=ContainerMemory(1, 100, 100))}
    elif change == "failed":
        launchers = {**launchers, pods[0].name: replace(launcher, failed={"victim": 1})}
    elif change == "attempt":
        launchers = {**launchers, pods[0].name: replace(launcher, attempt=1)}
    elif change == "world":
        trainers = {k: replace(v, world_size=99) for k, v in trainers.items()}
    elif change == "rank":
        trainers = {**trainers, pods[0].name: replace(zero, rank=5)}
    elif change == "tier":
        trainers = {**trainers, pods[0].name: replace(zero, tier_degraded={"shared": "Unreachable"})}
    elif change == "straggler":
        trainers = {**trainers, pods[0].name: replace(zero, stragglers={3: 2.5})}
    else:  # a step, its time, loss and throughput move at every pass: no reason to read all
        trainers = {k: replace(v, step=8, last_step_time=2000.0, loss=2.4, tokens_per_second=99.0) for k, v in trainers.items()}
        launchers = {k: replace(v, memory=ContainerMemory(0, 50, 100)) for k, v in launchers.items()}
    assert len(one_pass(book, pods, 8, trainers, launchers)) == (9 if change == "nothing" else 100)


def test_no_worker_known_to_hold_rank_zero_reads_every_worker_until_one_does():
    book, pods = ProbeBook(), workers(100)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 8, trainers, launchers)
    # Rank 0's pod was replaced: its successor (a new uid) runs, its trainer not up yet.
    successor = worker(0, uid="u0-new")
    pods = [successor] + pods[1:]
    starting = {k: v for k, v in trainers.items() if k != successor.name}
    for _ in range(2):
        assert len(one_pass(book, pods, 8, starting, launchers)) == 100
    # Its trainer answers as rank 0: known again, and no page changed, so the rotation.
    up = {**starting, successor.name: TrainerProbe(step=7, rank=0, world_size=100)}
    assert len(one_pass(book, pods, 8, up, launchers)) == 9
    assert len(one_pass(book, pods, 8, up, launchers)) == 9


def test_a_scripts_pod_that_reports_the_newest_step_is_read_at_every_pass():
    """A user's script serves no trainer page: its progress is the step its launcher
    serves, here from one rank only; that pod is read at every pass (the wedge backstop
    would otherwise see no progress for up to ceil(N / cap) passes)."""
    book, pods = ProbeBook(), workers(100)
    one_pass(book, pods, 8, {}, launcher_pages(pods, steps={pods[42].name: 10}), builtin=False)
    for step in range(11, 20):
        read = one_pass(book, pods, 8, {}, launcher_pages(pods, steps={pods[42].name: step}), builtin=False)
        assert pods[42] in read and len(read) == 9


def test_a_job_at_the_cap_with_pods_on_their_way_out_is_still_read_whole():
    book, pods = ProbeBook(), workers(8)
    leaving = [replace(worker(i, uid=f"old{i}"), name=f"tiny-elastic-worker-{i}-old", deleting=True) for i in range(4)]
    running = pods + leaving
    one_pass(book, running, 8, trainer_pages(running), launcher_pages(running))
    assert len(one_pass(book, running, 8, trainer_pages(running), launcher_pages(running))) == 12


def test_a_replica_that_leads_again_reads_every_worker():
    book, pods = ProbeBook(), workers(100)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 8, trainers, launchers)
    assert len(one_pass(book, pods, 8, trainers, launchers)) == 9
    book.clear()
    assert len(one_pass(book, pods, 8, trainers, launchers)) == 100


def test_what_lasts_of_an_answer_keeps_counts_and_facts_never_progress():
    page = TrainerProbe(step=90, world_size=8, restarts=2, failed_attempts={"crash": 1}, last_step_time=5.0,
                        last_checkpoint={"local": 80}, tier_degraded={"local": "NoSpace"}, interval_steps=10, cost_seconds=1.0,
                        latency_seconds=1.0, mtbf_seconds=60.0, step_seconds=0.5, loss=2.0, tokens_per_second=9.0, rank=8,
                        rollbacks=1, heals=3, skipped=((1, 2, 3, 4),), stragglers={9: 2.5}, rejected=("metric x value (y)",))
    kept = lasting_trainer(page)
    assert kept == TrainerProbe(failed_attempts={"crash": 1}, last_checkpoint={"local": 80}, tier_degraded={"local": "NoSpace"},
                                rank=8, rollbacks=1, heals=3, skipped=((1, 2, 3, 4),), stragglers={9: 2.5})
    report = LauncherReport({"crash": 2}, workers_running=True, step=5, last_step_time=3.0, memory=ContainerMemory(1, 5, 9),
                            peer_wait=40.0, rejected=("z",))
    assert lasting_launcher(report) == LauncherReport({"crash": 2}, memory=ContainerMemory(1, 5, 9))


def test_the_others_are_shown_by_what_lasts_and_forgotten_when_they_stop_running():
    book, pods = ProbeBook(), workers(100)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 8, trainers, launchers)
    read = one_pass(book, pods, 8, trainers, launchers)
    kept_trainers, kept_launchers = book.lasting(JOB, pods, read)
    assert set(kept_trainers) == set(kept_launchers) == {p.name for p in pods} - {p.name for p in read}
    assert all(t.step is None and t.rank is not None for t in kept_trainers.values())
    # A pod that no longer runs is forgotten (the book is bounded by the running workers).
    one_pass(book, pods[:50], 8, trainers, launchers)
    assert set(book.lasting(JOB, pods, [])[0]) <= {p.name for p in pods[:50]}
    book.forget(JOB)
    assert book.lasting(JOB, pods, []) == ({}, {})


def test_a_silence_is_kept_across_passes_that_do_not_read_the_pod():
    now = [100.0]
    silences = Silences(lambda: now[0])
    pods = workers(3)
    assert silences.track(JOB, pods, {pods[0].name: 1, pods[1].name: 1}) == {pods[2].name: 0.0}
    now[0] += 2
    # A pass that reads only pod 0: pod 2's silence is kept, not restarted.
    assert silences.track(JOB, pods[:1], {pods[0].name: 1}, running=pods) == {}
    now[0] += 2
    assert silences.track(JOB, pods, {pods[0].name: 1, pods[1].name: 1}) == {pods[2].name: 4.0}
    assert silences.since_answer(JOB) == {}


async def test_read_workers_reads_the_failed_pod_in_the_pass_that_sees_the_group_restart(monkeypatch):
    """Through ``reconcile.read_workers`` with 256 workers served by fakes: the requests
    per pass follow the cap, and the pass after an in-place crash in a pod outside the
    rotation hands the planner that pod's crash count."""
    pods = workers(256)
    state = {"failed": {}}
    requests = []

    async def probe_workers(targets, port, timeout):
        requests.extend(("trainer", p.name) for p in targets)
        return {p.name: TrainerProbe(step=3, rank=p.slot, world_size=256) for p in targets}

    async def probe_launchers(targets, timeout):
        requests.extend(("launcher", p.name) for p in targets)
        return {p.name: LauncherReport(dict(state["failed"].get(p.name, {})), attempt=1 if state["failed"] else 0)
                for p in targets}

    monkeypatch.setattr(reconcile_module, "probe_workers", probe_workers)
    monkeypatch.setattr(reconcile_module, "probe_launchers", probe_launchers)
    monkeypatch.setattr(reconcile_module, "PROBE_BOOK", ProbeBook())
    settings = OperatorSettings(probe_pods_per_pass=32)
    first = await reconcile_module.read_workers(JOB, pods, True, 9400, settings)
    assert len(first.probed) == 256 and len(requests) == 512
    requests.clear()
    steady = await reconcile_module.read_workers(JOB, pods, True, 9400, settings)
    assert len(steady.probed) == 33 and len(requests) == 66, "rank 0's pod and 32 more"
    assert len(steady.trainers) == 256 and all(t.step is None for n, t in steady.trainers.items()
                                                if n not in {p.name for p in steady.probed})
    far = next(p for p in pods if p not in steady.probed and p.slot > 100)
    state["failed"] = {far.name: {"crash": 1}}  # and every group restarted: each launcher's attempt moved
    requests.clear()
    after = await reconcile_module.read_workers(JOB, pods, True, 9400, settings)
    assert far in after.probed and after.all_launchers[far.name].failed == {"crash": 1}
    assert len(after.probed) == 256


def test_many_jobs_share_a_page_budget_and_small_jobs_are_always_read_whole():
    # 64 jobs at a 10 s resync and 200 pages a second: 15 workers a pass each, beyond the urgent.
    assert pods_per_pass(64, 200, 10, 64) == 15
    assert pods_per_pass(64, 200, 10, 1) == 64, "one job: the cap"
    assert pods_per_pass(64, 200, 10, 500) == MIN_PODS_PER_PASS == 8, "500 jobs of 2 workers are still read whole"
    assert pods_per_pass(4, 200, 10, 500) == 4
    assert pods_per_pass(64, 0, 10, 500) == 64, "no budget: the cap"
    assert pods_per_pass(0, 200, 10, 500) == 0, "0: every worker"


async def test_a_pod_that_could_not_be_asked_is_not_read_this_pass_and_not_silent(monkeypatch):
    """The prober's queue bound (``probe.UNASKED``): those pods were not asked, so they
    neither answered nor stayed silent, and their book entries stay as they were."""
    pods = workers(100)
    crowded = {p.name for p in pods[50:]}

    async def probe_workers(targets, port, timeout):
        return {p.name: UNASKED if p.name in crowded else TrainerProbe(step=3, rank=p.slot, world_size=100) for p in targets}

    async def probe_launchers(targets, timeout):
        return {p.name: UNASKED if p.name in crowded else LauncherReport({}) for p in targets}

    monkeypatch.setattr(reconcile_module, "probe_workers", probe_workers)
    monkeypatch.setattr(reconcile_module, "probe_launchers", probe_launchers)
    monkeypatch.setattr(reconcile_module, "PROBE_BOOK", ProbeBook())
    reading = await reconcile_module.read_workers(JOB, pods, True, 9400, OperatorSettings(probe_pods_per_pass=8))
    assert {p.name for p in reading.probed} == {p.name for p in pods[:50]}
    assert set(reading.launchers) == {p.name for p in pods[:50]} and UNASKED not in reading.trainers.values()
    silences = Silences(lambda: 0.0)
    assert silences.track(JOB, reading.probed, reading.launchers, pods) == {}
    # Not asked means not known: they are read first at the next pass.
    crowded.clear()
    again = await reconcile_module.read_workers(JOB, pods, True, 9400, OperatorSettings(probe_pods_per_pass=8))
    assert {p.name for p in pods[50:]} <= {p.name for p in again.probed}


def test_a_pod_read_before_that_could_not_be_asked_is_read_first_at_the_next_pass():
    book, pods = ProbeBook(), workers(100)
    trainers, launchers = trainer_pages(pods), launcher_pages(pods)
    one_pass(book, pods, 8, trainers, launchers)
    read = one_pass(book, pods, 8, trainers, launchers)
    asked_late = read[-1]  # in this pass's rotation; its request never started
    assert asked_late is not pods[0]
    book.unasked(JOB, [asked_late])
    assert asked_late in book.first_round(JOB, pods, 8)[:2], "urgent: with rank 0's pod, ahead of the rotation"


def test_the_setting_is_read_and_refuses_a_negative_count():
    from llmtrain_operator.settings import ConfigError, from_env

    assert from_env({"LLMTRAIN_OPERATOR_PROBE_PODS_PER_PASS": "0"}).probe_pods_per_pass == 0
    assert from_env({}).probe_pods_per_pass == 64
    with pytest.raises(ConfigError, match="PROBE_PODS_PER_PASS"):
        from_env({"LLMTRAIN_OPERATOR_PROBE_PODS_PER_PASS": "-1"})

