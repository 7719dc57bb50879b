"""What a job's podTemplate may ask of its pods: the cluster admin's choice, each refused
field named in the Invalid condition, nothing created while it lasts."""

from __future__ import annotations

import pytest
from llmtrain_operator.planner import plan
from llmtrain_operator.planner.podpolicy import ANYTHING, STRICT, PodPolicy, refusals
from support.planning import NOW, job, observed, summary

PRIVILEGED = {"spec": {
    "hostNetwork": True, "hostPID": True,
    "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "node", "hostPath": {"path": "/"}}],
    "containers": [{"name": "trainer", "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "SYS_PTRACE"]}}},
                   {"name": "sidecar", "securityContext": {"capabilities": {"add": ["CAP_NET_ADMIN"]}}}],
    "initContainers": [{"name": "setup", "securityContext": {"privileged": True}}],
}}


def test_each_privileged_field_is_named():
    said = refusals(PRIVILEGED, STRICT)
    assert [s.split(":")[0] for s in said] == [
        "spec.podTemplate.spec.hostNetwork", "spec.podTemplate.spec.hostPID", "spec.podTemplate.spec.volumes[1].hostPath",
        "spec.podTemplate.spec.containers[0].securityContext.privileged",
        "spec.podTemplate.spec.containers[0].securityContext.capabilities.add",
        "spec.podTemplate.spec.containers[1].securityContext.capabilities.add",
        "spec.podTemplate.spec.initContainers[0].securityContext.privileged"]
    assert "SYS_ADMIN" in said[4] and "SYS_PTRACE" not in said[4], "py-spy's capability is allowed"
    more = refusals({"spec": {"securityContext": {"windowsOptions": {"hostProcess": True}}, "containers": [
        {"name": "trainer", "ports": [{"containerPort": 80, "hostPort": 80}],
         "securityContext": {"procMount": "Unmasked", "capabilities": {"add": ["IPC_LOCK", "cap_sys_ptrace"]}}}]}}, STRICT)
    assert [s.split(":")[0] for s in more] == [
        "spec.podTemplate.spec.securityContext.windowsOptions.hostProcess",
        "spec.podTemplate.spec.containers[0].securityContext.procMount",
        "spec.podTemplate.spec.containers[0].ports[0].hostPort"], "RDMA's IPC_LOCK and py-spy's SYS_PTRACE pass"
    assert refusals({"spec": {"serviceAccountName": "default"}}, STRICT) == [], "the namespace's default account"
    assert refusals(PRIVILEGED, PodPolicy(allow_privileged=True)) == []


@pytest.mark.parametrize(("policy", "refused"), [(STRICT, True), (PodPolicy(service_accounts=frozenset({"s3-irsa"})), False),
                                                (PodPolicy(service_accounts=frozenset({"other"})), True), (ANYTHING, False)])
def test_a_service_account_is_allowed_only_by_name_or_by_star(policy, refused):
    said = refusals({"spec": {"serviceAccountName": "s3-irsa"}}, policy)
    assert bool(said) == refused
    if refused:
        assert "spec.podTemplate.spec.serviceAccountName: service account 's3-irsa'" in said[0]


def test_an_ordinary_template_passes():
    ordinary = {"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shards"}}],
                         "securityContext": {"runAsNonRoot": False, "runAsUser": 0},
                         "containers": [{"name": "trainer", "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}]}}
    assert refusals(ordinary, STRICT) == [] and refusals(None, STRICT) == [] and refusals({"spec": "x"}, STRICT) == []


def test_a_refused_template_makes_the_job_invalid_creates_nothing_and_clears_once_allowed():
    raw = job({"spec.podTemplate": {"spec": {"hostNetwork": True}}})
    refused = plan(raw, observed(raw, [], with_store=False), NOW)
    invalid = next(c for c in refused.status["conditions"] if c["type"] == "Invalid")
    assert refused.status["phase"] == "Invalid" and invalid["reason"] == "PodTemplateRefused"
    assert "spec.podTemplate.spec.hostNetwork" in invalid["message"]
    assert not [a for a in summary(refused.actions) if a.startswith("create")]
    assert [e.reason for e in refused.events] == ["PodTemplateRefused"]
    allowed = plan({**raw, "status": refused.status}, observed(raw, [], with_store=False), NOW, pod_policy=PodPolicy(allow_privileged=True))
    assert next(c for c in allowed.status["conditions"] if c["type"] == "Invalid")["status"] == "False"
    assert "create Pod/tiny-elastic-worker-0" in summary(allowed.actions)
