"""Small helpers for tests against the local cluster."""

from __future__ import annotations

import json
from typing import Any

from support.waiting import wait_for  # noqa: F401 - the cluster tests' poll


def apply(bed, manifest: str, namespace: str | None = None) -> None:
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    bed.kubectl(*args, input=manifest)


def pod(bed, name: str, namespace: str = "default") -> dict[str, Any]:
    out = bed.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def phase(bed, name: str, namespace: str = "default") -> str | None:
    return (pod(bed, name, namespace).get("status") or {}).get("phase")
