"""The operator installed from the chart, as the e2e suites and benchmarks install it.

The bed's API server may already have the CRD, applied with kubectl by an earlier test
(tests/cluster/): Helm refuses to adopt an object it did not create, so the harness
applies the CRD itself, server-side as a user would, and installs the chart with
``crds.install=false``. tests/cluster/test_chart.py covers the chart's own CRD."""

from __future__ import annotations

from typing import Any

from .specs import ROOT
from .waiting import wait_for

CHART = ROOT / "charts" / "llmtrain-operator"
CRD = ROOT / "crds" / "llmtrain.io_llmtrainjobs.yaml"


def apply_crd(bed: Any) -> None:
    """The committed CRD applied server-side, once the API server serves the kind: right
    after a first apply a create can still be answered 404 for a moment."""
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    # Polled rather than `kubectl wait`, which fails outright while the new CRD has no
    # status.conditions yet.
    established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
    wait_for(lambda: bed.kubectl("get", "crd", "llmtrainjobs.llmtrain.io", "-o", established, check=False).stdout == "True",
             60, 0.2, "the CRD established")
    wait_for(lambda: bed.kubectl("get", "llmtrainjobs.llmtrain.io", "-A", check=False).returncode == 0, 60, 0.2,
             "the LLMTrainJob kind served")


def install_operator(bed: Any, namespace: str, *sets: str, release: str = "llmtrain") -> None:
    """``helm upgrade --install`` of the chart into ``namespace`` (created if missing),
    waiting for it; ``sets`` are ``--set`` values."""
    apply_crd(bed)
    bed.helm("upgrade", "--install", release, str(CHART), "--namespace", namespace, "--create-namespace", "--wait",
             "--timeout", "180s", "--set", "crds.install=false", *(a for s in sets for a in ("--set", s)))
