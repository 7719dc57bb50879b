"""Small helpers for tests against the local cluster."""

from __future__ import annotations

import json
import time
from typing import Any, Callable


def wait_for(predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.5, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout:.0f}s (last: {last!r})")


def apply(bed, manifest: str, namespace: str | None = None) -> None:
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    bed.kubectl(*args, input=manifest)


def pod(bed, name: str, namespace: str = "default") -> dict[str, Any]:
    out = bed.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def phase(bed, name: str, namespace: str = "default") -> str | None:
    return (pod(bed, name, namespace).get("status") or {}).get("phase")
