"""A rank out of GPU memory (CUDA's allocator refused: exit 88, the failed attempt's cause
``gpu_oom``), charged as ``GPUOutOfMemory`` apart from a crash: restarted in place (the
launcher's counts; a built-in job's memory plan in the message, against the node's GPU
when its labels give the size), or ended with its pod (the rank's own figures from the
termination message)."""

from __future__ import annotations

from datetime import timedelta

from llmtrain_operator.api.observed import NodeView
from llmtrain_operator.planner import plan
from support.planning import NOW, job, observed, running_status, summary, worker

W0, W1 = "tiny-elastic-worker-0", "tiny-elastic-worker-1"


def gpu_node(name: str, mib: int) -> NodeView:
    return NodeView(name, "True", NOW - timedelta(hours=1), gpu_memory_mib=mib, gpu_product="NVIDIA-H100-80GB-HBM3")


def test_an_in_place_gpu_oom_is_charged_once_as_gpu_out_of_memory_with_the_memory_plan():
    raw = job(status=running_status(worldSize=2))
    pods = [worker(0), worker(1)]
    first = plan(raw, observed(raw, pods, launcher_attempts={W1: {"gpu_oom": 1}, W0: {"victim": 1}}), NOW)
    status = first.status
    assert status["restartsByReason"] == {"GPUOutOfMemory": 1} and status["restarts"] == 1, status
    failure = status["lastFailure"]
    assert (failure["kind"], failure["reason"], failure["pod"]) == ("ProcessCrash", "GPUOutOfMemory", W1)
    assert f"a rank in pod {W1} on node node-1 ran out of GPU memory" in failure["message"], failure
    assert "the memory plan at world size 2: peak " in failure["message"], failure
    assert "fit a GPU" not in failure["message"], "no node label: the GPU's size is unknown"
    assert any(e.reason == "RestartedInPlace" and "(GPUOutOfMemory)" in e.message for e in first.events)
    # The same count at the next pass charges nothing; a later crash of that pod is a crash.
    later = {**raw, "status": status}
    again = plan(later, observed(later, pods, launcher_attempts={W1: {"gpu_oom": 1, "crash": 1}}), NOW + timedelta(seconds=5))
    assert again.status["restartsByReason"] == {"GPUOutOfMemory": 1, "RestartedInPlace": 1}


def test_the_plan_is_judged_against_the_nodes_gpu_and_a_plan_that_does_not_fit_says_what_would():
    # A 1.3B-parameter model at micro-batch 16 cannot fit a 16 GiB GPU as planned.
    raw = job({"spec.trainer.builtin.model": {"preset": "gpt-1.3b"}, "spec.trainer.builtin.microBatchSize": 16,
               "spec.trainer.builtin.globalBatchSize": 64},
              status=running_status(worldSize=2))
    nodes = [gpu_node("node-0", 16384), gpu_node("node-1", 16384)]
    result = plan(raw, observed(raw, [worker(0), worker(1)], nodes=nodes, launcher_attempts={W1: {"gpu_oom": 1}}), NOW)
    message = result.status["lastFailure"]["message"]
    assert "it does not fit a GPU of 16.0 GiB" in message and ("try " in message or "no single change" in message), message
    # The same job on an 80 GB GPU would fit by the plan: the message says what else fills one.
    raw = job(status=running_status(worldSize=2))
    nodes = [gpu_node("node-0", 81559), gpu_node("node-1", 81559)]
    result = plan(raw, observed(raw, [worker(0), worker(1)], nodes=nodes, launcher_attempts={W1: {"gpu_oom": 1}}), NOW)
    assert "by the plan it fits a GPU of 79.6 GiB" in result.status["lastFailure"]["message"], result.status["lastFailure"]


def test_a_scripts_gpu_oom_has_advice_and_no_plan():
    raw = job({"spec.trainer": {"command": ["/app/train.py"]}, "spec.image": "example.com/mine:1"},
              status=running_status(worldSize=2))
    result = plan(raw, observed(raw, [worker(0), worker(1)], launcher_attempts={W0: {"gpu_oom": 1}}), NOW)
    failure = result.status["lastFailure"]
    assert failure["reason"] == "GPUOutOfMemory" and "memory plan" not in failure["message"], failure
    assert "activation checkpointing" in failure["message"], failure


def test_a_pod_that_ended_out_of_gpu_memory_is_charged_so_with_the_ranks_own_figures():
    raw = job(status=running_status())
    said = {"code": 88, "reason": "GPUOutOfMemory", "rank": 1, "step": 14,
            "message": "rank 1 ran out of GPU memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB; "
                       "GPU 0 (NVIDIA H100 80GB HBM3, 79.1 GiB): the allocator's peak 77.9 GiB, 78.4 GiB reserved; "
                       "the memory plan at world size 2: peak 81.2 GiB"}
    result = plan(raw, observed(raw, [worker(0), worker(1, phase="Failed", exit_code=88, termination=said)]), NOW)
    failure = result.status["lastFailure"]
    assert result.status["restartsByReason"] == {"GPUOutOfMemory": 1}, result.status["restartsByReason"]
    assert (failure["reason"], failure["exitCode"]) == ("GPUOutOfMemory", 88), failure
    assert "the allocator's peak 77.9 GiB" in failure["message"] and "memory plan at world size 2" in failure["message"]
    assert f"keep {W1}" in summary(result.actions)


def test_a_kernel_kill_in_the_attempt_of_a_gpu_oom_is_used_by_it_not_by_a_later_crash():
    from llmtrain_operator.api.observed import ContainerMemory

    gib = 1 << 30
    raw = job(status=running_status(worldSize=2))
    pods = [worker(0), worker(1)]
    memory = {W1: ContainerMemory(oom_kills=1, peak_bytes=3 * gib, limit_bytes=4 * gib)}
    first = plan(raw, observed(raw, pods, launcher_attempts={W1: {"gpu_oom": 1}}, launcher_memory=memory), NOW)
    assert first.status["restartsByReason"] == {"GPUOutOfMemory": 1}
    assert "the kernel's OOM killer also ended a rank of the pod: the container's memory peak 3.0 GiB" in \
        first.status["lastFailure"]["message"]
    later = {**raw, "status": first.status}
    second = plan(later, observed(later, pods, launcher_attempts={W1: {"gpu_oom": 1, "crash": 1}}, launcher_memory=memory),
                  NOW + timedelta(seconds=5))
    assert second.status["restartsByReason"] == {"GPUOutOfMemory": 1, "RestartedInPlace": 1}, "the kill was used once"


def test_a_page_claiming_a_billion_gpu_ooms_charges_what_ends_the_budget_and_plans_once(monkeypatch):
    from llmtrain_operator.planner.policies import in_place

    built = []
    real = in_place.trainer_config
    monkeypatch.setattr(in_place, "trainer_config", lambda job: built.append(1) or real(job))
    raw = job({"spec.faultTolerance.maxRestarts": 2000}, status=running_status(worldSize=2))
    result = plan(raw, observed(raw, [worker(0), worker(1)], launcher_attempts={W1: {"gpu_oom": 10**9}}), NOW)
    assert result.status["phase"] == "Failed" and result.status["restartsByReason"]["GPUOutOfMemory"] == 2001
    assert len(built) == 1, f"the plan was built {len(built)} times for one pod's claim"
