"""Deleting a job while one of its nodes is down: the pod on that node would stay
``Terminating`` until its kubelet came back (Kubernetes' rule for an unreachable kubelet);
the operator force-deletes it (planner/stranded.py), with no finalizer on the job. The
pods on healthy nodes end as any deleted pod does, within their grace period (SIGTERM,
the emergency checkpoint's budget, then SIGKILL): on real nodes a survivor blocked on
its dead peer may use all of it."""

from __future__ import annotations

import json
import time

import pytest
from support.waiting import wait_for

from .jobs import create, job_manifest, pods, wait_status

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-deletion", "doomed"
BOUND = 30.0
"""Seconds from the deletion until the pod on the down node is gone."""


def _node_ready(bed, name: str) -> str:
    node = json.loads(bed.kubectl("get", "node", name, "-o", "json").stdout)
    return next((c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"), "Unknown")


def _names(bed) -> set[str]:
    out = bed.kubectl("get", "pods", "-n", NS, "-l", f"llmtrain.io/job={NAME}", "-o", "name").stdout.split()
    return {name.removeprefix("pod/") for name in out}


def test_a_job_deleted_while_a_node_is_down_leaves_no_pod_behind(operator):
    bed = operator
    # A long node grace: the job itself would not replace the pod before it is deleted.
    create(bed, NS, job_manifest(NAME, {"spec.trainer.builtin.maxSteps": 100000, "spec.faultTolerance.nodeFailureGraceSeconds": 600,
                                        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": "slow@step=1,seconds=0.5,steps=100000"}]}))
    wait_status(bed, NS, NAME, lambda s: s.get("workers") == "2/2" and s.get("step", 0) >= 2, 300, "training 2/2")
    victim = next(p for p in pods(bed, NS, NAME) if p["metadata"]["name"].endswith("-worker-1"))
    node = victim["spec"]["nodeName"]
    bed.fail_node(node)
    try:
        wait_for(lambda: _node_ready(bed, node) != "True", 120, what=f"node {node} not Ready")
        bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false")
        began = time.monotonic()
        stranded = victim["metadata"]["name"]
        wait_for(lambda: stranded not in _names(bed), BOUND + 30, interval=0.5, what=f"{stranded}, on the down node, gone")
        seconds = time.monotonic() - began
        assert seconds <= BOUND, f"the pod on the down node was gone {seconds:.1f}s after the deletion"
        # The longest a pod on a healthy node may take to end: its own grace period.
        grace = victim["spec"]["terminationGracePeriodSeconds"]
        wait_for(lambda: not _names(bed), grace + 30, interval=0.5, what="every pod of the deleted job gone")
        seconds = time.monotonic() - began
        assert seconds <= grace + 10, f"the pods were gone {seconds:.1f}s after the deletion"
    finally:
        bed.heal_node(node)
