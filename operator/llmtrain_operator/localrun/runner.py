"""``llmtrain run``: the operator's control loop against local processes.

Every second: observe the local "cluster", ask the same pure planner the operator uses
for a plan, apply it, and report. Failures are detected, classified, counted and
recovered exactly as in Kubernetes; only the I/O differs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, UTC
from pathlib import Path
from typing import Any
from collections.abc import Callable

from ..api.job import LLMTrainJob
from ..api.observed import ROLE_WORKER
from ..api.vocabulary import TERMINAL_PHASES, Phase, Reason
from ..planner import Event, plan
from ..planner.podpolicy import ANYTHING
from .cluster import LocalCluster

TERMINAL = (*TERMINAL_PHASES, Phase.INVALID)
"""A local run ends here: there is nobody to fix an invalid spec."""


@dataclass
class NodeKill:
    """Fault injection: SIGKILL (or, ``freeze``, SIGSTOP) every process of a slot's "node"
    once ``step`` is reached."""

    slot: int
    step: int
    fired: bool = False
    freeze: bool = False

    @classmethod
    def parse(cls, text: str, freeze: bool = False) -> NodeKill:
        slot, _, step = text.partition("@")
        return cls(int(slot), int(step.removeprefix("step=")), freeze=freeze)


@dataclass
class LocalRun:
    raw: dict[str, Any]
    job: LLMTrainJob
    cluster: LocalCluster
    kills: list[NodeKill] = field(default_factory=list)
    on_event: Callable[[float, Event], None] = lambda t, e: None
    on_status: Callable[[dict[str, Any]], None] = lambda s: None
    interval: float = 1.0
    events: list[tuple[float, int, Event]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    """The newest status the planner wrote (what an interrupted run reports)."""

    def run(self, timeout: float | None = None) -> dict[str, Any]:
        started = time.monotonic()
        status: dict[str, Any] = {}
        try:
            while True:
                observed = self.cluster.observe()
                result = plan({**self.raw, "status": status}, observed, datetime.now(UTC), pod_policy=ANYTHING)
                status = self.status = result.status
                self.cluster.apply(result.actions)
                for event in result.events:
                    self.events.append((time.time(), status.get("step", 0), event))
                    self.on_event(time.time(), event)
                self.on_status(status)
                self._persist(status)
                self._inject(status)
                if status.get("phase") in TERMINAL and not any(p.proc.poll() is None for p in self.cluster.pods.values()
                                                               if p.role == ROLE_WORKER):
                    return status
                if timeout is not None and time.monotonic() - started > timeout:
                    status["phase"] = Phase.FAILED
                    self.on_event(time.time(), Event("Warning", Reason.LOCAL_TIMEOUT, f"no result within {timeout:.0f}s"))
                    return status
                time.sleep(self.interval)
        finally:
            self.cluster.shutdown()

    def _inject(self, status: dict[str, Any]) -> None:
        for kill in self.kills:
            if not kill.fired and status.get("step", 0) >= kill.step:
                pod = self.cluster.kill_node(kill.slot, freeze=kill.freeze)
                if pod is not None:
                    kill.fired = True
                    what, reason = ("froze", Reason.INJECTED_NODE_FREEZE) if kill.freeze else ("killed", Reason.INJECTED_NODE_LOSS)
                    event = Event("Warning", reason, f"fault injection: {what} every process of node local-{kill.slot} ({pod}) "
                                                     f"at step {status.get('step')}")
                    self.events.append((time.time(), status.get("step", 0), event))
                    self.on_event(time.time(), event)

    def _persist(self, status: dict[str, Any]) -> None:
        (self.cluster.workdir / "status.json").write_text(json.dumps(status, indent=1))

    def steps(self) -> list[dict[str, Any]]:
        """Every step record any node's rank 0 wrote, in time order."""
        records = []
        for path in self.cluster.workdir.glob("node-*/run/steps.jsonl"):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(records, key=lambda r: r["time"])


def write_events(path: Path, events: list[tuple[float, int, Event]]) -> None:
    with path.open("w") as fh:
        for when, step, event in events:
            fh.write(json.dumps({"time": when, "step": step, "type": event.type, "reason": event.reason, "message": event.message}) + "\n")
