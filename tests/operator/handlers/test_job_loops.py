"""The per-job loops: which watch events wake a job, and the event-to-action latency they
report (handlers/loops.py, handlers/wakes.py)."""

from __future__ import annotations

import asyncio
import copy

import pytest

from llmtrain_operator import handlers
from llmtrain_operator.handlers.loops import JobLoops, Next
from llmtrain_operator.handlers.wakes import beyond_status, jobs_of_node

JOB = {"apiVersion": "llmtrain.io/v1alpha1", "kind": "LLMTrainJob",
       "metadata": {"name": "a", "namespace": "ns", "generation": 1, "resourceVersion": "10", "labels": {"x": "1"}},
       "spec": {"replicas": {"min": 1, "max": 2}}, "status": {"phase": "Running", "step": 5}}


def changed(**edits):
    body = copy.deepcopy(JOB)
    for path, value in edits.items():
        node = body
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return body


@pytest.mark.parametrize("edit", [{"status__step": 6}, {"metadata__resourceVersion": "11"},
                                  {"metadata__managedFields": [{"manager": "llmtrain-operator"}]}])
def test_a_change_to_the_status_alone_is_not_beyond_the_status(edit):
    assert not beyond_status(JOB, changed(**edit))


@pytest.mark.parametrize("edit", [{"spec__replicas": {"min": 1, "max": 3}}, {"metadata__generation": 2},
                                  {"metadata__labels": {"x": "2"}}, {"metadata__annotations": {"a": "b"}},
                                  {"metadata__deletionTimestamp": "2026-01-01T00:00:00Z"}])
def test_any_other_change_is(edit):
    assert beyond_status(JOB, changed(**edit))


def pod(name, node, owner):
    return {"metadata": {"name": name, "ownerReferences": [{"uid": owner}]},
            "spec": {"nodeName": node} if node else {}}


def body(uid, charged=()):
    return {"metadata": {"uid": uid}, "status": {"internal": {"chargedFailures": list(charged)}}}


def test_a_node_concerns_the_jobs_that_own_a_pod_on_it_or_a_charged_failure_of_it():
    pods = {("ns", "on-it"): [pod("p0", "node-1", "u-on"), pod("p1", "node-2", "u-on")],
            ("ns", "elsewhere"): [pod("p2", "node-2", "u-else")], ("ns", "pending"): [pod("p3", None, "u-pending")],
            # A namesake's leftover: it carries the job's label, but the job does not own it.
            ("ns", "namesake"): [pod("p4", "node-1", "u-deleted-namesake")]}
    bodies = {("ns", "on-it"): body("u-on"), ("ns", "elsewhere"): body("u-else"), ("ns", "pending"): body("u-pending"),
              ("ns", "namesake"): body("u-namesake"),
              ("ns", "remembers"): body("u-r", ["node:node-1@2026-01-01T00:00:00Z"]),
              ("ns", "remembers-another"): body("u-ra", ["node:node-10@t", "pod:abc"])}
    assert jobs_of_node("node-1", pods, bodies) == {("ns", "on-it"), ("ns", "remembers")}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def run_loops(script):
    """Run ``script(loops, passes, latencies, clock)`` with loops whose passes record the
    keys they ran for and act (or raise, while ``fail`` holds a key)."""
    async def main():
        clock, passes, latencies, fail = Clock(), [], [], set()
        loops: JobLoops

        async def one_pass(key):
            passes.append(key)
            if key in fail:
                raise RuntimeError("the API server said no")
            loops.acted(key)
            return 3600.0

        loops = JobLoops(one_pass, on_acted=latencies.append, clock=clock)
        try:
            await script(loops, passes, latencies, clock, fail)
        finally:
            await loops.stop()

    asyncio.run(main())


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_operators_own_status_write_does_not_wake_the_job_but_a_spec_change_does():
    async def script(loops, passes, latencies, clock, fail):
        key = ("ns", "a")
        assert loops.seen(key, None, JOB)
        await settle()
        assert passes == [key]
        assert not loops.seen(key, "MODIFIED", changed(status__step=9, metadata__resourceVersion="11"))
        await settle()
        assert passes == [key], "a status-only event started a pass"
        assert loops.body(key)["status"]["step"] == 9, "the newest body is kept all the same (read-your-writes)"
        assert loops.seen(key, "MODIFIED", changed(spec__replicas={"min": 1, "max": 3}))
        await settle()
        assert passes == [key, key]

    run_loops(script)


def test_event_to_action_runs_from_the_earliest_unanswered_event_and_a_failed_pass_keeps_it():
    async def script(loops, passes, latencies, clock, fail):
        key = ("ns", "a")
        loops.seen(key, None, JOB)
        await settle()
        assert len(latencies) == 1
        fail.add(key)
        clock.now = 200.0
        loops.wake(key)  # a pod event
        clock.now = 200.5
        await settle()
        assert len(passes) == 2 and len(latencies) == 1, "a failed pass reported a latency"
        clock.now = 203.0
        fail.clear()
        loops.wake(key)  # the retry (a second event meanwhile does not reset the clock)
        await settle()
        assert latencies[-1] == pytest.approx(3.0), "the retry's latency counts from the first event"

    run_loops(script)


def test_an_urgent_deadline_starts_a_pass_that_answers_it_and_a_routine_timer_does_not():
    """A node's grace ending or a backoff running out acts on a failure: its pass goes ahead
    of routine ones (``answering``), counted from the deadline."""
    async def main():
        clock, latencies, answering = Clock(), [], []
        loops: JobLoops
        nexts = [Next(0.05, 0.01), Next(0.01, 0.05), Next(0.01), Next(3600.0)]

        async def one_pass(key):
            answering.append(loops.answering(key))
            clock.now += 0.5
            loops.acted(key)
            return nexts.pop(0)

        loops = JobLoops(one_pass, on_acted=latencies.append, clock=clock)
        loops.seen(("ns", "a"), None, JOB)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not nexts:
                break
        await loops.stop()
        # The first pass answers the job's event; the second its urgent deadline (0.01 s);
        # the third, a routine timer that came before the urgent one, nothing; the fourth
        # a routine timer.
        assert answering == [True, True, False, False]
        assert latencies == [pytest.approx(0.5), pytest.approx(0.5)]

    asyncio.run(main())


def test_a_standby_counts_the_events_it_answers_from_its_takeover():
    async def main():
        clock, latencies = Clock(), []
        loops: JobLoops

        async def one_pass(key):
            clock.now += 50.0  # waited for the Lease
            loops.count_from_now(key)
            clock.now += 0.25
            loops.acted(key)
            return 3600.0

        loops = JobLoops(one_pass, on_acted=latencies.append, clock=clock)
        loops.seen(("ns", "a"), None, JOB)
        await settle()
        await loops.stop()
        assert latencies == [pytest.approx(0.25)]

    asyncio.run(main())


def test_a_node_heartbeat_wakes_no_job_and_a_node_going_not_ready_wakes_only_its_jobs(monkeypatch):
    woken = []

    class Loops:
        def bodies(self):
            return {("ns", "on-1"): body("u-1"), ("ns", "on-2"): body("u-2")}

        def wake(self, key):
            woken.append(key)

    monkeypatch.setattr(handlers, "LOOPS", Loops())
    monkeypatch.setattr(handlers, "_NODE_VIEWS", {})
    monkeypatch.setattr(handlers, "_INDEXES", {"pods_by_job": {("ns", "on-1"): [pod("p", "node-1", "u-1")],
                                                               ("ns", "on-2"): [pod("q", "node-2", "u-2")]}})

    def node(ready, heartbeat):
        return {"metadata": {"name": "node-1"}, "status": {"conditions": [
            {"type": "Ready", "status": ready, "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": heartbeat}]}}

    asyncio.run(handlers.node_changed(type=None, name="node-1", body=node("True", "t1")))
    assert woken == [("ns", "on-1")]
    asyncio.run(handlers.node_changed(type="MODIFIED", name="node-1", body=node("True", "t2")))
    assert woken == [("ns", "on-1")], "a heartbeat woke a job"
    asyncio.run(handlers.node_changed(type="MODIFIED", name="node-1", body=node("Unknown", "t2")))
    assert woken == [("ns", "on-1"), ("ns", "on-1")]
    asyncio.run(handlers.node_changed(type="DELETED", name="node-1", body=node("Unknown", "t2")))
    assert woken == [("ns", "on-1")] * 3


def test_a_created_child_counts_as_seen_only_once_the_watch_shows_it_owned_by_the_job(monkeypatch):
    # Read-your-writes after a pass: an object of that name that another (deleted) job of
    # the same name still owns is not the one this pass created.
    class Loops:
        def body(self, key):
            return {**body("u-1"), "status": {"lastReconcileTime": "t"}}

    indexes = {"pods_by_job": {("ns", "a"): [pod("a-worker-0", "node-1", "u-old")]}, "nodes_by_name": {},
               "services_by_job": {("ns", "a"): [{"metadata": {"name": "a-workers", "ownerReferences": [{"uid": "u-1"}]}}]},
               "configmaps_by_job": {}, "networkpolicies_by_job": {}}
    monkeypatch.setattr(handlers, "LOOPS", Loops())
    monkeypatch.setattr(handlers, "_INDEXES", indexes)
    assert handlers._visible(("ns", "a"), "t", (("Service", "a-workers"),))
    assert not handlers._visible(("ns", "a"), "t", (("Pod", "a-worker-0"),))
    indexes["pods_by_job"][("ns", "a")] = [pod("a-worker-0", "node-1", "u-1")]
    assert handlers._visible(("ns", "a"), "t", (("Pod", "a-worker-0"), ("Service", "a-workers")))
