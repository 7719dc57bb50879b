"""The chart grants exactly the rights the operator's code uses: derived from the source
(``support/rights.py``) and compared with the chart's rules both ways. The real
authorizer is asked about the same rights in ``tests/cluster/test_chart.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from llmtrain_operator.k8s.client import CUSTOM_PLURALS
from llmtrain_operator.planner import podgroup, queue

from support import rights

TEMPLATES = Path(__file__).resolve().parents[2] / "charts" / "llmtrain-operator" / "templates"


def _block(name: str) -> list[dict]:
    text = (TEMPLATES / "_helpers.tpl").read_text()
    match = re.search(r'\{\{- define "llmtrain\.rules\.' + name + r'" -\}\}\n(.*?)\{\{- end \}\}', text, re.S)
    assert match, name
    return yaml.safe_load(match.group(1))


def _leader_election() -> set[rights.Right]:
    text = (TEMPLATES / "rbac.yaml").read_text()
    block = text[text.index("-leader-election"):]
    block = block[block.index("rules:"):block.index("---")]
    return rights.granted(yaml.safe_load(re.sub(r"\{\{[^}]*\}\}", "lease", block))["rules"])


NAMESPACE_SCAN = {("", "namespaces", "list"), ("", "namespaces", "watch")}


def _without_leases(needed: set[rights.Right]) -> set[rights.Right]:
    return {r for r in needed if r[1] != "leases"}


def test_the_cluster_wide_role_grants_exactly_what_the_code_uses():
    granted = rights.granted(_block("cluster")) | rights.granted(_block("namespaced"))
    text = (TEMPLATES / "rbac.yaml").read_text()
    assert "resources: [namespaces]\n    verbs: [list, watch]" in text
    granted |= NAMESPACE_SCAN
    needed = _without_leases(rights.needed(cluster_wide=True))
    assert granted - needed == set(), "granted but never used"
    assert needed - granted == set(), "used but not granted"


def test_a_namespaced_install_grants_exactly_what_the_code_uses():
    granted = rights.granted(_block("cluster")) | rights.granted(_block("namespaced")) | rights.granted(_block("secrets"))
    needed = _without_leases(rights.needed(cluster_wide=False))
    assert granted - needed == set(), "granted but never used"
    assert needed - granted == set(), "used but not granted"


def test_leader_election_grants_exactly_the_lease_calls():
    assert _leader_election() == {r for r in rights.needed(cluster_wide=True) if r[1] == "leases"} == {
        ("coordination.k8s.io", "leases", v) for v in ("create", "get", "update")}


def test_the_derivation_reads_the_calls_it_should():
    assert rights.typed_right("core", "create_namespaced_pod") == ("", "pods", "create")
    assert rights.typed_right("core", "read_namespaced_pod_log") == ("", "pods/log", "get")
    assert rights.typed_right("core", "replace_namespaced_config_map") == ("", "configmaps", "update")
    assert rights.typed_right("networking", "list_namespaced_network_policy") == ("networking.k8s.io", "networkpolicies", "list")
    assert rights.typed_right("core", "read_namespaced_persistent_volume_claim") == ("", "persistentvolumeclaims", "get")
    with pytest.raises(KeyError, match="declare its group and resource"):
        rights.method_rights("some_new_method", [("custom", "create_namespaced_custom_object")])
    modules = {p.relative_to(rights.PACKAGE).as_posix() for p in rights.operator_modules()}
    assert {"handlers/__init__.py", "handlers/reconcile.py", "k8s/client.py", "planner/plan.py"} <= modules
    assert not modules & {"cli.py", "logscli.py", "jobread.py"}, "the CLI runs with the user's kubeconfig"
    # What the CLI alone uses is not the operator's: reading a pod's log.
    assert ("", "pods/log", "get") not in rights.needed(cluster_wide=True)


def test_every_declared_custom_object_call_exists_and_names_the_resources_the_code_does():
    methods = rights.client_methods()
    for method, api in rights.CUSTOM:
        assert ("custom", api) in methods[method], f"K8s.{method} no longer calls {api}: remove its declaration"
    declared = {r for rs in rights.CUSTOM.values() for r in rs}
    assert {g for g, res, _ in declared if res == "podgroups"} == {api.group for api in podgroup.APIS.values()}
    kueue_group = queue.API_VERSION.split("/")[0]
    assert {(g, res) for g, res, _ in declared if g == kueue_group} == {
        (kueue_group, queue.PLURAL), (kueue_group, f"{queue.PLURAL}/status"), (kueue_group, queue.FLAVORS)}
    assert set(CUSTOM_PLURALS.values()) == {res for _, res, verb in declared if verb == "create"}
