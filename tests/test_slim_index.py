"""The operator's indexes keep only what the planner reads of each pod and node
(api/observed.py ``slim_pod``/``slim_node``): the views built from the slim copies are
the views of the whole objects."""

from __future__ import annotations

import copy

import pytest
from llmtrain_operator.api.observed import node_view, pod_view, slim_node, slim_pod
from llmtrain_operator.api.job import parse_job
from llmtrain_operator.planner.manifests import worker_pod
from support.specs import load_job

NOW = "2026-11-26T08:00:00Z"


def full_pod(status: dict) -> dict:
    pod = worker_pod(parse_job(load_job()), slot=1, generation=2)
    pod["metadata"].update(uid="u-1", creationTimestamp=NOW, managedFields=[{"manager": "kubelet", "fieldsV1": {"f:status": {}}}])
    pod["spec"]["nodeName"] = "node-2"
    pod["status"] = status
    return pod


STATUSES = [
    {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
    {"phase": "Running", "podIP": "10.1.0.7", "startTime": NOW,
     "conditions": [{"type": "Ready", "status": "True"}],
     "containerStatuses": [{"name": "trainer", "state": {"running": {"startedAt": NOW}}}]},
    {"phase": "Failed", "reason": "Evicted", "message": "low on memory", "conditions": [{"type": "DisruptionTarget", "status": "True"}],
     "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": NOW,
                                                                         "message": '{"code": 137}'}}}]},
    {"phase": "Pending", "containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                                                       "message": 'secret "s3" not found'}}}]},
]


@pytest.mark.parametrize("status", STATUSES, ids=["unschedulable", "running", "evicted", "config-error"])
def test_a_slim_pod_has_the_same_view_and_no_spec_or_field_history(status):
    pod = full_pod(status)
    slim = slim_pod(copy.deepcopy(pod))
    assert pod_view(slim) == pod_view(pod)
    assert "containers" not in slim["spec"] and "managedFields" not in slim["metadata"]
    assert len(str(slim)) < len(str(pod)) / 2


def test_a_slim_node_has_the_same_view():
    node = {"metadata": {"name": "node-1", "labels": {"a": "b"}},
            "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown", "lastTransitionTime": NOW}],
                       "images": [{"names": ["x"] * 10, "sizeBytes": 1}] * 50}}
    assert node_view(slim_node(node)) == node_view(node)
    assert "images" not in slim_node(node)["status"]
