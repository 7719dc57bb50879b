"""Write ``operator/llmtrain_operator/api/k8s/core-v1.json``: the core types the job spec
embeds, as the test bed's kube-apiserver (the pinned Kubernetes) serves them.

    .venv/bin/python hack/k8s_openapi.py     # starts the local cluster if it is down

Run it after changing the pinned Kubernetes version; ``llmtrain crd --write`` then
regenerates the CRD. ``tests/cluster/test_core_schemas.py`` fails while the file differs
from what the bed's API server serves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "hack"), str(ROOT / "operator"), str(ROOT / "common")]

from llmtrain_operator.api import coretypes  # noqa: E402
from localcluster.cluster import LocalCluster  # noqa: E402


def render(openapi_text: str) -> str:
    return json.dumps(coretypes.trim(json.loads(openapi_text)), indent=1, sort_keys=True) + "\n"


def main() -> int:
    bed = LocalCluster.default().up()
    text = render(bed.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    coretypes.SCHEMAS.parent.mkdir(parents=True, exist_ok=True)
    coretypes.SCHEMAS.write_text(text)
    print(f"wrote {coretypes.SCHEMAS.relative_to(ROOT)} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
