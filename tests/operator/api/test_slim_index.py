"""The operator's indexes keep only what the planner reads of each pod and node
(api/observed.py ``slim_pod``/``slim_node``): the views built from the slim copies are
the views of the whole objects."""

from __future__ import annotations

import copy

import pytest
from llmtrain_operator.api.observed import node_view, owned_by, pod_view, slim_child, slim_node, slim_pod
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


def test_a_slim_child_keeps_its_name_owners_and_annotations_only():
    cm = {"metadata": {"name": "tiny-elastic-config", "namespace": "ml", "uid": "cm-1", "labels": {"llmtrain.io/job": "tiny-elastic"},
                       "ownerReferences": [{"kind": "LLMTrainJob", "name": "tiny-elastic", "uid": "uid-1", "controller": True}],
                       "annotations": {"llmtrain.io/config-hash": "abc"}, "managedFields": [{"manager": "x"}]},
          "data": {"config.yaml": "x" * 10_000}}
    slim = slim_child(cm)
    assert slim == {"metadata": {"name": "tiny-elastic-config", "ownerReferences": cm["metadata"]["ownerReferences"],
                                 "annotations": {"llmtrain.io/config-hash": "abc"}}}
    assert owned_by(slim, "uid-1")


@pytest.mark.parametrize(("owners", "uid", "owned"), [
    ([{"uid": "uid-1"}], "uid-1", True),
    ([{"uid": "someone-else"}, {"uid": "uid-1"}], "uid-1", True),
    ([{"uid": "uid-of-a-deleted-namesake"}], "uid-1", False),
    ([], "uid-1", False),
    (None, "uid-1", False),
    ([{"uid": ""}], "", False),  # a job without a uid owns nothing
], ids=["its-own", "one-of-several-owners", "a-namesakes", "no-owners", "no-field", "no-uid"])
def test_a_child_is_the_jobs_when_an_owner_reference_names_its_uid(owners, uid, owned):
    meta = {"name": "tiny-elastic-worker-0", "labels": {"llmtrain.io/job": "tiny-elastic"}}
    if owners is not None:
        meta["ownerReferences"] = owners
    assert owned_by({"metadata": meta}, uid) is owned
