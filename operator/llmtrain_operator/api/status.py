"""``LLMTrainJob.status``: what the operator observed and decided.

State lives here, not in operator memory, so that an operator restart (or a failover
between HA replicas) never disturbs a running job.
"""

from __future__ import annotations

from typing import Literal

from llmtrain_trainer.config import CamelModel
from pydantic import Field

Phase = Literal[
    "Pending", "Created", "Running", "Restarting", "Degraded", "Suspended", "Succeeded", "Failed", "Invalid"
]
"""Lifecycle phase, shown in ``kubectl get ltj``. Succeeded/Failed are terminal; Invalid
is left when the spec is fixed."""

ConditionType = Literal[
    "Created", "Running", "Restarting", "Degraded", "Suspended", "Succeeded", "Failed", "Invalid"
]

CONDITION_TYPES: tuple[str, ...] = ConditionType.__args__  # type: ignore[attr-defined]


class Condition(CamelModel):
    """A Kubernetes-style condition (``kubectl wait --for=condition=Succeeded``)."""

    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    """CamelCase machine-readable reason, e.g. ``PodFailed`` or ``BackoffLimitExceeded``."""
    message: str = Field("", max_length=32768)
    """Human-readable details."""
    last_transition_time: str
    """RFC 3339 time the status last changed."""
    observed_generation: int | None = None
    """``metadata.generation`` the condition was computed from."""


class WorkerCounts(CamelModel):
    desired: int = 0
    """Pods the operator wants (``replicas.max`` unless suspended)."""
    ready: int = 0
    """Pods running and Ready."""
    active: int = 0
    """Pods not yet terminal (pending or running)."""


class FailureRecord(CamelModel):
    """The most recent failure the operator acted on."""

    kind: Literal["ProcessCrash", "NodeFailure", "Eviction", "Hang", "Wedged", "Permanent", "Deadline"]
    reason: str
    """CamelCase reason, e.g. ``Signal9``, ``OOMKilled``, ``NodeNotReady``."""
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    message: str | None = None
    time: str
    """RFC 3339 time it was detected."""
    detect_seconds: float | None = None
    """From the failure itself (container exit, node NotReady) to its detection."""


class CheckpointRecord(CamelModel):
    """The newest committed checkpoint, as reported by the trainer's metrics."""

    step: int
    tier: Literal["local", "shared", "s3"]
    time: str | None = None
    summary: str = ""
    """``<step>@<tier>``, for the printer column."""


class QuarantinedNode(CamelModel):
    node: str
    until: str
    """RFC 3339 time after which the job may use the node again."""


class LLMTrainJobStatus(CamelModel):
    """Observed state of an LLMTrainJob."""

    phase: Phase = "Pending"
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    workers: str = "0/0"
    """``ready/desired`` pods, for the printer column."""
    replicas: WorkerCounts = Field(default_factory=WorkerCounts)
    world_size: int = 0
    """Ranks in the current rendezvous round (from the trainer's metrics)."""
    step: int = 0
    """Newest optimizer step reported by the trainer."""
    restarts: int = 0
    """Restarts counted against ``faultTolerance.maxRestarts``. Never reset."""
    disruptions: int = 0
    """Evictions and preemptions; they do not count against the budget."""
    restarts_by_reason: dict[str, int] = Field(default_factory=dict)
    """Restart counts per reason (``Signal9``, ``Hang``, ``NodeFailure`` ...)."""
    restart_generation: int = 0
    """Bumped by every ``RestartAll``; pods of an older generation are recreated."""
    last_failure: FailureRecord | None = None
    last_checkpoint: CheckpointRecord | None = None
    quarantined_nodes: list[QuarantinedNode] = Field(default_factory=list)
    start_time: str | None = None
    """When the job first ran (RFC 3339)."""
    completion_time: str | None = None
    """When it Succeeded or Failed (RFC 3339)."""
    last_progress_time: str | None = None
    """When ``step`` last advanced (RFC 3339); the wedge check measures from here."""
    next_restart_time: str | None = None
    """Backoff: replacements are not created before this time (RFC 3339)."""
    active_seconds: float = 0.0
    """Seconds spent not suspended, for ``activeDeadlineSeconds``."""
    goodput: float | None = None
    """Effective training time ratio so far: productive seconds / active seconds."""
    productive_seconds: float = 0.0
    """Seconds spent Running (training at or above ``replicas.min``)."""
    last_reconcile_time: str | None = None
    """When the operator last accounted time (RFC 3339)."""
    counted_failures: list[str] = Field(default_factory=list)
    """``pod@creationTimestamp`` of recent pod failures already counted, so that a retried
    pass never counts one twice (bounded)."""
    last_recovery_seconds: float | None = None
    """From the last detected failure to Running again."""
    not_ready_since: str | None = None
    """When the ready workers first dropped below ``replicas.min`` without a detected
    failure (RFC 3339); the phase leaves Running only after a short grace."""
    attempts_seen: dict[str, int] = Field(default_factory=dict)
    """``pod:<uid>/<cause>`` -> the failed attempts of that cause (``crash``, ``hang``) the
    pod's trainer last reported; each new one is charged once."""
