"""End-to-end: the operator installed with helm on the local cluster (or kind), jobs
applied with kubectl, a real Prometheus scraping both."""

from __future__ import annotations

import json

import pytest
from support.specs import ROOT

OPERATOR_NS = "llmtrain-system"


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def operator(local_cluster):
    """helm install of charts/llmtrain-operator with 2 replicas (kopf peering)."""
    bed = local_cluster
    bed.helm("upgrade", "--install", "llmtrain", str(ROOT / "charts" / "llmtrain-operator"),
             "--namespace", OPERATOR_NS, "--create-namespace", "--wait", "--timeout", "180s",
             "--set", "replicaCount=2", "--set", "operator.resyncSeconds=5",
             "--set", "nodeSelector.llmtrain\\.io/pool=system")
    bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=120s")
    yield bed
    pods = json.loads(bed.kubectl("get", "pods", "-n", OPERATOR_NS, "-o", "json").stdout)["items"]
    for pod in pods:  # keep the operator's logs for a failed run's post-mortem
        (bed.state / f"operator-{pod['metadata']['name']}.log").write_text(bed.pod_log(OPERATOR_NS, pod["metadata"]["name"]))
