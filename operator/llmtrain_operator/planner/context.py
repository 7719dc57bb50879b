"""The state of one planning pass: inputs, the status being built, and the output.

Each policy (``policies/``) is a function over this context returning a ``Verdict`` (or,
for the queue and the gang, the value later policies act on); ``plan.py`` calls them top
to bottom. Nothing here performs I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..api.job import LLMTrainJob
from ..api.observed import Observed, format_time, format_time_ms, parse_time
from ..api.spec import LLMTrainJobSpec
from ..api.status import LLMTrainJobStatus
from ..api.vocabulary import ConditionType
from ..settings import DEFAULT_RUNTIME_IMAGE
from .conditions import set_condition
from .decisions import Decision, Event, Noted
from .isolation import Isolation
from .podpolicy import PodPolicy
from .tokens import JobToken, job_token


@dataclass(frozen=True)
class CreateObject:
    manifest: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


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
class KeepPod:
    """Keep an ended worker pod for its log instead of deleting it: label it
    ``llmtrain.io/kept`` and take it out of its gang, so that no policy acts on it again
    and its slot takes a new pod (``policies/kept.py`` deletes the oldest beyond
    ``faultTolerance.keepFailedPods``)."""

    name: str
    uid: str = ""
    """The uid read this pass: another pod of that name is refused (a precondition)."""


@dataclass(frozen=True)
class UpdateSpec:
    """Merge the manifest's ``spec`` into an object the operator owns (a PodGroup whose
    ``minMember`` changed with the job's spec); fields others added stay."""

    manifest: dict[str, Any]


@dataclass(frozen=True)
class DeleteObject:
    """Delete a child the operator owns that is not a pod (a PodGroup)."""

    api_version: str
    kind: str
    name: str
    uid: str = ""
    """The uid read this pass: the delete is refused if the object of that name is
    another by then (a precondition), so nothing but this job's own is deleted."""


@dataclass(frozen=True)
class PatchStatus:
    """Merge ``status`` into a custom object's status subresource, only if it is still at
    ``resource_version`` (a Kueue Workload whose quota the job gives back)."""

    api_version: str
    kind: str
    name: str
    status: dict[str, Any]
    resource_version: str


@dataclass(frozen=True)
class SetSuspend:
    """Write the job's own ``spec.suspend``, as Kueue's integrations do for the jobs they
    admit and evict."""

    suspend: bool


@dataclass(frozen=True)
class DeleteJob:
    reason: str


Action = CreateObject | ReplaceObject | UpdateSpec | PatchStatus | SetSuspend | DeletePod | KeepPod | DeleteObject | DeleteJob


class Verdict(enum.Enum):
    """What a policy's outcome means for the rest of the pass."""

    CONTINUE = "continue"
    """Nothing final happened: the next policies run."""
    FINISHED = "finished"
    """The job is in a terminal phase (it was already, or reached it now: success, a
    permanent failure, the restart budget or the deadline exhausted)."""
    SUSPENDED = "suspended"
    """``spec.suspend``: the pods go, nothing else is planned."""
    BLOCKED = "blocked"
    """Waiting on something outside the job (a missing Secret or PVC)."""


@dataclass
class Plan:
    actions: list[Action]
    decisions: list[Decision]
    """Everything decided, typed; Events and metrics derive from these."""
    status: dict[str, Any]
    """The whole new status, wire form; written in one patch."""
    requeue_after: float | None
    """Seconds until the next pass is needed even if nothing changes (timers)."""
    urgent_after: float | None = None
    """Seconds until a deadline that acts on a failure (a node's grace, a replacement's
    backoff): the pass it starts goes ahead of routine ones, as a watch event's does."""

    @property
    def events(self) -> list[Event]:
        return [e for e in (d.event() for d in self.decisions) if e is not None]


@dataclass(kw_only=True)
class Ledger:
    """What a pass writes: the status being built, the actions, the decisions and the
    timers. A job whose spec does not parse gets only this (it has no typed job)."""

    now: datetime
    status: LLMTrainJobStatus
    actions: list[Action] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    timers: list[float] = field(default_factory=list)
    urgent_timers: list[float] = field(default_factory=list)

    @property
    def stamp(self) -> str:
        return format_time(self.now)

    def decide(self, decision: Decision) -> None:
        self.decisions.append(decision)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        """A decision recorded by its Event alone."""
        self.decide(Noted(reason, message, warning))

    def after(self, seconds: float, floor: float = 1.0, urgent: bool = False) -> None:
        """Ask for another pass in ``seconds`` (clamped to at least ``floor``: a second,
        unless the deadline is one that only comes closer, as a backoff's). ``urgent``: a
        deadline that acts on a failure (``Plan.urgent_after``)."""
        self.timers.append(max(floor, seconds))
        if urgent:
            self.urgent_timers.append(max(floor, seconds))

    def seconds_since(self, stamp: str | None) -> float | None:
        then = parse_time(stamp)
        return None if then is None else (self.now - then).total_seconds()

    def at(self, seconds_from_now: float, ms: bool = False) -> str:
        """The RFC 3339 time ``seconds_from_now``: to the second, or (``ms``) the millisecond."""
        return (format_time_ms if ms else format_time)(self.now + timedelta(seconds=seconds_from_now))


@dataclass(kw_only=True)
class Pass(Ledger):
    """A pass over a job whose spec parsed: its inputs beside the ledger."""

    job: LLMTrainJob
    observed: Observed
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    """Where a user script's pods copy the launcher from (``manifests.runtime_bundle``)."""
    pod_policy: PodPolicy = field(default_factory=PodPolicy)
    """What the job's ``podTemplate`` may ask of its pods (``podpolicy.py``)."""
    node_failure_conditions: frozenset[str] = frozenset()
    """Node condition types that, True, mean the node is failing (``policies/node_health.py``)."""
    isolation: Isolation | None = None
    """The peers of the job's NetworkPolicy (``isolation.py``); None: the operator makes none."""
    token_key: bytes | None = None
    """The operator's key for the jobs' tokens (``tokens.py``); None: no token (``llmtrain
    run`` makes its own; a planner test of something else)."""

    def job_token(self) -> JobToken | None:
        """This job's token, or None when the pass makes none (no key, or a job without a
        uid: one not read from an API server)."""
        if self.token_key is None or not self.job.metadata.uid:
            return None
        return job_token(self.token_key, self.job.metadata.name, self.job.metadata.uid)

    @property
    def spec(self) -> LLMTrainJobSpec:
        return self.job.spec

    @property
    def generation(self) -> int | None:
        return self.job.metadata.generation

    def condition(self, type_: ConditionType, status: bool, reason: str, message: str = "") -> bool:
        return set_condition(self.status.conditions, type_, status, reason, message, self.stamp, self.generation)
