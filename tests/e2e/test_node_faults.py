"""Faults around a node, on the cluster, one job through all of them: a worker's launcher
frozen while its ranks run on, a worker's torchrun agent frozen alone, a network partition of a worker's node during training
(its processes keep running, cut off), and a worker's Node object deleted outright. Each
is detected from outside, blamed on the right pod and node in the status and Events,
charged once, and the job trains on and succeeds.

The job is the module's ``job`` fixture; each fault's checks are a test of their own, in
order, so that a failed one hides nothing of the next, and the last test checks the job's
end.

Sanity bounds only; detection and recovery times are measured by bench/recovery.py."""

from __future__ import annotations

import json

import pytest
from support.waiting import wait_for

from .jobs import (PVC, create, event_messages, freeze_launcher, job_manifest, pods, rank_holder, run_dir, status,
                   touch_in_workers, wait_status)

pytestmark = pytest.mark.e2e

NS, NAME = "e2e-node-faults", "nodes"
HANG = 10
FAULTS = "LLMTRAIN_FAULT_INJECT"
MAX_STEPS = 400
RELEASE = "release-pacing"


def _events(bed, reason: str) -> list[str]:
    return [m for r, m in event_messages(bed, NS, NAME) if r == reason]


def _worker_nodes(bed) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods(bed, NS, NAME) if p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")}


def _training_at_two(bed, after_step: int, what: str) -> dict:
    return wait_status(bed, NS, NAME, lambda s: s.get("worldSize") == 2 and s.get("lastRecoverySeconds") is not None
                       and s.get("step", 0) > after_step, 300, what)


def _at_world_size_two(bed) -> None:
    """A test's starting point: both workers training (where the test before passed, at once)."""
    wait_status(bed, NS, NAME, lambda s: s.get("worldSize") == 2, 300, "training at world size 2")


@pytest.fixture(scope="module")
def job(operator):
    """The job, training at world size 2 past step 8. What one test hands to the next (the
    nodes it cut off) goes into the dict."""
    bed = operator
    # A shared tier (a ReadWriteMany PVC): a lost node must not take the only copy of the
    # newest checkpoint with it. Every step takes >= 0.75 s until the last test releases the
    # pacing (a file in each worker's run dir): 400 paced steps (300 s) outlast the faults
    # (about 150 s here: the liveness probe alone ends the frozen launcher, after
    # hangTimeoutSeconds + 20 s), however fast each is handled. The launcher and agent faults fire on trigger files the test
    # writes into one pod's run dir, so that no replacement (with a fresh run dir) fires
    # them again.
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("apply", "-n", NS, "-f", "-", input=PVC)
    faults = ("stop@trigger=freeze-launcher,rank=1,target=launcher;stop@trigger=freeze-agent,rank=0,target=agent;"
              "slow@step=1,seconds=0.75,steps=100000,until=" + RELEASE)
    create(bed, NS, job_manifest(NAME, {
        "spec.trainer.builtin.maxSteps": MAX_STEPS, "spec.checkpoint.intervalSteps": 5,
        "spec.checkpoint.shared": {"claimName": "ckpt-shared", "intervalSteps": 5},
        "spec.faultTolerance.hangTimeoutSeconds": HANG, "spec.faultTolerance.collectiveTimeoutSeconds": 20,
        "spec.faultTolerance.nodeFailureGraceSeconds": 10, "spec.faultTolerance.maxRestarts": 6,
        "spec.faultTolerance.progressTimeoutSeconds": 600,
        "spec.env": [{"name": FAULTS, "value": faults}],
    }))
    wait_status(bed, NS, NAME, lambda s: s.get("worldSize") == 2 and s.get("step", 0) >= 8, 300, "training at world size 2")
    return {}


def test_a_frozen_launcher_is_killed_by_its_liveness_probe_and_blamed_on_its_pod(operator, job):
    """Rank 1's launcher is stopped: its ranks run on, but nothing in the pod would report
    or restart them any more. The kubelet's liveness probe on its /healthz fails, the pod
    is killed and replaced, blamed on that pod and node."""
    bed = operator
    _at_world_size_two(bed)
    cause, _ = wait_for(lambda: rank_holder(bed, NS, NAME, 1), 60, 0.5, "rank 1's heartbeat")
    freeze_launcher(bed, cause)
    frozen = wait_status(bed, NS, NAME, lambda s: s.get("restarts", 0) >= 1, 300, "the frozen launcher's pod replaced")
    failure = frozen["lastFailure"]
    assert (failure["pod"], failure["node"], failure["reason"]) == \
        (cause["metadata"]["name"], cause["spec"]["nodeName"], "Signal9"), failure
    assert "liveness" in failure["message"], failure
    assert frozen["restartsByReason"] == {"Signal9": 1}, frozen["restartsByReason"]
    _training_at_two(bed, frozen.get("step", 0), "training at world size 2 after the launcher")


def test_a_frozen_torchrun_agent_is_ended_by_the_launcher_with_the_hang_code_naming_it(operator, job):
    """Rank 0's torchrun agent alone is stopped: its ranks run on, but no process could
    restart them or report their failure, and the launcher still answers its liveness
    probe. The launcher's supervisor sees the agent stopped for longer than the ranks'
    timeout, ends the pod with the hang code and names the agent; the pod is replaced."""
    bed = operator
    _at_world_size_two(bed)
    cause, _ = wait_for(lambda: rank_holder(bed, NS, NAME, 0), 60, 0.5, "rank 0's heartbeat")
    (run_dir(bed, cause) / "freeze-agent").write_text("")
    stopped = wait_status(bed, NS, NAME, lambda s: s.get("restartsByReason", {}).get("Hang", 0) >= 1, 300,
                          "the frozen agent's pod ended")
    failure = stopped["lastFailure"]
    assert (failure["kind"], failure["pod"], failure["node"]) == ("Hang", cause["metadata"]["name"], cause["spec"]["nodeName"]), failure
    assert "torchrun agent" in failure["message"], failure
    where = f"pod {cause['metadata']['name']} on node {cause['spec']['nodeName']}"
    wait_for(lambda: any(r == "PodFailed" and where in m and "Hang" in m for r, m in event_messages(bed, NS, NAME)), 30, 0.5,
             f"a PodFailed Event naming {where}")
    assert stopped["restartsByReason"] == {"Signal9": 1, "Hang": 1}, "the other pod's blocked ranks were victims"
    _training_at_two(bed, stopped.get("step", 0), "training at world size 2 after the agent")


def test_a_partitioned_node_is_charged_once_as_a_node_failure_naming_its_pod(operator, job):
    """A worker's node stops its heartbeats and its pods lose their links, their processes
    running on. Not the store's node: the rendezvous must survive."""
    bed = operator
    _at_world_size_two(bed)
    store_node = pods(bed, NS, NAME, role="rendezvous")[0]["spec"]["nodeName"]
    by_node = _worker_nodes(bed)
    target_pod, cut = next((p, n) for p, n in sorted(by_node.items()) if n != store_node)
    job.update(store_node=store_node, cut=cut)
    bed.partition_node(cut)
    try:
        parted = wait_status(bed, NS, NAME, lambda s: s.get("restartsByReason", {}).get("NodeFailure", 0) >= 1, 240,
                             "the partitioned node's failure")
        failure = parted["lastFailure"]
        assert (failure["kind"], failure["node"], failure["pod"]) == ("NodeFailure", cut, target_pod), failure
        assert "NotReady/unreachable" in failure["message"], failure
        assert cut in [q["node"] for q in parted["quarantinedNodes"]]
        wait_for(lambda: any(cut in m and target_pod in m for m in _events(bed, "NodeFailure")), 30, 0.5,
                 f"a NodeFailure Event naming {cut} and {target_pod}")
        assert parted["restartsByReason"] == {"Signal9": 1, "Hang": 1, "NodeFailure": 1}, "the survivor's blocked ranks were victims"
    finally:
        bed.heal_node(cut)  # links back: the kubelet ends the pod the operator force-deleted
        bed.wait_nodes_ready(180)
    _training_at_two(bed, parted.get("step", 0), "training at world size 2 after the partition")


def test_a_deleted_node_object_is_charged_at_once_as_a_node_failure(operator, job):
    """A worker's Node object deleted outright (`kubectl delete node`): no NotReady, no
    grace to wait for; the pods on it are lost at once."""
    bed = operator
    _at_world_size_two(bed)
    store_node = job.get("store_node") or pods(bed, NS, NAME, role="rendezvous")[0]["spec"]["nodeName"]
    cut = job.get("cut")
    by_node = _worker_nodes(bed)
    candidates = sorted(((n == store_node, p, n) for p, n in by_node.items() if n != cut))
    _, gone_pod, gone = candidates[0]
    bed.kubectl("delete", "node", gone)
    try:
        deleted = wait_status(bed, NS, NAME, lambda s: s.get("restartsByReason", {}).get("NodeFailure", 0) >= 2, 240,
                              "the deleted node's failure")
        failure = deleted["lastFailure"]
        assert (failure["kind"], failure["node"], failure["pod"]) == ("NodeFailure", gone, gone_pod), failure
        assert "Node object was deleted" in failure["message"], failure
        assert {cut, gone} <= {q["node"] for q in deleted["quarantinedNodes"]}
        # Events are posted after the status write, in the background: wait for it.
        wait_for(lambda: any(gone in m and "deleted" in m for m in _events(bed, "NodeFailure")), 30, 0.5,
                 f"a NodeFailure Event naming the deleted node {gone}")
    finally:
        bed.heal_node(gone)  # registered again, as a restarted kubelet would
        bed.wait_nodes_ready(180)


def test_the_job_succeeds_with_each_fault_charged_once(operator, job):
    bed = operator
    running = status(bed, NS, NAME)
    assert running.get("phase") not in ("Succeeded", "Failed"), "the paced job must outlast its faults: " + json.dumps(running)[:2000]

    def released_and_finished(s: dict) -> bool:
        # At each poll: a replacement that starts after the first release (the deleted
        # node's) would pace the whole job again.
        touch_in_workers(bed, NS, NAME, RELEASE)
        return s.get("phase") in ("Succeeded", "Failed")

    done = wait_status(bed, NS, NAME, released_and_finished, 600, "finished")
    assert done["phase"] == "Succeeded", json.dumps(done)[:3000]
    assert done["restartsByReason"] == {"Signal9": 1, "Hang": 1, "NodeFailure": 2}, done["restartsByReason"]
    assert done["step"] == MAX_STEPS
