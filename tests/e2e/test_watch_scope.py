"""The operator installed for one namespace: it reconciles jobs there, leaves every other
namespace alone, and holds namespaced rights only where it watches (a Role), plus
read-only access to Nodes (a ClusterRole).

Runs after the cluster-wide suites (file order) and puts the cluster-wide install back."""

from __future__ import annotations

import time

import pytest
from support.chart import install_operator

from .conftest import OPERATOR_NS, operator_values
from .jobs import create, job_manifest, pods, status, wait_status

pytestmark = pytest.mark.e2e

WATCHED, OTHER = "scope-watched", "scope-other"
SA = f"system:serviceaccount:{OPERATOR_NS}:llmtrain"


def install(bed, *sets: str) -> None:
    install_operator(bed, OPERATOR_NS, *operator_values(bed), *sets)
    bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=120s")


def can_i(bed, *args: str) -> bool:
    out = bed.kubectl("auth", "can-i", *args, f"--as={SA}", check=False)
    return out.stdout.strip() == "yes"


def test_a_namespaced_operator_serves_only_its_namespace_with_least_privilege(operator):
    bed = operator
    for ns in (WATCHED, OTHER):  # the Role lives in the watched one
        bed.kubectl("create", "namespace", ns, check=False)
    try:
        install(bed, f"watchNamespace={WATCHED}")
        assert can_i(bed, "create", "pods", "-n", WATCHED)
        assert can_i(bed, "patch", "llmtrainjobs.llmtrain.io/status", "-n", WATCHED)
        assert not can_i(bed, "create", "pods", "-n", OTHER)
        assert not can_i(bed, "list", "llmtrainjobs.llmtrain.io", "--all-namespaces")
        assert can_i(bed, "watch", "nodes")
        assert can_i(bed, "update", "leases.coordination.k8s.io/llmtrain-operator", "-n", OPERATOR_NS)
        assert not can_i(bed, "update", "leases.coordination.k8s.io/other", "-n", OPERATOR_NS)

        changes = {"spec.trainer.builtin.maxSteps": 100000}
        create(bed, OTHER, job_manifest("ignored", changes))
        ignored_since = time.monotonic()
        create(bed, WATCHED, job_manifest("served", changes))
        wait_status(bed, WATCHED, "served", lambda s: s.get("phase") == "Running", 300, "the watched namespace's job running")
        assert len(pods(bed, WATCHED, "served")) == 2
        # Two resync periods since the other job was created: it would have been reconciled by now.
        time.sleep(max(0.0, 10 - (time.monotonic() - ignored_since)))
        assert status(bed, OTHER, "ignored") == {}
        assert pods(bed, OTHER, "ignored") == []
    finally:
        # Jobs go first, while only the namespaced operator runs: a cluster-wide one would
        # start the ignored job's pods.
        for ns in (WATCHED, OTHER):
            bed.kubectl("delete", "ltj", "--all", "-n", ns, "--timeout=120s", check=False)
            bed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        install(bed, "watchNamespace=")
