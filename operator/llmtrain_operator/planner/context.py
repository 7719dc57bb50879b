"""The state of one planning pass: inputs, the status being built, and the output.

Each concern (lifecycle, failures, scaling, status) is a function over this context;
``plan.py`` calls them top to bottom. Nothing here performs I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..api.job import LLMTrainJob
from ..api.observed import Observed, format_time
from ..api.status import LLMTrainJobStatus
from .conditions import set_condition


@dataclass(frozen=True)
class CreateObject:
    manifest: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]


@dataclass(frozen=True)
class ReplaceObject:
    """Overwrite an object the operator owns (the rendered config)."""

    manifest: dict[str, Any]


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace_seconds: int | None = None
    """None: the pod's own grace period. 0 with ``force``: for pods on a dead node."""
    force: bool = False


@dataclass(frozen=True)
class DeleteJob:
    reason: str


@dataclass(frozen=True)
class Event:
    type: str
    """Normal | Warning."""
    reason: str
    message: str


Action = CreateObject | ReplaceObject | DeletePod | DeleteJob


@dataclass
class Plan:
    actions: list[Action]
    events: list[Event]
    status: dict[str, Any]
    """The whole new status, wire form; written in one patch."""
    requeue_after: float | None
    """Seconds until the next pass is needed even if nothing changes (timers)."""
    decisions: list[str] = field(default_factory=list)
    """What was decided and why, beyond the Events (charges, quarantines), for the log."""


@dataclass
class Pass:
    job: LLMTrainJob
    observed: Observed
    now: datetime
    status: LLMTrainJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    timers: list[float] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)

    @property
    def spec(self):
        return self.job.spec

    @property
    def stamp(self) -> str:
        return format_time(self.now)

    @property
    def generation(self) -> int | None:
        return self.job.metadata.generation

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def condition(self, type_: str, status: bool, reason: str, message: str = "") -> bool:
        return set_condition(self.status.conditions, type_, status, reason, message, self.stamp, self.generation)

    def decide(self, what: str) -> None:
        self.decisions.append(what)

    def after(self, seconds: float) -> None:
        """Ask for another pass in ``seconds`` (clamped to at least a second)."""
        self.timers.append(max(1.0, seconds))

    def seconds_since(self, stamp: str | None) -> float | None:
        from ..api.observed import parse_time  # noqa: PLC0415

        then = parse_time(stamp)
        return None if then is None else (self.now - then).total_seconds()

    def at(self, seconds_from_now: float) -> str:
        return format_time(self.now + timedelta(seconds=seconds_from_now))
