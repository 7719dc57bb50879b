"""What every scenario of the end-to-end fault matrix checks once its job has ended
(tests/e2e/test_fault_matrix.py; docs/development.md lists the 15 scenarios and where
each is tested).

- the job's outcome: its phase and final step, the terminal condition and its reason;
- restarts: the counts per reason in the status, and the same in the operator's
  ``llmtrain_operator_restarts_total`` as the real Prometheus scraped it;
- Events: the reasons the scenario must have produced;
- the restores: every "resumed from step N (T tier ...)" line the job's trainers
  logged, read from every pod that ran for the job (the local cluster keeps a deleted
  pod's container logs), so a scenario can check the tier and the steps it lost;
- pod churn: ``Churn`` samples the job's worker pods in the background and keeps the
  most that were alive at once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jobs import events, pods, status

RESUMED = re.compile(r"resumed from step (\d+) \((\w+) tier")


@dataclass(frozen=True)
class Restore:
    pod_uid: str
    step: int
    tier: str


def restores(bed, namespace: str, job: str) -> list[Restore]:
    """Every restore the job's trainers logged, from every pod that ran for it."""
    found = []
    for spec_file in (bed.state / "pods").glob("*/trainer.json"):
        try:
            env = json.loads(spec_file.read_text()).get("env") or {}
            if env.get("LLMTRAIN_JOB") != job or env.get("POD_NAMESPACE") != namespace:
                continue
            text = spec_file.with_suffix(".log").read_text(errors="replace")
        except (OSError, ValueError):
            continue
        found += [Restore(spec_file.parent.name, int(m.group(1)), m.group(2)) for m in RESUMED.finditer(text)]
    return found


def restarts_metric(prometheus, reason: str) -> float:
    """``llmtrain_operator_restarts_total{reason}`` summed over the operator replicas (the
    counter lives in the replica that counted; a restarted replica starts from 0)."""
    return prometheus.query(f'sum(llmtrain_operator_restarts_total{{reason="{reason}"}})') or 0.0


@dataclass
class Churn:
    """Samples a job's worker pods every half second while the scenario runs."""

    bed: Any
    namespace: str
    job: str
    most_alive: int = 0
    uids: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "Churn":
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                live = [p for p in pods(self.bed, self.namespace, self.job)
                        if p["status"].get("phase") not in ("Succeeded", "Failed") and not p["metadata"].get("deletionTimestamp")]
                self.uids |= {p["metadata"]["uid"] for p in pods(self.bed, self.namespace, self.job)}
                self.most_alive = max(self.most_alive, len(live))
            except Exception:  # noqa: BLE001 - the API server may be restarting; sample again
                pass
            time.sleep(0.5)


def condition(done: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in done.get("conditions") or [] if c["type"] == kind), {})


def check_outcome(bed, namespace: str, job: str, done: dict[str, Any], *, phase: str, step: int | None,
                  by_reason: dict[str, int], reasons: set[str]) -> None:
    assert done["phase"] == phase, json.dumps(done)[:3000]
    if step is not None:
        assert done["step"] == step, done["step"]
    assert condition(done, phase)["status"] == "True", done.get("conditions")
    assert done.get("restartsByReason", {}) == by_reason, done.get("restartsByReason")
    assert done.get("restarts", 0) == sum(by_reason.values())
    seen = set(events(bed, namespace, job))
    assert reasons <= seen, (reasons - seen, seen)


def run_dir_of(bed, uid: str) -> Path:
    return bed.state / "pods" / uid / "volumes" / "run"


def final(bed, namespace: str, job: str) -> dict[str, Any]:
    return status(bed, namespace, job)
