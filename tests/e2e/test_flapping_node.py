"""A node that keeps losing every process and coming back within the grace (a reboot
loop): its kills are one episode, charged once, and the node is quarantined for the job
once the threshold is reached (planner/node_history.py)."""

from __future__ import annotations

import os

import pytest
from support.waiting import wait_for

from .jobs import create, event_messages, job_manifest, pods, status, wait_status

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-flapping", "flapping"
LOST = "ContainerLost" if os.environ.get("LLMTRAIN_E2E_BED") == "kind" else "Signal9"


def _worker_on(bed, node: str) -> dict | None:
    return next((p for p in pods(bed, NS, NAME) if p["spec"].get("nodeName") == node
                 and not p["metadata"].get("deletionTimestamp") and p.get("status", {}).get("phase") == "Running"), None)


def _pool(bed) -> list[str]:
    """The nodes the job's pods may use (``job_manifest``'s node selector)."""
    out = bed.kubectl("get", "nodes", "-l", "llmtrain.io/pool=gpu", "-o", "jsonpath={.items[*].metadata.name}")
    return out.stdout.split()


def test_a_node_killing_the_jobs_pods_again_and_again_is_charged_once_and_quarantined(operator):
    bed = operator
    create(bed, NS, job_manifest(NAME, {
        "spec.trainer.builtin.maxSteps": 100000, "spec.faultTolerance.maxRestarts": 10,
        "spec.faultTolerance.nodeFailureGraceSeconds": 120,
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": "slow@step=1,seconds=0.5,steps=100000"}],
    }))
    try:
        wait_status(bed, NS, NAME, lambda s: s.get("workers") == "2/2" and s.get("step", 0) >= 2, 300, "training 2/2")
        store_node = pods(bed, NS, NAME, role="rendezvous")[0]["spec"]["nodeName"]
        node = next(p["spec"]["nodeName"] for p in pods(bed, NS, NAME) if p["spec"]["nodeName"] != store_node)
        # Until the node is quarantined, its pod's replacement can only land on it again (a
        # reboot loop keeps taking the pods it is given): the scheduler would otherwise pick
        # any other node of the pool as often, and the loop would end before it began.
        others = [n for n in _pool(bed) if n != node]
        for other in others:
            bed.kubectl("cordon", other)
        kills = 0
        try:
            while kills < 3:
                # Its processes die and it comes back at once: never NotReady (the grace is 120 s).
                pod = wait_for(lambda: _worker_on(bed, node), 120, what=f"a worker running on {node}") if kills else _worker_on(bed, node)
                bed.fail_node(node)
                bed.heal_node(node)
                kills += 1
                name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
                wait_for(lambda uid=uid: all(p["metadata"]["uid"] != uid for p in pods(bed, NS, NAME)), 120,
                         what=f"{name} replaced after kill {kills}")
                if any(q["node"] == node for q in status(bed, NS, NAME).get("quarantinedNodes") or []):
                    break
        finally:
            for other in others:
                bed.kubectl("uncordon", other, check=False)
        final = wait_status(bed, NS, NAME, lambda s: any(q["node"] == node for q in s.get("quarantinedNodes") or []), 120,
                            f"{node} quarantined")
        assert kills == 2, f"quarantined after {kills} kills (threshold 2)"
        # Charged once, as what the node did to the pod: the process bed's node agent
        # SIGKILLs its processes (Signal9); a real node killed and started again loses the
        # container with it, and the kubelet says so (ContainerLost).
        assert final["restartsByReason"].get(LOST, 0) == 1, final["restartsByReason"]
        assert "NodeFailure" not in final["restartsByReason"], final["restartsByReason"]
        wait_for(lambda: any(r == "NodeQuarantined" and node in m for r, m in event_messages(bed, NS, NAME)), 30,
                 what="the NodeQuarantined Event")
        # The replacement lands elsewhere.
        wait_status(bed, NS, NAME, lambda s: s.get("workers") == "2/2", 180, "two workers again")
        assert all(p["spec"].get("nodeName") != node for p in pods(bed, NS, NAME) if not p["metadata"].get("deletionTimestamp"))
    finally:
        bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)
