"""Helpers to drive LLMTrainJobs through kubectl."""

from __future__ import annotations

import json
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


def job_manifest(name: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Example 01 under another name, on the bed's GPU pool (the operator is elsewhere)."""
    raw = load_job()
    raw["metadata"] = {"name": name}
    raw["spec"]["scheduling"] = {"nodeSelector": {"llmtrain.io/pool": "gpu"}}
    return apply_set(raw, changes or {})


def create(bed, namespace: str, manifest: dict[str, Any]) -> None:
    bed.kubectl("create", "namespace", namespace, check=False)
    bed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def get(bed, namespace: str, name: str) -> dict[str, Any]:
    out = bed.kubectl("get", "ltj", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def status(bed, namespace: str, name: str) -> dict[str, Any]:
    return get(bed, namespace, name).get("status") or {}


def pods(bed, namespace: str, name: str, role: str = "worker") -> list[dict[str, Any]]:
    out = bed.kubectl("get", "pods", "-n", namespace, "-l", f"llmtrain.io/job={name},llmtrain.io/role={role}", "-o", "json")
    return json.loads(out.stdout)["items"]


def events(bed, namespace: str, name: str) -> list[str]:
    out = bed.kubectl("get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [e["reason"] for e in json.loads(out.stdout)["items"]]


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
