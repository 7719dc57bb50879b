"""Pods the scheduler cannot place: the ``Unschedulable`` condition carries its words and
what is short, an Event once per pod, nothing charged; cleared when the pods are placed."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from llmtrain_operator.api.observed import MESSAGE_LIMIT, pod_view
from llmtrain_operator.planner import plan
from llmtrain_operator.planner.policies.scheduling import short_resources
from support.planning import NOW, job, observed, running_status, worker

WORDS = ("0/4 nodes are available: 3 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint "
         "{node-role.kubernetes.io/control-plane: }. preemption: 0/4 nodes are available: 4 No preemption victims found.")


def pending(slot: int, uid: str) -> object:
    pod = worker(slot, phase="Pending", ready=False, node=None)
    return dataclasses.replace(pod, node=None, uid=uid, unschedulable=True, schedule_message=WORDS)


def conditions(status):
    return {c["type"]: c for c in status["conditions"]}


def test_unschedulable_pods_are_named_on_the_job_with_the_schedulers_words_and_nothing_is_charged():
    raw = job()
    first = plan(raw, observed(raw, [pending(0, "u0"), pending(1, "u1")]), NOW)
    cond = conditions(first.status)["Unschedulable"]
    assert cond["status"] == "True" and cond["reason"] == "Unschedulable"
    assert "2 pod(s) cannot be scheduled (tiny-elastic-worker-0, tiny-elastic-worker-1)" in cond["message"]
    assert "3 Insufficient nvidia.com/gpu" in cond["message"] and cond["message"].endswith("short of nvidia.com/gpu")
    assert [e.reason for e in first.events].count("Unschedulable") == 2
    assert first.status.get("restarts", 0) == 0 and not first.status.get("lastFailure")
    again = plan({**raw, "status": first.status}, observed(raw, [pending(0, "u0"), pending(1, "u1")]), NOW + timedelta(seconds=5))
    assert "Unschedulable" not in [e.reason for e in again.events]  # once per pod, not per pass
    assert conditions(again.status)["Unschedulable"]["status"] == "True"


def test_the_condition_clears_once_every_pod_is_placed():
    raw = job()
    first = plan(raw, observed(raw, [pending(0, "u0"), pending(1, "u1")]), NOW)
    placed = plan({**raw, "status": {**first.status, **running_status()}}, observed(raw, [worker(0), worker(1)]),
                  NOW + timedelta(seconds=30))
    cond = conditions(placed.status)["Unschedulable"]
    assert (cond["status"], cond["reason"]) == ("False", "Scheduled")


def test_a_job_that_never_waited_gets_no_condition():
    raw = job(status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1)]), NOW)
    assert "Unschedulable" not in conditions(result.status)


def test_the_resources_named_short_end_where_the_name_does():
    assert short_resources("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes") == ["nvidia.com/gpu"]
    assert short_resources("3 Insufficient cpu, 2 Insufficient memory, 1 Insufficient cpu.") == ["cpu", "memory"]


def test_the_pod_view_reads_the_schedulers_message_and_bounds_it():
    pod = {"metadata": {"name": "p", "labels": {"llmtrain.io/role": "worker"}},
           "status": {"phase": "Pending", "conditions": [
               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "x" * 5000}]}}
    view = pod_view(pod)
    assert view.unschedulable and len(view.schedule_message) == MESSAGE_LIMIT + 3
    pod["status"]["conditions"][0]["reason"] = "SchedulerError"
    assert pod_view(pod).schedule_message is None and not pod_view(pod).unschedulable
