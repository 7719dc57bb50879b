"""Helpers to drive LLMTrainJobs through kubectl."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import yaml
from support.specs import apply_set, load_job
from support.waiting import wait_for


PVC = """
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ckpt-shared}
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 1Gi}}
"""

GANG = {"spec.replicas": {"min": 2, "max": 2}}
"""Both workers from the first step. A fault aimed at rank 1 at step N (``crash@step=N,
rank=1``) fires only if rank 1 exists at step N: an elastic job (example 01's min 1) trains
alone until its second pod is up, and on real nodes a pod can start long after its peer
(on kind, the first container from the 5.9 GB trainer image on a cold node took 30 s, and
a pair's rank 1 joined after its step-8 fault)."""


PREFLIGHT_FLOOR_MBPS = 10
"""The suite's pre-flight floor, not the default 50 MB/s: the echo is Python at both ends,
and on a two-core kind bed beside CI's torchrun suites a healthy node measured 48.3 MB/s,
was quarantined, and its replacement waited for CPU elsewhere (make test at 0de0e6d).
``test_preflight.py``'s degraded link (0.5 MB/s) is far below it still."""


def job_manifest(name: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Example 01 under another name, on the bed's GPU pool (the operator is elsewhere)."""
    raw = load_job()
    raw["metadata"] = {"name": name}
    raw["spec"]["scheduling"] = {"nodeSelector": {"llmtrain.io/pool": "gpu"}}
    raw["spec"].setdefault("faultTolerance", {})["preflightMinMbps"] = PREFLIGHT_FLOOR_MBPS
    return apply_set(raw, changes or {})


def create(bed, namespace: str, manifest: dict[str, Any]) -> None:
    bed.kubectl("create", "namespace", namespace, check=False)
    bed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def get(bed, namespace: str, name: str) -> dict[str, Any]:
    out = bed.kubectl("get", "ltj", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def status(bed, namespace: str, name: str) -> dict[str, Any]:
    return get(bed, namespace, name).get("status") or {}


def pods(bed, namespace: str, name: str, role: str = "worker", kept: bool = False) -> list[dict[str, Any]]:
    """The job's pods of ``role``; with ``kept``, only the failed pods kept for their logs
    (``faultTolerance.keepFailedPods``), which are otherwise left out."""
    selector = f"llmtrain.io/job={name},llmtrain.io/role={role}," + ("llmtrain.io/kept" if kept else "!llmtrain.io/kept")
    out = bed.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return json.loads(out.stdout)["items"]


def events(bed, namespace: str, name: str) -> list[str]:
    out = bed.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [e["reason"] for e in json.loads(out.stdout)["items"]]


def event_messages(bed, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of every Event about ``name``."""
    out = bed.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [(e["reason"], e.get("message", "")) for e in json.loads(out.stdout)["items"]]


def pod_with_marker(bed, namespace: str, name: str, marker: str) -> dict[str, Any]:
    """The worker pod whose run volume holds a fired fault's marker."""
    for pod in pods(bed, namespace, name):
        if (run_dir(bed, pod) / "faults" / marker).exists():
            return pod
    raise AssertionError(f"no pod of {name} fired {marker}")


def wait_event(bed, namespace: str, name: str, reason: str, words: str, timeout: float = 30) -> None:
    """Wait for an Event of ``reason`` about ``name`` whose message holds ``words``: the
    operator posts Events after the status write, in the background, so a status that
    shows a failure may come a moment before its Event does."""
    wait_for(lambda: any(r == reason and words in m for r, m in event_messages(bed, namespace, name)), timeout, 0.5,
             f"a {reason} Event about {namespace}/{name} naming {words!r}")


def run_dir(bed, pod: dict[str, Any]) -> Path:
    """A worker pod's run volume on the local cluster's disk."""
    return bed.state / "pods" / pod["metadata"]["uid"] / "volumes" / "run"


def touch_in_workers(bed, namespace: str, name: str, filename: str) -> None:
    """Create ``filename`` in the run dir of every worker of the job that has one now
    (a paced job's ``until=`` release: called at each poll, so a replacement that starts
    after the first touch is released too)."""
    for pod in pods(bed, namespace, name):
        try:
            (run_dir(bed, pod) / filename).touch()
        except FileNotFoundError:
            pass  # not started yet, or gone: the next poll sees it


def finished_released_once_whole(bed, namespace: str, name: str, filename: str, world: int = 2):
    """A ``wait_status`` predicate: the job has finished. Meanwhile, once its world is whole
    (a replacement trains with the survivors), its pacing is released: ``filename`` touched
    in every worker, at most every 5 s (on kind each touch reads the nodes' state; a pod
    that starts after one is released by the next)."""
    touched = [float("-inf")]

    def predicate(s: dict[str, Any]) -> bool:
        if s.get("phase") in ("Succeeded", "Failed"):
            return True
        if s.get("worldSize", 0) >= world and time.monotonic() - touched[0] >= 5:
            touch_in_workers(bed, namespace, name, filename)
            touched[0] = time.monotonic()
        return False

    return predicate


def freeze_launcher(bed, pod: dict[str, Any]) -> None:
    """Stop a worker pod's launcher, its ranks running on. On real nodes the node sends
    the SIGSTOP (``KindCluster.signal_first_process``): the launcher is its container's
    first process, the init of the pod's PID namespace, which ignores a SIGSTOP sent from
    inside it. The process bed's launcher is no namespace's init: a trigger file makes a
    rank of the pod stop it (the job's ``stop@trigger=freeze-launcher,target=launcher``)."""
    if os.environ.get("LLMTRAIN_E2E_BED") == "kind":
        bed.signal_first_process(pod["metadata"]["namespace"], pod["metadata"]["name"], "trainer", "SIGSTOP")
    else:
        (run_dir(bed, pod) / "freeze-launcher").write_text("")


def rank_holder(bed, namespace: str, name: str, rank: int) -> tuple[dict[str, Any], int]:
    """The worker pod whose heartbeat files hold ``rank`` now, and that rank's pid."""
    from llmtrain_trainer.pod import heartbeat  # the trainer package, only where a test needs it

    for pod in pods(bed, namespace, name):
        for beat in heartbeat.read_all(run_dir(bed, pod)):
            if beat.rank == rank:
                return pod, beat.pid
    raise RuntimeError(f"no heartbeat of rank {rank} in {namespace}/{name}")


def wait_status(bed, namespace: str, name: str, predicate, timeout: float, what: str) -> dict[str, Any]:
    """Poll the job's status until ``predicate`` holds; transient kubectl errors are
    retried until the deadline, and a timeout shows the last status and error."""
    seen: list[dict[str, Any]] = [{}]

    def probe() -> dict[str, Any] | None:
        seen[0] = status(bed, namespace, name)
        return seen[0] if predicate(seen[0]) else None

    try:
        return wait_for(probe, timeout, what=what)
    except AssertionError as err:
        raise AssertionError(f"{err}; last status: {json.dumps(seen[0])[:2000]}") from None
