"""A rank the kernel's OOM killer ended, named ``OOMKilled`` with the memory peak and the
limit: restarted in place (the launcher's cgroup counts name the crash), ended with its
pod (the launcher's termination message), or the whole container killed (the kubelet's
reason; the limit from the spec)."""

from __future__ import annotations

from datetime import timedelta

from llmtrain_operator.api.observed import ContainerMemory
from llmtrain_operator.planner import plan
from support.planning import NOW, job, observed, running_status, summary, worker

W0, W1 = "tiny-elastic-worker-0", "tiny-elastic-worker-1"
GIB = 1 << 30


def test_an_in_place_crash_with_an_oom_kill_counted_is_oom_killed_with_the_peak_and_the_limit():
    raw = job(status=running_status())
    pods = [worker(0), worker(1)]
    memory = {W1: ContainerMemory(oom_kills=1, peak_bytes=3 * GIB, limit_bytes=4 * GIB), W0: ContainerMemory(0, GIB, 4 * GIB)}
    first = plan(raw, observed(raw, pods, launcher_attempts={W1: {"crash": 1}, W0: {"victim": 1}}, launcher_memory=memory), NOW)
    status = first.status
    assert status["restartsByReason"] == {"OOMKilled": 1} and status["restarts"] == 1
    failure = status["lastFailure"]
    assert (failure["kind"], failure["reason"], failure["pod"]) == ("ProcessCrash", "OOMKilled", W1)
    assert "OOM killer ended a rank in pod " + W1 in failure["message"]
    assert "memory peak 3.0 GiB of its limit 4.0 GiB" in failure["message"] and "resources.limits.memory" in failure["message"]
    assert any(e.reason == "RestartedInPlace" and "(OOMKilled)" in e.message for e in first.events)
    # The next crash of that pod with no new kill is an ordinary crash; the kill is used once.
    later = {**raw, "status": status}
    second = plan(later, observed(later, pods, launcher_attempts={W1: {"crash": 2}}, launcher_memory=memory),
                  NOW + timedelta(seconds=5))
    assert second.status["restartsByReason"] == {"OOMKilled": 1, "RestartedInPlace": 1}
    # A second kill with its crash: OOMKilled again.
    later = {**raw, "status": second.status}
    memory = {W1: ContainerMemory(oom_kills=2, peak_bytes=4 * GIB, limit_bytes=4 * GIB)}
    third = plan(later, observed(later, pods, launcher_attempts={W1: {"crash": 3}}, launcher_memory=memory),
                 NOW + timedelta(seconds=10))
    assert third.status["restartsByReason"] == {"OOMKilled": 2, "RestartedInPlace": 1}


def test_a_kill_counted_before_its_crash_waits_for_it_and_a_kill_alone_charges_nothing():
    raw = job(status=running_status())
    pods = [worker(0), worker(1)]
    memory = {W1: ContainerMemory(oom_kills=1, peak_bytes=3 * GIB, limit_bytes=4 * GIB)}
    first = plan(raw, observed(raw, pods, launcher_memory=memory), NOW)
    assert first.status["restarts"] == 0 and "lastFailure" not in first.status
    later = {**raw, "status": first.status}
    second = plan(later, observed(later, pods, launcher_attempts={W1: {"crash": 1}}, launcher_memory=memory),
                  NOW + timedelta(seconds=5))
    assert second.status["restartsByReason"] == {"OOMKilled": 1}
    # A kill on another pod names none of this pod's crashes; a hang is never an OOM kill.
    other = plan(raw, observed(raw, pods, launcher_attempts={W0: {"crash": 1}, W1: {"hang": 1}}, launcher_memory=memory), NOW)
    assert other.status["restartsByReason"] == {"RestartedInPlace": 1, "Hang": 1}


def test_a_pod_its_launcher_ended_for_an_oom_kill_is_oom_killed_and_replaced():
    raw = job(status=running_status())
    said = {"code": 137, "reason": "OOMKilled", "message": "the kernel's OOM killer ended a rank (1 kill in this container): "
            "the container's memory peak 3.9 GiB of its limit 4.0 GiB. Raise resources.limits.memory",
            "oom": {"kills": 1, "peakBytes": 4187593113, "limitBytes": 4 * GIB}}
    result = plan(raw, observed(raw, [worker(0), worker(1, phase="Failed", exit_code=137, termination=said)]), NOW)
    failure = result.status["lastFailure"]
    assert result.status["restartsByReason"] == {"OOMKilled": 1}
    assert failure["reason"] == "OOMKilled" and "peak 3.9 GiB of its limit 4.0 GiB" in failure["message"]
    assert f"keep {W1}" in summary(result.actions)


def test_a_container_the_kubelet_reports_oom_killed_names_the_specs_limit():
    raw = job({"spec.resources": {"limits": {"memory": "6Gi"}}}, status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1, phase="Failed", exit_code=137, reason="OOMKilled")]), NOW)
    failure = result.status["lastFailure"]
    assert result.status["restartsByReason"] == {"OOMKilled": 1}
    assert "OOM killer ended the container at its memory limit (6Gi)" in failure["message"], failure
    assert "resources.limits.memory" in failure["message"]


def test_a_restart_in_place_learnt_only_from_a_pods_end_is_charged_once_and_cannot_fail_a_finished_job():
    """The job ended within seconds of an in-place restart: no scrape showed it. The
    launcher's termination message gives the counts (all but the last attempt) and the
    container's memory, so the OOM kill is charged, once, though the budget is spent."""
    raw = job({"spec.faultTolerance.maxRestarts": 0}, status=running_status())
    final = {"code": 0, "reason": "Completed", "failedAttempts": {"crash": 1, "victim": 0},
             "memory": {"oomKills": 1, "peakBytes": 3 * GIB, "limitBytes": 4 * GIB}}
    victim = {"code": 0, "reason": "Completed", "failedAttempts": {"victim": 1}, "memory": {"oomKills": 0, "peakBytes": GIB,
                                                                                           "limitBytes": 4 * GIB}}
    pods = [worker(0, phase="Succeeded", exit_code=0, termination=final), worker(1, phase="Succeeded", exit_code=0, termination=victim)]
    first = plan(raw, observed(raw, pods), NOW)
    assert first.status["phase"] == "Succeeded" and first.status["restartsByReason"] == {"OOMKilled": 1}
    assert "memory peak 3.0 GiB of its limit 4.0 GiB" in first.status["lastFailure"]["message"]
    later = {**raw, "status": {**first.status, "phase": "Running"}}
    again = plan(later, observed(later, pods), NOW + timedelta(seconds=5))
    assert again.status["restarts"] == 1, "charged once"


def test_a_failed_pods_final_counts_leave_out_its_last_attempt_so_its_exit_is_charged_once():
    raw = job(status=running_status())
    said = {"code": 1, "reason": "Crash", "message": "boom", "failedAttempts": {"crash": 1}}
    first = plan(raw, observed(raw, [worker(0), worker(1, phase="Failed", exit_code=1, termination=said)],
                               launcher_attempts={W1: {"crash": 1}}), NOW)
    # The earlier attempt in place, then the pod's own end.
    assert first.status["restartsByReason"] == {"RestartedInPlace": 1, "Crash": 1}, first.status["restartsByReason"]
