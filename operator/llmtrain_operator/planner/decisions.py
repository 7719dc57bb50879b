"""What a pass decided, as typed records: they become the Events, the decision log and
the operator's metrics, so all three tell the same story (two failures decided in one
pass are two Events, two log lines and two counts).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.vocabulary import Phase, Reason


@dataclass(frozen=True)
class Event:
    type: str
    """Normal | Warning."""
    reason: str
    message: str


class Decision:
    """Base of every decision: an Event (or none) and a line for the log."""

    def event(self) -> Event | None:
        return None


@dataclass(frozen=True)
class Noted(Decision):
    """A decision whose whole record is its Event (children created, a config
    re-rendered, a pod scaled down ...)."""

    reason: str
    message: str
    warning: bool = False

    def event(self) -> Event:
        return Event("Warning" if self.warning else "Normal", self.reason, self.message)

    def __str__(self) -> str:
        return f"{'Warning' if self.warning else 'Normal'} {self.reason}: {self.message}"


@dataclass(frozen=True)
class JobStarted(Decision):
    """The job's first pass (``status.startTime`` set)."""

    def __str__(self) -> str:
        return "job started"


@dataclass(frozen=True)
class FailureRecorded(Decision):
    kind: str
    reason: str
    pod: str | None
    node: str | None
    exit_code: int | None
    detect_seconds: float | None
    """From the failure itself (container exit, node NotReady) to this pass."""

    def __str__(self) -> str:
        return (f"failure recorded: {self.kind}/{self.reason} pod={self.pod or '-'} node={self.node or '-'} "
                f"exit={self.exit_code} detected after {self.detect_seconds}s")


@dataclass(frozen=True)
class RestartCharged(Decision):
    reason: str
    restarts: int
    budget: int

    def __str__(self) -> str:
        return f"restart charged ({self.reason}): {self.restarts} of faultTolerance.maxRestarts={self.budget}"


@dataclass(frozen=True)
class DisruptionCounted(Decision):
    pod: str
    reason: str

    def __str__(self) -> str:
        return f"disruption counted ({self.reason}): {self.pod}, not charged to the budget"


@dataclass(frozen=True)
class NodeQuarantined(Decision):
    node: str
    until: str

    def __str__(self) -> str:
        return f"node {self.node} quarantined for this job until {self.until}"


@dataclass(frozen=True)
class RecoveryMeasured(Decision):
    seconds: float
    """From the failure's detection to the first training step finished after it."""

    def __str__(self) -> str:
        return f"recovered: first new training step {self.seconds}s after the failure was detected"


@dataclass(frozen=True)
class PhaseChanged(Decision):
    old: str
    new: str
    message: str

    def event(self) -> Event:
        return Event("Warning" if self.new == Phase.RESTARTING else "Normal", self.new, f"{self.old} -> {self.new}: {self.message}")

    def __str__(self) -> str:
        return f"phase {self.old} -> {self.new}: {self.message}"


@dataclass(frozen=True)
class JobFinished(Decision):
    succeeded: bool
    reason: str
    message: str

    def event(self) -> Event:
        return Event("Normal" if self.succeeded else "Warning", self.reason, self.message)

    def __str__(self) -> str:
        return f"job {'succeeded' if self.succeeded else 'failed'} ({self.reason}): {self.message}"


@dataclass(frozen=True)
class TierDegraded(Decision):
    tier: str
    reason: str
    message: str

    def event(self) -> Event:
        return Event("Warning", Reason.CHECKPOINT_TIER_DEGRADED, self.message)

    def __str__(self) -> str:
        return f"checkpoint tier {self.tier} degraded ({self.reason}): {self.message}"


@dataclass(frozen=True)
class TierRecovered(Decision):
    tier: str
    step: int | None

    def event(self) -> Event:
        at = f"; newest step there {self.step}" if self.step is not None else ""
        return Event("Normal", Reason.CHECKPOINT_TIER_RECOVERED, f"{self.tier} tier works again{at}")

    def __str__(self) -> str:
        return f"checkpoint tier {self.tier} recovered"


@dataclass(frozen=True)
class IntervalChanged(Decision):
    old: int | None
    new: int
    detail: str

    def event(self) -> Event:
        return Event("Normal", Reason.CHECKPOINT_INTERVAL_CHANGED, f"checkpoint interval {self.old} -> {self.new} steps{self.detail}")

    def __str__(self) -> str:
        return f"checkpoint interval {self.old} -> {self.new}{self.detail}"


@dataclass(frozen=True)
class CadenceShared(Decision):
    """The failure history in the job's ConfigMap was updated (logged, no Event)."""

    failures: int

    def __str__(self) -> str:
        return f"failure history for the adaptive checkpoint interval shared with the trainers: {self.failures} failures"
