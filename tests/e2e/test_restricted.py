"""A job in a namespace that enforces Pod Security "restricted", on real nodes: the API
server admits the operator's pods (the replacement after a crash too), and the runtime
runs them as they ask. What the runtime made of each container is read by the node's
kernel from its first process (``KindCluster.container_process``), not from the pod spec:
uid and gid 65532 (the image's user), the pod's ``fsGroup`` among its groups, no new
privileges, a seccomp filter, no capabilities at all, and a read-only root filesystem;
meanwhile the tiers and ``/tmp`` stay writable (the job checkpoints to its local and
shared tiers, resumes after the crash and succeeds).

Only real nodes give this evidence: the process bed runs a pod as a process tree of the
host's root and enforces none of it. So the module is marked ``kind``, not ``e2e``: it runs
under hack/kind/e2e.sh (CI's kind stage), and is an error anywhere else (``real_nodes``)."""

from __future__ import annotations

import json

import pytest
from llmtrain_operator.planner.manifests import IMAGE_UID
from support.waiting import wait_for

from .jobs import GANG, PVC, create, event_messages, finished_released_once_whole, job_manifest, pods, wait_status
from .matrix import restores

pytestmark = pytest.mark.kind

NS, NAME = "e2e-restricted-run", "restricted"
RELEASE = "release-pacing"
IMAGE_ID = str(IMAGE_UID)
"""The images' user and group (docs/install.md, "Images"), which the pods' fsGroup names."""


def _runtime_view(bed, pod: dict) -> dict[str, str]:
    container = "rendezvous" if pod["metadata"]["labels"].get("llmtrain.io/role") == "rendezvous" else "trainer"
    return bed.container_process(NS, pod["metadata"]["name"], container)


def _assert_restricted(view: dict[str, str], pod: str) -> None:
    where = f"{pod}: {json.dumps(view)[:1500]}"
    assert view["Uid"].split() == [IMAGE_ID] * 4, where  # real, effective, saved, filesystem
    assert view["Gid"].split() == [IMAGE_ID] * 4, where
    assert IMAGE_ID in view["Groups"].split(), where  # the pod's fsGroup
    assert view["NoNewPrivs"] == "1", where  # allowPrivilegeEscalation: false
    assert view["Seccomp"] == "2", where  # a filter (RuntimeDefault), not 0 (none)
    for capabilities in ("CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"):  # drop: [ALL]
        assert int(view[capabilities], 16) == 0, (capabilities, where)
    assert view["RootMount"].split(",")[0] == "ro", where  # readOnlyRootFilesystem


def test_a_job_in_a_restricted_namespace_runs_as_its_pods_ask_and_recovers_from_a_crash(real_nodes):
    bed = real_nodes
    bed.kubectl("create", "namespace", NS, check=False)
    for mode in ("enforce", "warn", "audit"):
        bed.kubectl("label", "namespace", NS, f"pod-security.kubernetes.io/{mode}=restricted", "--overwrite")
    bed.kubectl("apply", "-n", NS, "-f", "-", input=PVC)
    create(bed, NS, job_manifest(NAME, {
        **GANG, "spec.trainer.builtin.maxSteps": 60, "spec.checkpoint.intervalSteps": 5,
        "spec.checkpoint.shared": {"claimName": "ckpt-shared", "intervalSteps": 10},
        # Paced from step 10 (every step >= 1 s): the crash and the replacement's start
        # fall well inside the run, and the replacement is read while it trains; released
        # once it has been read and trains with its peer.
        "spec.env": [{"name": "LLMTRAIN_FAULT_INJECT", "value": f"slow@step=10,seconds=1,steps=50,until={RELEASE}"}],
    }))
    try:
        running = wait_status(bed, NS, NAME, lambda s: s.get("phase") == "Running" and s.get("step", 0) >= 12, 300,
                              "running past step 12")
        assert running["restarts"] == 0, running
        first = pods(bed, NS, NAME) + pods(bed, NS, NAME, role="rendezvous")
        assert len(first) == 3, [p["metadata"]["name"] for p in first]
        for pod in first:
            _assert_restricted(_runtime_view(bed, pod), pod["metadata"]["name"])

        bed.kill_pod(NS, f"{NAME}-worker-1")
        recovered = wait_status(bed, NS, NAME, lambda s: s.get("lastRecoverySeconds") is not None, 240, "recovered from the crash")
        assert recovered["restartsByReason"] == {"Signal9": 1}, recovered["restartsByReason"]
        # The replacement passed admission in the restricted namespace and runs as the first did.
        replacement = wait_for(lambda: next((p for p in pods(bed, NS, NAME) if p["metadata"]["name"] == f"{NAME}-worker-1-1"
                                             and p.get("status", {}).get("phase") == "Running"), None), 60,
                               what="the replacement running")
        _assert_restricted(_runtime_view(bed, replacement), replacement["metadata"]["name"])

        done = wait_status(bed, NS, NAME, finished_released_once_whole(bed, NS, NAME, RELEASE), 600, "finished")
        assert done["phase"] == "Succeeded", json.dumps(done)[:3000]
        assert done["restartsByReason"] == {"Signal9": 1} and done["step"] == 60, done
        # The tiers were written by uid 65532 under a read-only root: the crash was recovered
        # from a checkpoint (not step 0), and the shared tier holds the last one.
        resumed = restores(bed, NS, NAME)
        assert resumed and min(r.step for r in resumed) >= 10, resumed
        shared = bed.state / "pvs" / f"pv-{NS}-ckpt-shared" / NS / NAME
        assert (shared / "step-00000060" / "COMMITTED").exists(), sorted(p.name for p in shared.glob("*"))
        # Nothing the operator created was refused.
        assert not [m for r, m in event_messages(bed, NS, NAME) if r == "FailedCreate"], event_messages(bed, NS, NAME)
    finally:
        bed.kubectl("delete", "ltj", NAME, "-n", NS, "--wait=false", check=False)
