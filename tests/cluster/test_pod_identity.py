"""``llmtrain logs`` tells a replaced pod from the one that had its name by uid
(``K8s.pod_uid``), read from the real API server: a pod recreated under its name has a
new uid, a missing pod has none."""

from __future__ import annotations

import json

import pytest
from llmtrain_operator.k8s.client import K8s

pytestmark = pytest.mark.cluster

NS = "pod-identity"
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "same-name", "namespace": NS},
       # Never scheduled (no node has this label): an object to read, no process to run.
       "spec": {"nodeSelector": {"llmtrain.io/nowhere": "true"}, "containers": [{"name": "c", "image": "none"}]}}


def test_a_pod_recreated_under_its_name_has_a_new_uid_and_a_missing_one_none(local_cluster, monkeypatch):
    bed = local_cluster
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("delete", "pod", "same-name", "-n", NS, "--ignore-not-found", "--wait=true")
    monkeypatch.setenv("KUBECONFIG", str(bed.kubeconfig))
    k8s = K8s.from_environment()
    assert k8s.pod_uid(NS, "same-name") is None

    bed.kubectl("create", "-f", "-", input=json.dumps(POD))
    first = k8s.pod_uid(NS, "same-name")
    assert first == bed.kubectl("get", "pod", "same-name", "-n", NS, "-o", "jsonpath={.metadata.uid}").stdout
    bed.kubectl("delete", "pod", "same-name", "-n", NS, "--wait=true", "--grace-period=0", "--force")
    bed.kubectl("create", "-f", "-", input=json.dumps(POD))
    second = k8s.pod_uid(NS, "same-name")
    assert second and second != first
    bed.kubectl("delete", "pod", "same-name", "-n", NS, "--grace-period=0", "--force", "--wait=false")
