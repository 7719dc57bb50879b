"""The CRDs of the schedulers and queues the operator integrates with, from their pinned
modules (hack/cluster-tools/scheduler-crds.sh), installed on the test bed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.specs import ROOT
from support.waiting import wait_for


ALL = (("podgroups.scheduling.volcano.sh", "scheduling.volcano.sh_podgroups.yaml"),
       ("podgroups.scheduling.x-k8s.io", "scheduling.x-k8s.io_podgroups.yaml"),
       ("workloads.kueue.x-k8s.io", "kueue.x-k8s.io_workloads.yaml"),
       ("resourceflavors.kueue.x-k8s.io", "kueue.x-k8s.io_resourceflavors.yaml"))


def folder() -> Path:
    out = subprocess.run(["bash", str(ROOT / "hack" / "cluster-tools" / "scheduler-crds.sh")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return Path(out.stdout.strip().splitlines()[-1])


def _established(bed, crd: str) -> bool:
    out = bed.kubectl("get", "crd", crd, "-o", "jsonpath={.status.conditions[?(@.type=='Established')].status}", check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


def install(bed, crd: str, file: str) -> None:
    """Apply one CRD (server-side: Kueue's Workload CRD is too large for the last-applied
    annotation) and wait until it is served."""
    bed.kubectl("apply", "--server-side", "-f", str(folder() / file))
    wait_for(lambda: _established(bed, crd), 60, what=f"{crd} established")
