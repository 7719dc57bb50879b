"""The core types inside the spec (podTemplate.spec, scheduling.affinity, env[].valueFrom)
against the real API server: the committed upstream schemas are what the pinned
kube-apiserver serves, the CRD built from them makes the server refuse a misspelt field
(kubectl's default, ``--validate=strict``) naming it, or drop it with a warning, and a
valid template is stored exactly as sent (no defaults written into the job)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from llmtrain_operator.api import coretypes
from support.chart import apply_crd
from support.specs import ROOT, load_job
from support.waiting import wait_for

sys.path.insert(0, str(ROOT / "hack"))
import k8s_openapi

pytestmark = pytest.mark.cluster

NS = "core-schemas"


def test_the_committed_schemas_are_what_the_api_server_serves(local_cluster):
    served = local_cluster.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout
    assert coretypes.SCHEMAS.read_text() == k8s_openapi.render(served), \
        "the pinned Kubernetes changed its core types: run hack/k8s_openapi.py, then `llmtrain crd --write`"


def _job(name: str, pod_spec: dict) -> dict:
    job = load_job()
    job["metadata"] = {"name": name}
    job["spec"]["suspend"] = True  # no operator runs in this suite
    job["spec"]["podTemplate"] = {"spec": pod_spec}
    job["spec"]["scheduling"] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}}}
    job["spec"]["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": True}}}]
    return job


def test_a_typo_is_refused_naming_it_a_warned_one_dropped_and_a_valid_template_kept_as_sent(local_cluster):
    bed = local_cluster
    apply_crd(bed)
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("delete", "ltj", "--all", "-n", NS, "--wait=true")  # a rerun on the same bed
    good = {"containers": [{"name": "trainer", "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            "ports": [{"containerPort": 8080}], "resources": {"limits": {"memory": "8Gi"}}}],
            "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "10Gi"}}], "terminationGracePeriodSeconds": 60}

    sent = _job("typed", good)
    bed.kubectl("create", "-n", NS, "-f", "-", input=yaml.safe_dump(sent))
    stored = json.loads(bed.kubectl("get", "ltj", "typed", "-n", NS, "-o", "json").stdout)["spec"]
    assert stored["podTemplate"] == sent["spec"]["podTemplate"], "kept as sent: no field dropped, no default added"
    assert stored["scheduling"]["affinity"] == sent["spec"]["scheduling"]["affinity"]
    assert stored["env"] == sent["spec"]["env"]

    typo = {"containers": [{"name": "trainer", "volumeMount": [{"name": "data", "mountPath": "/data"}]}]}
    # A CRD just updated (from one without the core types) takes a moment to be in force.
    wait_for(lambda: bed.kubectl("create", "--dry-run=server", "-n", NS, "-f", "-", input=yaml.safe_dump(_job("typo", typo)),
                                 check=False).returncode != 0, 30, 0.2, "the CRD's schema in force")
    refused = bed.kubectl("create", "-n", NS, "-f", "-", input=yaml.safe_dump(_job("typo", typo)), check=False)
    assert refused.returncode != 0, refused.stdout
    assert 'unknown field "spec.podTemplate.spec.containers[0].volumeMount"' in refused.stderr, refused.stderr

    wrong_type = {"containers": [{"name": "trainer", "resources": {"limits": {"memory": "lots"}}}]}
    refused = bed.kubectl("create", "-n", NS, "-f", "-", input=yaml.safe_dump(_job("badqty", wrong_type)), check=False)
    assert refused.returncode != 0 and "spec.podTemplate.spec.containers[0].resources.limits.memory" in refused.stderr, refused.stderr

    warned = bed.kubectl("create", "--validate=warn", "-n", NS, "-f", "-", input=yaml.safe_dump(_job("warned", typo)), check=False)
    assert warned.returncode == 0, warned.stderr
    assert "unknown field" in warned.stderr and "volumeMount" in warned.stderr, warned.stderr
    kept = json.loads(bed.kubectl("get", "ltj", "warned", "-n", NS, "-o", "json").stdout)["spec"]["podTemplate"]["spec"]
    assert kept["containers"] == [{"name": "trainer"}], "the server dropped the unknown field instead of keeping it in silence"
