"""A node a health agent reports sick (node-problem-detector's ``KernelDeadlock``, set on
the Node's status as the agent would): the job's pod there is drained before any rank
fails, the node quarantined for the job, and the job resumes from the emergency
checkpoint, losing at most the step in flight (policies/node_health.py)."""

from __future__ import annotations

import json
import time

import pytest
from support.waiting import wait_for

from .jobs import PVC, create, event_messages, job_manifest, pods, status, wait_status
from .matrix import restores

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-node-health", "health"


def _set_condition(bed, node: str, status_: str) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    patch = {"status": {"conditions": [{"type": "KernelDeadlock", "status": status_, "reason": "DockerHung",
                                        "message": "task docker:1234 blocked for more than 300 seconds",
                                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    bed.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps(patch))


def test_a_sick_node_is_drained_before_a_rank_fails_and_the_job_resumes_from_the_emergency_checkpoint(operator):
    bed = operator
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("apply", "-n", NS, "-f", "-", input=PVC)
    create(bed, NS, job_manifest(NAME, {
        "spec.trainer.builtin.maxSteps": 100000, "spec.checkpoint.intervalSteps": 50,
        "spec.checkpoint.shared": {"claimName": "ckpt-shared", "intervalSteps": 50},
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": "slow@step=1,seconds=0.3,steps=100000"}],
    }))
    node = None
    try:
        wait_status(bed, NS, NAME, lambda s: s.get("workers") == "2/2" and s.get("step", 0) >= 8, 300, "training 2/2")
        store_node = pods(bed, NS, NAME, role="rendezvous")[0]["spec"]["nodeName"]
        victim = next(p for p in pods(bed, NS, NAME) if p["spec"]["nodeName"] != store_node)
        node, name = victim["spec"]["nodeName"], victim["metadata"]["name"]
        at, began = status(bed, NS, NAME).get("step", 0), time.time()
        _set_condition(bed, node, "True")
        drained = wait_status(bed, NS, NAME, lambda s: s.get("disruptions", 0) >= 1, 60, "the sick node's pod drained")
        assert drained.get("restarts", 0) == 0, drained.get("restartsByReason")
        assert drained["lastFailure"]["reason"] == "NodeUnhealthy" and "KernelDeadlock" in drained["lastFailure"]["message"]
        assert node in [q["node"] for q in drained["quarantinedNodes"]]
        wait_status(bed, NS, NAME, lambda s: s.get("workers") == "2/2" and s.get("step", 0) > at + 3, 240, "2/2 again, training on")
        assert all(p["spec"].get("nodeName") != node for p in pods(bed, NS, NAME) if not p["metadata"].get("deletionTimestamp"))
        resumed = restores(bed, NS, NAME, since=began)
        # No periodic checkpoint falls in this window (every 50 steps): the resume is the emergency one.
        assert resumed and min(r.step for r in resumed) >= at - 1, (at, resumed)
        wait_for(lambda: any(r == "NodeUnhealthy" and name in m for r, m in event_messages(bed, NS, NAME)), 30,
                 what="the NodeUnhealthy Event naming the pod")
    finally:
        if node:
            _set_condition(bed, node, "False")
        bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)
