"""helm and kubectl checks of the chart against the real API server: it lints, and what
it renders in both watch scopes is accepted by a server-side dry run."""

from __future__ import annotations

import pytest
import yaml
from llmtrain_operator.settings import from_env
from support.specs import ROOT

CHART = str(ROOT / "charts" / "llmtrain-operator")
NS = "chart-check"


def render(bed, *sets: str) -> list[dict]:
    out = bed.helm("template", "llmtrain", CHART, "--namespace", NS, "--kube-version", "1.36.3",
                   *(a for s in sets for a in ("--set", s)))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_the_chart_lints_strictly(local_cluster):
    out = local_cluster.helm("lint", "--strict", CHART)
    assert "0 chart(s) failed" in out.stdout, out.stdout


@pytest.mark.parametrize("sets", [(), ("replicaCount=1",), ("watchNamespace=chart-team",), ("watchNamespace=chart-team", "replicaCount=1")],
                         ids=["cluster-wide-ha", "cluster-wide-standalone", "namespaced-ha", "namespaced-standalone"])
def test_every_rendering_passes_a_server_side_dry_run(local_cluster, sets):
    bed = local_cluster
    for ns in (NS, "chart-team"):
        bed.kubectl("create", "namespace", ns, check=False)
    # What `helm install` does first: the chart's CRDs.
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", f"{CHART}/crds")
    docs = render(bed, *sets)
    out = bed.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert out.returncode == 0, out.stderr


def test_a_namespaced_install_grants_namespaced_rights_only_in_its_namespace(local_cluster):
    docs = render(local_cluster, "watchNamespace=chart-team")
    kinds = {(d["kind"], d["metadata"].get("namespace")) for d in docs}
    assert ("Role", "chart-team") in kinds and ("RoleBinding", "chart-team") in kinds
    # Leader election: a Lease in the release namespace, with rights to that one Lease.
    lease_role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == NS)
    assert {tuple(r.get("resourceNames", [])) for r in lease_role["rules"]} == {(), ("llmtrain-operator",)}
    assert all(r["resources"] == ["leases"] for r in lease_role["rules"])
    assert not any(d["kind"] in ("KopfPeering", "ClusterKopfPeering") for d in docs)
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    cluster_resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert cluster_resources == {"nodes", "customresourcedefinitions"}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--namespace=chart-team" in command and "--all-namespaces" not in command


def test_operator_values_become_settings_the_operator_accepts(local_cluster):
    docs = render(local_cluster, "operator.maxConcurrentReconciles=4", "operator.resyncSeconds=5", "operator.statusFlushSeconds=30")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = from_env({k: v for k, v in env.items() if k.startswith("LLMTRAIN_OPERATOR_") and v is not None})
    assert (settings.max_concurrent_reconciles, settings.resync_seconds, settings.status_flush_seconds) == (4, 5.0, 30.0)
    defaults = next(d for d in render(local_cluster) if d["kind"] == "Deployment")
    names = {e["name"] for e in defaults["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "LLMTRAIN_OPERATOR_MAX_CONCURRENT_RECONCILES" not in names  # empty values keep the operator's defaults
