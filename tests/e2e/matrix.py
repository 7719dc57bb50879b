"""What every scenario of the end-to-end fault matrix checks once its job has ended
(tests/e2e/test_fault_matrix.py; docs/development.md lists the scenarios and where
each is tested).

- the job's outcome: its phase and final step, the terminal condition and its reason;
- restarts: the counts per reason in the status, and the same in the operator's
  ``llmtrain_operator_restarts_total{namespace,reason}`` as the real Prometheus
  scraped it (``check_counters``, used by the older scenario modules too);
- Events: the reasons the scenario must have produced;
- the restores: every "resumed from step N (T tier ...)" line the job's trainers
  logged, read from every pod that ran for the job (the local cluster keeps a deleted
  pod's container logs), so a scenario can check the tier and the steps it lost;
- pod churn: ``Churn`` follows the job's worker pods in the background and keeps the
  most that were alive at once.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from support.waiting import wait_for

from .jobs import events

RESUMED = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ \w+: resumed from step (\d+) \((\w+) tier")


@dataclass(frozen=True)
class Restore:
    pod_uid: str
    step: int
    tier: str
    at: float
    """Unix time of the log line (the trainer logs local time)."""


def restores(bed, namespace: str, job: str, since: float = 0.0) -> list[Restore]:
    """Every restore the job's trainers logged at or after ``since`` (Unix time), from
    every pod that ran for it. ``since`` leaves out the restores before the fault: a job
    whose second worker starts late grows from one worker to two, a restore too."""
    found = []
    for spec_file in (bed.state / "pods").glob("*/trainer.json"):
        try:
            env = json.loads(spec_file.read_text()).get("env") or {}
            if env.get("LLMTRAIN_JOB") != job or env.get("POD_NAMESPACE") != namespace:
                continue
            text = spec_file.with_suffix(".log").read_text(errors="replace")
        except (OSError, ValueError):
            continue
        for m in RESUMED.finditer(text):
            at = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
            if at >= since:
                found.append(Restore(spec_file.parent.name, int(m.group(3)), m.group(4), at))
    return found


def check_counters(prometheus, namespace: str, *, by_reason: dict[str, int], succeeded: int) -> None:
    """The operator's counters for the jobs of ``namespace`` as the real Prometheus scraped
    them: the restarts per reason and in all, and the jobs that succeeded. Each is waited
    for (a scrape every 2 s) and must then be exact: a count above is a failure too."""
    def exact(expr: str, wanted: float) -> None:
        got = prometheus.wait_value(expr, lambda v: v >= wanted, 60)
        assert got == wanted, (expr, got, wanted)

    for reason, count in by_reason.items():
        exact(f'sum(llmtrain_operator_restarts_total{{namespace="{namespace}",reason="{reason}"}})', count)
    if by_reason:
        exact(f'sum(llmtrain_operator_jobs_restarted_total{{namespace="{namespace}"}})', sum(by_reason.values()))
    exact(f'sum(llmtrain_operator_jobs_successful_total{{namespace="{namespace}"}})', succeeded)


@dataclass
class Churn:
    """Follows a job's worker pods through a ``kubectl --watch`` while the scenario runs:
    every pod uid seen, and the most that were alive (not finished, not being deleted)
    at once. One watch, not polling: several scenarios run side by side."""

    bed: Any
    namespace: str
    job: str
    most_alive: int = 0
    uids: set[str] = field(default_factory=set)
    _live: dict[str, bool] = field(default_factory=dict)
    _proc: Any = None

    def __enter__(self) -> Churn:
        self._proc = subprocess.Popen(
            [str(self.bed.bin / "kubectl"), "get", "pods", "-n", self.namespace,
             "-l", f"llmtrain.io/job={self.job},llmtrain.io/role=worker", "--watch", "--output-watch-events", "-o", "json"],
            env=self.bed.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)

    def _run(self) -> None:
        decoder, buffer = json.JSONDecoder(), ""
        for line in self._proc.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # the rest of the object is still to come
                buffer = buffer.lstrip()[end:]
                self._seen(event.get("type"), event.get("object") or {})

    def _seen(self, kind: str | None, pod: dict[str, Any]) -> None:
        uid = pod.get("metadata", {}).get("uid")
        if not uid:
            return
        self.uids.add(uid)
        alive = kind != "DELETED" and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") \
            and not pod["metadata"].get("deletionTimestamp")
        self._live[uid] = alive
        self.most_alive = max(self.most_alive, sum(self._live.values()))


def condition(done: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in done.get("conditions") or [] if c["type"] == kind), {})


EVENT_WAIT_SECONDS = 30
"""How long an Event may follow the status it explains."""


def check_outcome(bed, namespace: str, job: str, done: dict[str, Any], *, phase: str, step: int | None,
                  by_reason: dict[str, int], reasons: set[str]) -> None:
    assert done["phase"] == phase, json.dumps(done)[:3000]
    if step is not None:
        assert done["step"] == step, done["step"]
    assert condition(done, phase)["status"] == "True", done.get("conditions")
    assert done.get("restartsByReason", {}) == by_reason, done.get("restartsByReason")
    assert done.get("restarts", 0) == sum(by_reason.values())
    # The operator posts a pass's Events after its status patch, on a background thread
    # (handlers/reconcile.py): on a loaded machine `Completed` came after `Succeeded` was read.
    seen: set[str] = set()

    def arrived() -> bool:
        seen.update(events(bed, namespace, job))
        return reasons <= seen

    with contextlib.suppress(AssertionError):  # wait_for's timeout: the assertion below says what is missing
        wait_for(arrived, EVENT_WAIT_SECONDS, 1, "the Events")
    assert reasons <= seen, (reasons - seen, seen)
    # Kept progress is part of the productive time, never more.
    assert 0 <= done["ettr"] <= done["goodput"], (done.get("ettr"), done.get("goodput"), done.get("redoSeconds"))


