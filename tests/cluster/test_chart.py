"""helm and kubectl checks of the chart against the real API server: it lints with several
values files, its schema refuses bad values, what it renders in both watch scopes is
accepted by a server-side dry run, its ServiceAccount can do exactly what the operator
needs (``kubectl auth can-i``, both watch scopes), the operator's pod passes Pod Security
"restricted", the chart's CRD template renders the generated CRD, and a release adopts an
existing CRD, installs, upgrades it with the chart and uninstalls without leftovers,
keeping the CRD."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from llmtrain_operator.handlers.reconcile import isolation_of
from llmtrain_operator.settings import from_env
from support import chart as support_chart
from support import rights
from support import scheduler_crds
from support.specs import ROOT
from support.waiting import wait_for

pytestmark = pytest.mark.cluster

CHART = str(support_chart.CHART)
CRD = support_chart.CRD
CRD_TEMPLATE = Path("templates") / "crds" / CRD.name
NS = "chart-check"


def render(bed, *sets: str) -> list[dict]:
    out = bed.helm("template", "llmtrain", CHART, "--namespace", NS,
                   *(a for s in sets for a in ("--set", s)))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_helm_template_renders_offline_without_a_kube_version_and_refuses_one_below_the_floor(local_cluster):
    """Offline, helm assumes the Kubernetes of the client-go it was built with (render()
    above passes no --kube-version); a cluster older than the chart's kubeVersion floor is
    refused by name."""
    rendered = local_cluster.helm("template", "llmtrain", CHART, check=False)
    assert rendered.returncode == 0 and "kind: Deployment" in rendered.stdout, rendered.stderr
    old = local_cluster.helm("template", "llmtrain", CHART, "--kube-version", "1.28.0", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr and "1.28.0" in old.stderr, old.stderr


def test_the_chart_lints_strictly(local_cluster):
    out = local_cluster.helm("lint", "--strict", CHART)
    assert "0 chart(s) failed" in out.stdout, out.stdout


@pytest.mark.parametrize("sets", [(), ("replicaCount=1",), ("watchNamespace=chart-team",), ("watchNamespace=chart-team", "replicaCount=1")],
                         ids=["cluster-wide-ha", "cluster-wide-standalone", "namespaced-ha", "namespaced-standalone"])
def test_every_rendering_passes_a_server_side_dry_run(local_cluster, sets):
    bed = local_cluster
    for ns in (NS, "chart-team"):
        bed.kubectl("create", "namespace", ns, check=False)
    # The CRD first, as on a cluster with the operator: the rendered objects include it.
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
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
    # Only what has no namespace: nodes, CRD discovery, Kueue's ResourceFlavors (read only).
    assert cluster_resources == {"nodes", "customresourcedefinitions", "resourceflavors"}
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in cluster_role["rules"])
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
    assert not names & {"LLMTRAIN_OPERATOR_PROBE_PODS_PER_PASS", "LLMTRAIN_OPERATOR_PROBE_PAGES_PER_SECOND",
                        "LLMTRAIN_OPERATOR_PROGRESS_WRITES_PER_SECOND"}
    # 0 is a value for these two (every worker at every pass; no limit), not "unset".
    zeros = next(d for d in render(local_cluster, "operator.probePodsPerPass=0", "operator.progressWritesPerSecond=0",
                                   "operator.probePagesPerSecond=0") if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in zeros["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = from_env({k: v for k, v in env.items() if k.startswith("LLMTRAIN_OPERATOR_") and v is not None})
    assert (settings.probe_pods_per_pass, settings.progress_writes_per_second, settings.probe_pages_per_second) == (0, 0.0, 0.0)
    pods = render(local_cluster, "jobPods.allowPrivileged=true", "jobPods.allowedServiceAccounts={s3-irsa,reader}")
    env = {e["name"]: e.get("value") for e in next(d for d in pods if d["kind"] == "Deployment")
           ["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = from_env({k: v for k, v in env.items() if k.startswith("LLMTRAIN_OPERATOR_") and v is not None})
    assert (settings.allow_privileged_pods, settings.allowed_service_accounts) == (True, "s3-irsa,reader")
    assert from_env({k: v for k, v in env.items() if k == "LLMTRAIN_OPERATOR_NODE_FAILURE_CONDITIONS"}).failure_conditions() == \
        frozenset({"KernelDeadlock", "ReadonlyFilesystem"})
    health = render(local_cluster, "nodeHealth.failureConditions={KernelDeadlock,GPUXidError}")
    env = {e["name"]: e.get("value") for e in next(d for d in health if d["kind"] == "Deployment")
           ["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LLMTRAIN_OPERATOR_NODE_FAILURE_CONDITIONS"] == "KernelDeadlock,GPUXidError"
    # The jobs' NetworkPolicy: on by default, its peers the operator's own selector labels
    # in its namespace (POD_NAMESPACE, from the downward API) and metricsFrom.
    isolated = render(local_cluster, "networkPolicy.metricsFrom={monitoring,172.18.0.1/32}")
    env = {e["name"]: e.get("value") for e in next(d for d in isolated if d["kind"] == "Deployment")
           ["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = from_env({k: v for k, v in env.items() if k.startswith("LLMTRAIN_OPERATOR_") and v is not None})
    made = isolation_of(settings, {"POD_NAMESPACE": NS})
    deployment = next(d for d in isolated if d["kind"] == "Deployment")
    assert made is not None and dict(made.operator_labels) == deployment["spec"]["selector"]["matchLabels"]
    assert made.metrics_from == ("monitoring", "172.18.0.1/32")
    off = render(local_cluster, "networkPolicy.jobs.enabled=false")
    env = {e["name"]: e.get("value") for e in next(d for d in off if d["kind"] == "Deployment")
           ["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert isolation_of(from_env({k: v for k, v in env.items() if k.startswith("LLMTRAIN_OPERATOR_") and v is not None}), {}) is None


VALUES = sorted((ROOT / "tests" / "data" / "chart-values").glob("*.yaml"))


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_values_file_lints_strictly_and_passes_a_server_side_dry_run(local_cluster, values):
    bed = local_cluster
    out = bed.helm("lint", "--strict", CHART, "-f", str(values))
    assert "0 chart(s) failed" in out.stdout, out.stdout
    for ns in (NS, "team-a"):
        bed.kubectl("create", "namespace", ns, check=False)
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    docs = yaml.safe_load_all(bed.helm("template", "llmtrain", CHART, "--namespace", NS,
                                       "-f", str(values)).stdout)
    # The Prometheus Operator's CRDs are not on this cluster: its objects are checked by
    # tests/operator/test_monitoring.py instead.
    docs = [d for d in docs if d and not d["apiVersion"].startswith("monitoring.coreos.com/")]
    out = bed.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("value, where", [("replicaCount=0", "/replicaCount"), ("replicacount=2", "replicacount"),
                                          ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
                                          ("watchNamespace=Team_A", "/watchNamespace"),
                                          ("operator.resyncSeconds=soon", "/operator/resyncSeconds"),
                                          ("networkPolicy.metricsFrom={Monitoring}", "/networkPolicy/metricsFrom/0")])
def test_a_bad_value_is_refused_by_the_schema_naming_it(local_cluster, value, where):
    out = local_cluster.helm("template", "llmtrain", CHART, "--set", value, check=False)
    assert out.returncode != 0
    assert where in out.stderr, out.stderr


def test_names_follow_fullname_override(local_cluster):
    docs = render(local_cluster, "fullnameOverride=ml-operator")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "ml-operator") in names and ("ServiceAccount", "ml-operator") in names
    # The CRD's name is the API's (<plural>.<group>), whatever the release.
    assert all(name.startswith("ml-operator") for kind, name in names if kind != "CustomResourceDefinition"), names
    assert ("CustomResourceDefinition", "llmtrainjobs.llmtrain.io") in names


def test_replicas_get_a_disruption_budget_and_spread_over_nodes_and_a_single_one_gets_neither(local_cluster):
    ha = render(local_cluster)
    pdb = next(d for d in ha if d["kind"] == "PodDisruptionBudget")
    deployment = next(d for d in ha if d["kind"] == "Deployment")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    spread = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate", "replicas elect a leader: a surge is fenced"
    single = render(local_cluster, "replicaCount=1")
    assert not any(d["kind"] == "PodDisruptionBudget" for d in single)
    # No election with one replica: an upgrade must never run two writers at once.
    assert next(d for d in single if d["kind"] == "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert "affinity" not in next(d for d in single if d["kind"] == "Deployment")["spec"]["template"]["spec"]


# What the operator must never be able to do. What it needs is derived from its code
# (support/rights.py), so a right the code stops using must leave the chart too.
OTHER_NS = "chart-other"


def _asked(right: rights.Right) -> tuple[str, str]:
    """A derived right as ``kubectl auth can-i`` asks it: (verb, resource[.group][:sub])."""
    group, resource, verb = right
    resource, _, sub = resource.partition("/")
    return verb, resource + (f".{group}" if group else "") + (f":{sub}" if sub else "")


NEVER = [("list", "secrets"), ("watch", "secrets"), ("create", "llmtrainjobs.llmtrain.io"),
         # the jobs' token Secrets are created, never read back, changed or removed by hand
         ("update", "secrets"), ("patch", "secrets"), ("delete", "secrets"),
         ("create", "pods:exec"), ("create", "rolebindings.rbac.authorization.k8s.io"),
         ("escalate", "roles.rbac.authorization.k8s.io"), ("bind", "roles.rbac.authorization.k8s.io"),
         ("create", "serviceaccounts:token"), ("delete", "persistentvolumeclaims"), ("*", "*"),
         # Kueue's own decisions stay Kueue's: the Workload's spec and its deletion (ownerReferences do that)
         ("patch", "workloads.kueue.x-k8s.io"), ("delete", "workloads.kueue.x-k8s.io"),
         # a job's policy is made once and removed with the job: never loosened or removed by hand
         ("patch", "networkpolicies.networking.k8s.io"), ("delete", "networkpolicies.networking.k8s.io"),
         # verbs the code does not use on what it does touch
         ("update", "pods"), ("patch", "services"), ("delete", "services"), ("delete", "configmaps"),
         ("update", "llmtrainjobs.llmtrain.io"), ("update", "llmtrainjobs.llmtrain.io:status")]
NEVER_CLUSTER = [("delete", "nodes"), ("patch", "nodes"), ("get", "nodes"), ("escalate", "clusterroles.rbac.authorization.k8s.io"),
                 ("bind", "clusterroles.rbac.authorization.k8s.io"), ("create", "customresourcedefinitions.apiextensions.k8s.io"),
                 ("get", "secrets")]


def _can(bed, account: str, verb: str, resource: str, ns: str | None) -> bool:
    """``resource``: ``type``, ``type/name`` or ``type:subresource``."""
    resource, _, sub = resource.partition(":")
    args = ["auth", "can-i", verb, resource, f"--as={account}"]
    args += [f"--subresource={sub}"] if sub else []
    args += ["-n", ns] if ns else ["--all-namespaces"]
    out = bed.kubectl(*args, check=False)
    assert out.stdout.strip() in ("yes", "no"), out.stdout + out.stderr
    return out.stdout.strip() == "yes"


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_the_service_account_can_do_exactly_what_the_operator_needs(local_cluster, mode):
    """``kubectl auth can-i`` against the real authorizer, with the chart's RBAC objects
    created: every right the operator uses, none it must not have: no Secret reads
    outside a watched namespace, no escalate/bind, no wildcard."""
    bed = local_cluster
    # can-i resolves a resource through discovery: the kinds must be served to be asked
    # about (the job CRD is, from the bed's earlier chart tests).
    for crd, file in scheduler_crds.ALL:
        scheduler_crds.install(bed, crd, file)
    release, watched = f"cani-{mode}", "chart-team"
    for ns in (NS, watched, OTHER_NS):
        bed.kubectl("create", "namespace", ns, check=False)
    sets = [f"fullnameOverride={release}"] + ([f"watchNamespace={watched}"] if mode == "namespaced" else [])
    docs = [d for d in render(bed, *sets) if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    for rule in (r for d in docs for r in d.get("rules", [])):
        assert "*" not in rule.get("verbs", []) + rule.get("resources", []) + rule.get("apiGroups", []), rule
    # Exactly the derived rights, in the rendering (leases: the leader-election Role, with 2 replicas).
    needed = rights.needed(cluster_wide=mode == "cluster-wide")
    assert rights.granted([r for d in docs for r in d.get("rules", [])]) == needed, mode
    manifest = yaml.safe_dump_all(docs)
    bed.kubectl("apply", "-f", "-", input=manifest)
    account = f"system:serviceaccount:{NS}:{release}"
    try:
        served = [OTHER_NS] if mode == "cluster-wide" else [watched]
        namespaced = [_asked(r) for r in sorted(needed) if r[1].split("/")[0] not in rights.CLUSTER_SCOPED and r[1] != "leases"]
        for ns in served:
            for verb, resource in namespaced:
                assert _can(bed, account, verb, resource, ns), f"{mode}: cannot {verb} {resource} in {ns}"
            for verb, resource in NEVER:
                assert not _can(bed, account, verb, resource, ns), f"{mode}: may {verb} {resource} in {ns}"
        # Secrets: only an existence check, only in a watched namespace.
        assert _can(bed, account, "get", "secrets", watched) is (mode == "namespaced")
        assert not _can(bed, account, "get", "secrets", OTHER_NS)
        if mode == "namespaced":
            assert not _can(bed, account, "create", "pods", OTHER_NS), "a namespaced operator acts outside its namespace"
            assert not _can(bed, account, "list", "llmtrainjobs.llmtrain.io", OTHER_NS)
        for verb, resource in (_asked(r) for r in sorted(needed) if r[1] in rights.CLUSTER_SCOPED):
            assert _can(bed, account, verb, resource, None), f"{mode}: cannot {verb} {resource}"
        for verb, resource in NEVER_CLUSTER:
            assert not _can(bed, account, verb, resource, None), f"{mode}: may {verb} {resource} cluster-wide"
        # Leader election: create Leases, and read/update only the operator's own.
        assert _can(bed, account, "create", "leases.coordination.k8s.io", NS)
        assert _can(bed, account, "update", "leases.coordination.k8s.io/llmtrain-operator", NS)
        assert not _can(bed, account, "update", "leases.coordination.k8s.io/someone-elses", NS)
    finally:
        bed.kubectl("delete", "-f", "-", "--wait=false", input=manifest, check=False)


def test_the_operator_pod_passes_pod_security_restricted(local_cluster):
    """The real API server's PodSecurity admission, enforcing "restricted" on a namespace,
    judges a Pod made of the Deployment's template; the same Pod without its security
    settings is refused there, so the check is not vacuous."""
    bed = local_cluster
    ns = "chart-restricted"
    bed.kubectl("create", "namespace", ns, check=False)
    bed.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted", "--overwrite")
    template = next(d for d in render(bed) if d["kind"] == "Deployment")["spec"]["template"]
    spec = {**template["spec"], "serviceAccountName": "default"}  # the chart's account lives elsewhere

    def dry_run(pod_spec: dict) -> subprocess.CompletedProcess:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator-pss", "namespace": ns}, "spec": pod_spec}
        return bed.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)

    wait_for(lambda: bed.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0, 30,
             what="the namespace's default ServiceAccount")
    allowed = dry_run(spec)
    assert allowed.returncode == 0, allowed.stderr
    bare = {**spec, "securityContext": {}, "containers": [{**c, "securityContext": {}} for c in spec["containers"]]}
    refused = dry_run(bare)
    assert refused.returncode != 0 and "restricted" in refused.stderr, refused.stderr


def test_the_monitoring_objects_carry_the_checked_files_and_scrape_ports_the_worker_pods_have(local_cluster):
    from llmtrain_operator.api import parse_job
    from llmtrain_operator.planner.manifests import worker_pod
    from support.specs import load_job

    files = ROOT / "charts" / "llmtrain-operator" / "files"
    docs = render(local_cluster, "metrics.podMonitor.enabled=true", "metrics.prometheusRule.enabled=true", "metrics.dashboard.enabled=true",
                  "networkPolicy.metricsFrom={monitoring}")
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((files / "alerts.yaml").read_text())
    board = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert json.loads(board["data"]["llmtrain-jobs.json"]) == json.loads((files / "dashboard.json").read_text())
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    scraped = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    pod = worker_pod(parse_job(load_job()), 0, 0)
    assert scraped <= {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert not any(d["kind"] in ("PodMonitor", "PrometheusRule") for d in render(local_cluster)), "off by default"


def test_the_chart_renders_the_generated_crd_with_the_release_labels_behind_install_and_keep(local_cluster):
    committed = yaml.safe_load(CRD.read_text())
    [crd] = [d for d in render(local_cluster) if d["kind"] == "CustomResourceDefinition"]
    assert crd["spec"] == committed["spec"], "the chart's CRD is the generated one"
    assert crd["metadata"]["name"] == committed["metadata"]["name"]
    labels = crd["metadata"]["labels"]
    assert committed["metadata"]["labels"].items() <= labels.items() and labels["app.kubernetes.io/instance"] == "llmtrain"
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}, "kept by default: deleting it deletes every job"
    [loose] = [d for d in render(local_cluster, "crds.keep=false") if d["kind"] == "CustomResourceDefinition"]
    assert "annotations" not in loose["metadata"]
    assert not [d for d in render(local_cluster, "crds.install=false") if d["kind"] == "CustomResourceDefinition"]


HELM_OWNER_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/name",
                     "app.kubernetes.io/version", "helm.sh/chart")
HELM_OWNER_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace", "helm.sh/resource-policy")


def test_install_adopts_the_crd_upgrade_changes_it_and_uninstall_keeps_it(local_cluster, tmp_path):
    """The documented path (docs/install.md): a CRD applied before (by kubectl, or by a
    chart that had it in crds/) is handed to the release with Helm's ownership label and
    annotations; helm install; helm upgrade with a chart whose CRD changed applies the
    change, no manual step; helm uninstall removes every object of the release and keeps
    the CRD (and with it the jobs)."""
    bed = local_cluster
    ns, jobs = "chart-life", "chart-life-jobs"
    for name in (ns, jobs):
        bed.kubectl("create", "namespace", name, check=False)
    committed = yaml.safe_load(CRD.read_text())
    name = committed["metadata"]["name"]
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    base = ("--namespace", ns, "--wait", "--timeout", "180s")
    node = ("--set", "nodeSelector.llmtrain\\.io/pool=system")
    try:
        refused = bed.helm("install", "life", CHART, *base, "--set", f"watchNamespace={jobs}", "--set", "replicaCount=1", *node,
                           check=False)
        assert refused.returncode != 0 and "CustomResourceDefinition" in refused.stderr and "ownership" in refused.stderr, \
            refused.stderr
        bed.helm("uninstall", "life", "--namespace", ns, check=False)
        bed.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")
        bed.kubectl("annotate", "--overwrite", "crd", name, "meta.helm.sh/release-name=life", f"meta.helm.sh/release-namespace={ns}")
        bed.helm("install", "life", CHART, *base, "--set", f"watchNamespace={jobs}", "--set", "replicaCount=1", *node)
        release = "app.kubernetes.io/instance=life"
        assert bed.get("deployment", "life", "-n", ns)["status"].get("readyReplicas") == 1
        served = bed.get("crd", name)
        assert served["metadata"]["labels"]["app.kubernetes.io/instance"] == "life"
        assert served["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        key = bed.get("secret", "life-token-key", "-n", ns)["data"]["key"]
        assert len(base64.b64decode(key)) == 64, "the key of the jobs' tokens, made at install"

        newer = tmp_path / "chart"
        shutil.copytree(CHART, newer)
        template = newer / CRD_TEMPLATE
        text = template.read_text()
        categories = "    categories:\n    - llmtrain\n"
        assert categories in text
        template.write_text(text.replace(categories, categories + "    - llmtrain-upgrade-check\n"))
        bed.helm("upgrade", "life", str(newer), *base, "--reuse-values", "--set", "operator.resyncSeconds=7")
        assert bed.get("crd", name)["spec"]["names"]["categories"] == ["llmtrain", "llmtrain-upgrade-check"], "helm upgrade upgraded it"
        env = {e["name"]: e.get("value")
               for e in bed.get("deployment", "life", "-n", ns)["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["LLMTRAIN_OPERATOR_RESYNC_SECONDS"] == "7" and env["LLMTRAIN_OPERATOR_NAMESPACE"] == jobs
        assert bed.get("secret", "life-token-key", "-n", ns)["data"]["key"] == key, \
            "helm upgrade keeps the key (lookup): a job's token Secret made again holds the token its pods hold"

        bed.helm("uninstall", "life", "--namespace", ns, "--wait", "--timeout", "120s")
        kinds = "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets,configmaps,secrets"
        wait_for(lambda: not bed.get(kinds, "-A", "-l", release)["items"], 120, what="the release's objects gone")
        assert not bed.get("clusterroles,clusterrolebindings", "-l", release)["items"]
        assert bed.kubectl("get", "crd", name, check=False).returncode == 0, "the CRD is kept"
    finally:
        bed.helm("uninstall", "life", "--namespace", ns, check=False)
        # Back to the CRD as kubectl applies it, which the rest of the suite expects.
        bed.kubectl("label", "crd", name, *(f"{key}-" for key in HELM_OWNER_LABELS), check=False)
        bed.kubectl("annotate", "crd", name, *(f"{key}-" for key in HELM_OWNER_ANNOTATIONS), check=False)
        bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
