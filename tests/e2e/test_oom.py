"""A rank that grows past its container's memory limit, on the cluster: the kernel's OOM
killer ends it (the container's memory cgroup; one process under cgroup v1), torchrun
restarts the group in place, and the operator names the failure ``OOMKilled`` with the
container's memory peak and its limit, from the launcher's reading of that cgroup. Later
in the same job a rank runs out of GPU memory (torch's own error, raised in its step: the
nodes have no GPU): it exits 88, its pod's launcher counts the attempt as ``gpu_oom``, and
the operator charges ``GPUOutOfMemory`` with the job's memory plan, apart from the kill.
The job resumes and succeeds."""

from __future__ import annotations

import re

import pytest

from .jobs import GANG, create, event_messages, job_manifest, wait_status

pytestmark = pytest.mark.e2e

NS = "e2e-oom"
NAME = "oom"


def test_a_rank_the_oom_killer_ends_is_charged_as_oom_killed_with_the_peak_and_the_limit(operator):
    bed = operator
    # A gang: rank 1 must exist at step 12 (an elastic job trains alone until its second
    # pod is up, which on a busy machine came after step 14 once, and the fault never fired).
    create(bed, NS, job_manifest(NAME, {
        **GANG, "spec.trainer.builtin.maxSteps": 30, "spec.checkpoint.intervalSteps": 5,
        "spec.resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "3Gi"}},
        # Paced after the kill (every step >= 1 s), so the restart in place is scraped while
        # the job runs; a pod's end reports it too (its termination message), but that is
        # the unit tests' case, not this one.
        # The GPU OOM comes ten paced steps after the kill (the kill's charge is read first).
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT",
                      "value": "oom@step=12,rank=1;gpu_oom@step=24,rank=0;slow@step=13,seconds=1,steps=17"}],
    }))
    killed = wait_status(bed, NS, NAME, lambda s: (s.get("lastFailure") or {}).get("reason") == "OOMKilled"
                         or s.get("phase") in ("Succeeded", "Failed"), 400, "the OOM kill charged")
    failure = killed["lastFailure"]
    assert (failure["kind"], failure["reason"]) == ("ProcessCrash", "OOMKilled"), failure
    assert "the kernel's OOM killer ended a rank in pod" in failure["message"], failure
    peak = re.search(r"memory peak ([0-9.]+) GiB of its limit 3\.0 GiB", failure["message"])
    assert peak and 2.0 <= float(peak.group(1)) <= 3.0, failure["message"]
    done = wait_status(bed, NS, NAME, lambda s: s.get("phase") in ("Succeeded", "Failed"), 400, "finished")
    assert done["phase"] == "Succeeded", done
    assert done["restartsByReason"] == {"OOMKilled": 1, "GPUOutOfMemory": 1}, done["restartsByReason"]
    failure = done["lastFailure"]
    assert (failure["kind"], failure["reason"]) == ("ProcessCrash", "GPUOutOfMemory"), failure
    assert "ran out of GPU memory" in failure["message"] and "the memory plan at world size 2: peak " in failure["message"], failure
    events = event_messages(bed, NS, NAME)
    for named in ("(OOMKilled)", "(GPUOutOfMemory)"):
        assert any(reason == "RestartedInPlace" and named in message for reason, message in events), events
