"""What the real API server refuses: a ResourceQuota that holds the job's pods back,
Pod Security "restricted" against a job that asks for a hostPath tier, and a misspelt
field in the pod template. The job says why in its status (the server's own words),
retries with backoff, and runs once the cause goes."""

from __future__ import annotations

import json

import pytest
import yaml
from support.waiting import wait_for

from .jobs import create, job_manifest, pods, wait_event, wait_status

pytestmark = pytest.mark.e2e


def _failure(status: dict) -> dict | None:
    return next((c for c in status.get("conditions", []) if c["type"] == "ReplicaFailure"), None)


def test_a_quota_that_refuses_the_pods_is_in_the_status_and_the_job_runs_once_it_is_raised(operator):
    bed, ns, name = operator, "e2e-quota", "quota"
    bed.kubectl("create", "namespace", ns, check=False)
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods", "namespace": ns},
             "spec": {"hard": {"pods": "1"}}}
    bed.kubectl("apply", "-f", "-", input=json.dumps(quota))
    # The quota admission plugin refuses only once the quota controller has set its usage.
    wait_for(lambda: (json.loads(bed.kubectl("get", "resourcequota", "pods", "-n", ns, "-o", "json").stdout)
                      .get("status") or {}).get("hard"), 60, what="the quota's status")
    create(bed, ns, job_manifest(name, {"spec.trainer.builtin.maxSteps": 20}))
    refused = wait_status(bed, ns, name, lambda s: (_failure(s) or {}).get("status") == "True", 120, "ReplicaFailure")
    failure = _failure(refused)
    assert failure["reason"] == "FailedCreate" and "exceeded quota: pods" in failure["message"], failure
    wait_event(bed, ns, name, "FailedCreate", "exceeded quota")
    assert len(pods(bed, ns, name)) + len(pods(bed, ns, name, "rendezvous")) <= 1
    bed.kubectl("patch", "resourcequota", "pods", "-n", ns, "--type=merge", "-p", '{"spec": {"hard": {"pods": "10"}}}')
    done = wait_status(bed, ns, name, lambda s: s.get("phase") in ("Succeeded", "Failed"), 600, "the job ran after the quota rose")
    assert done["phase"] == "Succeeded", json.dumps(done)[:2000]
    assert _failure(done)["status"] == "False" and _failure(done)["reason"] == "CreatesAccepted"
    assert done["restarts"] == 0, "a refused create is not a failure of the job"


def test_pod_security_restricted_refuses_a_host_path_tier_naming_it(operator):
    bed, ns, name = operator, "e2e-restricted", "host-path"
    bed.kubectl("create", "namespace", ns, check=False)
    bed.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    create(bed, ns, job_manifest(name, {"spec.checkpoint.local": {"hostPath": "/var/tmp/llmtrain-e2e-tier"}}))
    try:
        refused = wait_status(bed, ns, name, lambda s: (_failure(s) or {}).get("status") == "True", 120, "ReplicaFailure")
        message = _failure(refused)["message"]
        assert 'violates PodSecurity "restricted' in message and "hostPath" in message, message
        assert not pods(bed, ns, name)
    finally:
        bed.kubectl("delete", "ltj", name, "-n", ns, "--wait=false")


def test_a_misspelt_field_in_the_pod_template_is_refused_naming_it_not_dropped(operator):
    """``volumeMount`` for ``volumeMounts`` in ``podTemplate.spec``, ``label`` for
    ``labels`` in its metadata: the CRD carries the upstream PodSpec schema and a typed
    metadata, so the API server refuses the job itself, naming the field, and the mount
    or label a user asked for is never silently missing. (The operator's own creates are
    strict too: tests/operator/handlers/test_contract.py.)"""
    bed, ns = operator, "e2e-strict"
    bed.kubectl("create", "namespace", ns, check=False)
    typos = {"spec.podTemplate.spec.containers[0].volumeMount":
             {"spec": {"containers": [{"name": "trainer", "volumeMount": [{"name": "data", "mountPath": "/data"}]}]}},
             "spec.podTemplate.metadata.label": {"metadata": {"label": {"team": "a"}}}}
    for field, template in typos.items():
        manifest = job_manifest("typo", {"spec.podTemplate": template})
        refused = bed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest), check=False)
        assert refused.returncode != 0, refused.stdout
        assert f'unknown field "{field}"' in refused.stderr, refused.stderr
    assert bed.kubectl("get", "ltj", "typo", "-n", ns, check=False).returncode != 0, "nothing was created"
