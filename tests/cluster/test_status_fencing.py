"""The operator's status writes are conditional on the resourceVersion a pass planned
from, and the real API server enforces it: a write planned from an older status is
refused, so a decision (a restart charged, a failure key) can never be recorded twice."""

from __future__ import annotations

import json

import pytest
import yaml
from llmtrain_operator.k8s.client import K8s, TransientApiError
from support.chart import apply_crd
from support.specs import load_job

pytestmark = pytest.mark.cluster

NS = "fencing"


def read(bed, name: str) -> dict:
    return json.loads(bed.kubectl("get", "ltj", name, "-n", NS, "-o", "json").stdout)


def test_a_status_write_planned_from_an_older_version_is_refused(local_cluster, monkeypatch):
    bed = local_cluster
    apply_crd(bed)
    bed.kubectl("create", "namespace", NS, check=False)
    job = load_job()
    job["metadata"] = {"name": "fenced"}
    job["spec"]["suspend"] = True  # no operator runs in this suite; nothing else writes
    bed.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job))
    monkeypatch.setenv("KUBECONFIG", str(bed.kubeconfig))
    k8s = K8s.from_environment()

    planned_from = read(bed, "fenced")["metadata"]["resourceVersion"]
    assert k8s.patch_status(NS, "fenced", {"restarts": 1, "phase": "Running"}, planned_from)
    assert read(bed, "fenced")["status"]["restarts"] == 1

    # A second pass that planned from the same (now old) object, e.g. on a lagging watch,
    # would charge the same failure again: the server refuses it.
    with pytest.raises(TransientApiError, match="HTTP 409"):
        k8s.patch_status(NS, "fenced", {"restarts": 2, "phase": "Running"}, planned_from)
    assert read(bed, "fenced")["status"]["restarts"] == 1

    current = read(bed, "fenced")["metadata"]["resourceVersion"]
    assert k8s.patch_status(NS, "fenced", {"restarts": 2}, current)
    assert read(bed, "fenced")["status"]["restarts"] == 2
    bed.kubectl("delete", "ltj", "fenced", "-n", NS)
