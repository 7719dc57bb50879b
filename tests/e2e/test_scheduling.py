"""A job whose pods no node can take: the scheduler's reason on the job within seconds,
nothing charged (issue: failures that say too little)."""

from __future__ import annotations

import time

import pytest
from support.waiting import wait_for

from .jobs import create, event_messages, job_manifest, pods, status

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-scheduling", "too-big"


def _unschedulable(pod) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


def test_pods_asking_for_more_gpus_than_any_node_has_show_the_schedulers_words_on_the_job(operator):
    bed = operator
    create(bed, NS, job_manifest(NAME, {"spec.resources": {"limits": {"nvidia.com/gpu": 64}}}))
    try:
        # The clock starts when the scheduler has said it, as the test sees the pod.
        wait_for(lambda: any(_unschedulable(p) for p in pods(bed, NS, NAME)) or None, 120, what="a pod marked unschedulable")
        began = time.monotonic()

        def condition():
            for c in status(bed, NS, NAME).get("conditions") or []:
                if c["type"] == "Unschedulable" and c["status"] == "True":
                    return c
            return None

        cond = wait_for(condition, 30, interval=0.2, what="the Unschedulable condition")
        seconds = time.monotonic() - began
        assert seconds <= 10, f"the condition came {seconds:.1f}s after the scheduler's verdict"
        assert "Insufficient nvidia.com/gpu" in cond["message"] and "short of nvidia.com/gpu" in cond["message"], cond
        final = status(bed, NS, NAME)
        assert final.get("restarts", 0) == 0 and not final.get("lastFailure"), final
        assert any(reason == "Unschedulable" and "cannot be scheduled" in message
                   for reason, message in event_messages(bed, NS, NAME))
    finally:
        bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)
