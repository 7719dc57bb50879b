"""The job's NetworkPolicy: its peers parsed from the settings (a bad one refused, naming
it), the manifest (who may reach which port), and the planner creating it before any of
the job's pods, and never again once it is seen. Enforcement by a real network plugin is
the kind bed's (tests/e2e/test_network_policy.py)."""

from __future__ import annotations

import pytest
from llmtrain_contract.names import HEALTH_PORT
from llmtrain_operator.api import parse_job
from llmtrain_operator.planner import plan
from llmtrain_operator.planner.isolation import Isolation, IsolationError
from llmtrain_operator.planner.manifests import network_policy
from llmtrain_operator.planner.policies.children import POLICY_SEEN_SECONDS
from support.planning import NOW, job, observed, running_status, summary, worker

ISOLATION = Isolation.parse("llmtrain-system", "app.kubernetes.io/name=llmtrain-operator,app.kubernetes.io/instance=llmtrain",
                            "monitoring,172.18.0.1/32")
POLICY = "tiny-elastic-isolation"


def test_the_settings_parse_into_peers():
    assert ISOLATION.operator_namespace == "llmtrain-system"
    assert dict(ISOLATION.operator_labels) == {"app.kubernetes.io/name": "llmtrain-operator", "app.kubernetes.io/instance": "llmtrain"}
    assert ISOLATION.metrics_from == ("monitoring", "172.18.0.1/32")


@pytest.mark.parametrize(("namespace", "pods", "metrics_from", "named"), [
    ("", "a=b", "", "is not a namespace name"),
    ("Bad_NS", "a=b", "", "'Bad_NS' is not a namespace name"),
    ("ns", "", "", "no label selects the operator's pods"),
    ("ns", " , ", "", "no label selects the operator's pods"),
    ("ns", "app", "", "'app' is not a label key=value"),
    ("ns", "app=a b", "", "'app=a b' is not a label key=value"),
    ("ns", "a=b", "Monitoring", "'Monitoring' is neither a namespace name nor an address range"),
    ("ns", "a=b", "10.0.0.1/33", "'10.0.0.1/33' is not an address range"),
    ("ns", "a=b", "10.0.0.1/24", "'10.0.0.1/24' is not an address range"),  # host bits set: say what was meant
])
def test_a_setting_that_cannot_make_a_valid_policy_is_refused_naming_it(namespace, pods, metrics_from, named):
    with pytest.raises(IsolationError) as err:
        Isolation.parse(namespace, pods, metrics_from)
    assert named in str(err.value)


def test_the_policy_admits_the_jobs_pods_everywhere_and_the_operator_and_readers_on_two_ports():
    spec = network_policy(parse_job(job({"spec.metrics.port": 9500})), ISOLATION)
    assert spec["kind"] == "NetworkPolicy" and spec["metadata"]["name"] == POLICY
    assert spec["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # removed with the job
    body = spec["spec"]
    assert body["podSelector"] == {"matchLabels": {"llmtrain.io/job": "tiny-elastic"}}
    assert body["policyTypes"] == ["Ingress"], "egress stays open: the tiers and DNS are wherever the cluster has them"
    own, readers = body["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"llmtrain.io/job": "tiny-elastic"}}}]}, "every port"
    assert readers["ports"] == [{"protocol": "TCP", "port": HEALTH_PORT}, {"protocol": "TCP", "port": 9500}]
    assert readers["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "llmtrain-system"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "llmtrain-operator", "app.kubernetes.io/instance": "llmtrain"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"ipBlock": {"cidr": "172.18.0.1/32"}},
    ]


def test_a_new_job_creates_its_policy_first_and_its_pods_only_once_the_policy_is_seen():
    raw = job()
    empty = observed(raw, [], with_store=False, services=frozenset(), configmaps={})
    first = plan(raw, empty, NOW, isolation=ISOLATION)
    assert summary(first.actions) == ["create Service/tiny-elastic-workers", "create Service/tiny-elastic-rdzv",
                                      f"create NetworkPolicy/{POLICY}", "create ConfigMap/tiny-elastic-config"]
    assert first.requeue_after == POLICY_SEEN_SECONDS
    seen = observed(raw, [], with_store=False, network_policies=frozenset({POLICY}))
    second = plan({**raw, "status": first.status}, seen, NOW, isolation=ISOLATION)
    assert summary(second.actions) == ["create Pod/tiny-elastic-rdzv", "create Pod/tiny-elastic-worker-0",
                                       "create Pod/tiny-elastic-worker-1"]


def test_a_running_job_whose_policy_was_deleted_gets_it_back_and_no_replacement_starts_open():
    raw = job(status=running_status(step=20))
    pods = [worker(0), worker(1, phase="Failed", exit_code=1)]
    result = plan(raw, observed(raw, pods), NOW, isolation=ISOLATION)
    assert f"create NetworkPolicy/{POLICY}" in summary(result.actions)
    assert not [a for a in summary(result.actions) if a.startswith("create Pod/")], summary(result.actions)


def test_without_isolation_no_policy_is_made_and_nothing_waits_for_one():
    raw = job()
    result = plan(raw, observed(raw, [], with_store=False, services=frozenset(), configmaps={}), NOW)
    assert not [a for a in summary(result.actions) if "NetworkPolicy" in a]
    assert "create Pod/tiny-elastic-worker-0" in summary(result.actions)


def test_a_seen_policy_is_never_created_again():
    raw = job(status=running_status(step=20))
    obs = observed(raw, [worker(0), worker(1)], network_policies=frozenset({POLICY}))
    assert not [a for a in summary(plan(raw, obs, NOW, isolation=ISOLATION).actions) if "NetworkPolicy" in a]
