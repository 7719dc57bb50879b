"""The operator installed from the chart, as the e2e suites and benchmarks install it.

The bed's API server may already have the CRD, applied with kubectl by an earlier test
(tests/cluster/): Helm refuses to adopt an object it did not create, so the harness
applies the CRD itself, server-side as a user would, and installs the chart with
``crds.install=false``. tests/cluster/test_chart.py covers the chart's own CRD."""

from __future__ import annotations

from typing import Any

from .specs import ROOT

CHART = ROOT / "charts" / "llmtrain-operator"
CRD = ROOT / "crds" / "llmtrain.io_llmtrainjobs.yaml"


def install_operator(bed: Any, namespace: str, *sets: str, release: str = "llmtrain") -> None:
    """``helm upgrade --install`` of the chart into ``namespace`` (created if missing),
    waiting for it; ``sets`` are ``--set`` values."""
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    bed.helm("upgrade", "--install", release, str(CHART), "--namespace", namespace, "--create-namespace", "--wait",
             "--timeout", "180s", "--set", "crds.install=false", *(a for s in sets for a in ("--set", s)))
