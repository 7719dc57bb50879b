"""The pods the operator creates, judged by the real API server's PodSecurity admission in a
namespace that enforces "restricted": a worker and the rendezvous store pass; the same
pods without their security settings are refused (so the check is not vacuous); a job
with a hostPath tier is refused, as docs/install.md says it is."""

from __future__ import annotations

import copy
import subprocess

import pytest
import yaml
from llmtrain_operator.api import parse_job
from llmtrain_operator.planner.manifests import store_pod, worker_pod
from support.specs import ROOT, apply_set, load_job
from support.waiting import wait_for

pytestmark = pytest.mark.cluster

NS = "pss-restricted"


@pytest.fixture(scope="module")
def restricted(local_cluster):
    bed = local_cluster
    bed.kubectl("create", "namespace", NS, check=False)
    bed.kubectl("label", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    wait_for(lambda: bed.kubectl("get", "serviceaccount", "default", "-n", NS, check=False).returncode == 0, 30,
             what="the namespace's default ServiceAccount")
    return bed


def _job(changes: dict | None = None):
    raw = apply_set(load_job(), changes or {})
    raw["metadata"].update(namespace=NS, uid="00000000-0000-0000-0000-000000000001")
    return parse_job(raw)


def _dry_run(bed, pod: dict) -> subprocess.CompletedProcess:
    pod = copy.deepcopy(pod)
    pod["metadata"]["namespace"] = NS
    return bed.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)


def _bare(pod: dict) -> dict:
    pod = copy.deepcopy(pod)
    pod["spec"].pop("securityContext", None)
    for container in pod["spec"]["containers"]:
        container.pop("securityContext", None)
    return pod


@pytest.mark.parametrize("which", ["worker", "store"])
def test_the_operators_pods_pass_restricted_and_fail_it_without_their_settings(restricted, which):
    job = _job()
    pod = worker_pod(job, 0, 0) if which == "worker" else store_pod(job)
    allowed = _dry_run(restricted, pod)
    assert allowed.returncode == 0, allowed.stderr
    refused = _dry_run(restricted, _bare(pod))
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr, refused.stderr


def test_every_example_that_needs_no_host_path_passes_restricted(restricted):
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        raw = load_job(example)
        if ((raw["spec"].get("checkpoint") or {}).get("local") or {}).get("hostPath"):
            continue
        raw["metadata"].update(namespace=NS, uid="00000000-0000-0000-0000-000000000002")
        pod = worker_pod(parse_job(raw), 0, 0)
        out = _dry_run(restricted, pod)
        assert out.returncode == 0, f"{example.name}: {out.stderr}"


def test_a_host_path_tier_is_refused_by_restricted_naming_the_volume(restricted):
    pod = worker_pod(_job({"spec.checkpoint.local": {"hostPath": "/mnt/nvme/llmtrain"}}), 0, 0)
    refused = _dry_run(restricted, pod)
    assert refused.returncode != 0 and "hostPath" in refused.stderr, refused.stderr
