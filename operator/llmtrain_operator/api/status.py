"""``LLMTrainJob.status``: what the operator observed and decided.

State lives here, not in operator memory, so that an operator restart (or a failover
between HA replicas) never disturbs a running job.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from llmtrain_contract.base import CamelModel
from pydantic import ConfigDict, Field, ValidationError

from .spec import MAX_NODES
from .vocabulary import ConditionType, FailureKind, Phase

CONDITION_TYPES: tuple[str, ...] = tuple(ConditionType)

Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"})]
"""An RFC 3339 time, as the API server checks it (``format: date-time`` in the CRD)."""

TierName = Literal["local", "shared", "s3"]
"""The checkpoint tiers a job can configure (``spec.checkpoint``), by the name the trainers report."""


class Condition(CamelModel):
    """A Kubernetes-style condition (``kubectl wait --for=condition=Succeeded``)."""

    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=MAX_NODES)
    """CamelCase machine-readable reason, e.g. ``PodFailed`` or ``BackoffLimitExceeded``."""
    message: str = Field("", max_length=32768)
    """Human-readable details."""
    last_transition_time: Timestamp
    """RFC 3339 time the status last changed."""
    observed_generation: int | None = None
    """``metadata.generation`` the condition was computed from."""


class RankZero(CamelModel):
    pod: str
    container: str = "trainer"


class RankHolder(CamelModel):
    """A worker pod and the global ranks it runs now (``procsPerNode`` of them)."""

    pod: str
    first: int = Field(ge=0)
    """Its local rank 0's global rank, from its metrics page."""
    last: int = Field(ge=0)


class WorkerCounts(CamelModel):
    desired: int = 0
    """Pods the operator wants (``replicas.max`` unless suspended)."""
    ready: int = 0
    """Pods running and Ready."""
    active: int = 0
    """Pods not yet terminal (pending or running)."""


class FailureRecord(CamelModel):
    """The most recent failure the operator acted on."""

    kind: FailureKind
    reason: str
    """CamelCase reason, e.g. ``Signal9``, ``OOMKilled``, ``NodeNotReady``."""
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    message: str | None = None
    time: Timestamp
    """RFC 3339 time it was detected."""
    detect_seconds: float | None = None
    """From the failure itself (container exit, node NotReady) to its detection."""


class CheckpointRecord(CamelModel):
    """The newest committed checkpoint, as reported by the trainer's metrics."""

    step: int
    tier: TierName
    time: Timestamp | None = None
    summary: str = ""
    """``<step>@<tier>``, for the printer column."""


class TierHealth(CamelModel):
    """One checkpoint tier, as the trainers report it."""

    name: TierName
    healthy: bool = True
    reason: str | None = None
    """Why it is degraded: ``NoSpace``, ``PermissionDenied``, ``ReadOnly``, ``IOError``,
    ``Unreachable``, ``CredentialsRefused``, ``NoCredentials``, ``NoSuchBucket``,
    ``ServerError``, ``Throttled``, ``Timeout``, ``Corrupt`` or ``Error``."""
    message: str | None = None
    pods: list[str] = Field(default_factory=list)
    """The workers that report it degraded (a node-local tier fails on some nodes only),
    the first 32 by name; the message counts the rest."""
    since: Timestamp | None = None
    """When it was first seen degraded (RFC 3339)."""
    last_step: int | None = None
    """The newest step committed in it."""


class CadenceHistory(CamelModel):
    """The job's failure history as given to the trainers (``cadence.json`` in the job's
    ConfigMap): rewritten when the count of failures changes."""

    failures: int = 0
    """Restarts plus disruptions: every failure that cost the job work."""
    active_seconds: float = 0.0
    """``status.activeSeconds`` when the count last changed; the trainer adds the time
    since ``time``."""
    time: float = 0.0
    """Unix time it was recorded."""


class CheckpointCadence(CamelModel):
    """The checkpoint interval in force, and (``intervalSteps: auto``) its inputs."""

    mode: Literal["fixed", "auto"] = "fixed"
    interval_steps: int | None = None
    """As the trainers report it."""
    cost_seconds: float | None = None
    """Measured cost of one checkpoint to the training: its stall plus its background
    write's interference with the steps it overlaps."""
    latency_seconds: float | None = None
    """Measured latency of one checkpoint's write, snapshot to tier-1 commit: not a cost
    (it does not move the optimum), but the interval is at least twice it."""
    mtbf_seconds: float | None = None
    """The job's mean time between failures the interval was chosen for."""
    step_seconds: float | None = None
    """The typical step time (the median of the recent steps clear of a checkpoint
    write) that converts ``sqrt(2 x cost x MTBF)`` seconds into ``intervalSteps``."""
    history: CadenceHistory | None = None
    """What the trainers were told (auto only)."""


class SkippedWindow(CamelModel):
    """Samples never trained on: the window rolled back over after bad numerics."""

    first_step: int
    last_step: int
    """The steps redone after the rollback."""
    first_sample: int
    end_sample: int
    """Global sample indices ``[firstSample, endSample)``."""


class NumericsStatus(CamelModel):
    rollbacks: int = 0
    """Rollbacks for bad numerics (``faultTolerance.numerics.maxRollbacks`` bounds them)."""
    skipped: list[SkippedWindow] = Field(default_factory=list)


class QuarantinedNode(CamelModel):
    node: str
    until: Timestamp
    """RFC 3339 time after which the job may use the node again."""


class SlotBackoff(CamelModel):
    failures: int = Field(ge=1)
    """The slot's failures in a row (``planner/backoff.py``)."""
    until: Timestamp
    """Its replacement is not created before this time (RFC 3339)."""


class Internal(CamelModel):
    """The operator's own bookkeeping. Not an API: it may change between versions. It
    lives in the status because it must be written in the same patch as the decisions it
    guards (a failure's key with the charge of that failure)."""

    model_config = ConfigDict(**{**CamelModel.model_config, "extra": "ignore"})  # another version's keys: read_internal

    charged_failures: list[str] = Field(default_factory=list)
    """Keys of failures already charged (``pod:<uid>``, ``node:<name>@<transition>``),
    checked before any charge, so a failure is charged once whatever the order and timing
    of passes (bounded, oldest dropped first)."""
    attempts_seen: dict[str, str] = Field(default_factory=dict)
    """``pod:<uid>`` -> ``crash=N,hang=M,oom=K``: the failed attempts of each cause the
    pod's trainer last reported (each new one is charged once), and (``oom``) the OOM kills
    its launcher counted that have named a crash ``OOMKilled``; a cause at 0 is left out.
    One key a pod (a 1,024-worker job has up to 1,074 live and kept pods)."""
    stragglers_seen: list[str] = Field(default_factory=list)
    """``pod:<uid>/<rank>`` of stragglers already announced (and, with ``Replace``,
    replaced): each is acted on once."""
    node_failures: dict[str, list[str]] = Field(default_factory=dict)
    """Node (or ``notready:<node>``) -> when this job's pods were killed there in ways that
    point at the node (or the node's NotReady episodes began to count), RFC 3339, within
    ``nodeFailureWindowSeconds`` (``planner/node_history.py``)."""
    unschedulable_seen: list[str] = Field(default_factory=list)
    """``pod:<uid>`` of pods announced as unschedulable (an Event once each, bounded)."""
    values_rejected: list[str] = Field(default_factory=list)
    """``pod:<uid>/<field>`` of unusable values from pods already reported (bounded)."""
    backoff: dict[str, SlotBackoff] = Field(default_factory=dict)
    """Worker slot (``*``: every slot, a job-wide restart) -> its failures in a row and
    when its replacement is due (``planner/backoff.py``; bounded)."""
    not_ready_since: Timestamp | None = None
    """When the ready workers first dropped below ``replicas.min`` without a detected
    failure (RFC 3339); the phase leaves Running only after a short grace."""


LEGACY_INTERNAL = {"countedFailures": "chargedFailures", "notReadySince": "notReadySince"}
"""Bookkeeping that earlier versions kept at the top of the status, and where it went."""
LEGACY_DROPPED = ("torchrunRestarts", "hangsSeen", "expectedInPlace", "attemptsSeen")
"""Earlier bookkeeping with no successor (in-place restarts are keyed by pod uid and
cause now): dropped, so that a status written by an earlier version stays readable."""


def attempts(value: str) -> dict[str, int]:
    """``crash=N,hang=M`` as a dict (``Internal.attempts_seen``); a malformed part (a
    hand-edited status) is left out."""
    out: dict[str, int] = {}
    for part in value.split(","):
        cause, _, count = part.partition("=")
        if cause and count.isascii() and count.isdigit() and len(count) <= 16 and int(count) < 2**53:
            out[cause] = max(out.get(cause, 0), int(count))
    return out


def attempts_text(counts: dict[str, int]) -> str:
    return ",".join(f"{cause}={n}" for cause, n in sorted(counts.items()) if n > 0)


def _migrate_attempts(internal: dict[str, Any]) -> dict[str, Any]:
    """Earlier versions kept a key a pod and cause (``pod:<uid>/<cause>`` -> N)."""
    seen = internal.get("attemptsSeen")
    if not isinstance(seen, dict) or all(isinstance(v, str) for v in seen.values()):
        return internal
    grouped: dict[str, dict[str, int]] = {}
    for key, value in seen.items():
        pod, _, cause = str(key).partition("/")
        found = attempts(value) if isinstance(value, str) else {}
        if cause and isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53:
            found = {cause: value}
        counts = grouped.setdefault(pod, {})
        for name, n in found.items():  # the larger count is the newer (both forms of one pod: a hand edit)
            counts[name] = max(counts.get(name, 0), n)
    return {**internal, "attemptsSeen": {pod: text for pod, counts in grouped.items() if (text := attempts_text(counts))}}


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A status dict of an earlier version in the current shape (nothing is lost that the
    planner still uses)."""
    if isinstance(raw.get("internal"), dict):
        internal = _migrate_attempts(raw["internal"])
        if internal is not raw["internal"]:
            raw = {**raw, "internal": internal}
    if not any(k in raw for k in (*LEGACY_INTERNAL, *LEGACY_DROPPED)):
        return raw
    out = {k: v for k, v in raw.items() if k not in LEGACY_INTERNAL and k not in LEGACY_DROPPED}
    internal = dict(out["internal"]) if isinstance(out.get("internal"), dict) else {}
    for old, new in LEGACY_INTERNAL.items():
        if old in raw and new not in internal:
            internal[new] = raw[old]
    out["internal"] = internal
    return out


class LLMTrainJobStatus(CamelModel):
    """Observed state of an LLMTrainJob."""

    phase: Phase = Phase.PENDING
    """Lifecycle phase, shown in ``kubectl get ltj``. Succeeded and Failed are terminal;
    Invalid is left when the spec is fixed."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    """One per type (a map keyed by ``type``, as the API conventions ask: server-side apply
    and strategic merges treat them as such)."""
    observed_generation: int | None = None
    workers: str = "0/0"
    """``ready/desired`` pods, for the printer column."""
    replicas: WorkerCounts = Field(default_factory=WorkerCounts)
    selector: str | None = None
    """The worker pods' label selector: with ``replicas.ready``, what the ``scale``
    subresource reports (``kubectl scale``, an autoscaler)."""
    world_size: int = 0
    """Ranks in the current rendezvous round (from the trainer's metrics)."""
    step: int = 0
    """Newest optimizer step reported by the trainer."""
    progress: str = "0"
    """``step/maxSteps`` for the printer column (``step`` alone when the job's length is not
    known: a user's script)."""
    loss: float | None = None
    """The newest step's training loss (the built-in trainer's, from its metrics)."""
    tokens_per_second: float | None = None
    """The job's throughput over its newest step (the built-in trainer's)."""
    rank_zero: RankZero | None = None
    """Where global rank 0 runs now: its log is the job's step log (``llmtrain logs``).
    It moves when pods are replaced."""
    ranks: list[RankHolder] = Field(default_factory=list, max_length=MAX_NODES)
    """Which worker pod holds which global ranks now (once the pods have ended: held last),
    by first rank (``llmtrain logs JOB --rank R``); from each pod's metrics page, so a pod
    not yet scraped is missing."""
    eta: str | None = None
    """Time left to ``maxSteps`` at the current throughput (``1h5m``); absent when unknown."""
    restarts: int = 0
    """Restarts counted against ``faultTolerance.maxRestarts``. Never reset."""
    disruptions: int = 0
    """Evictions and preemptions; they do not count against the budget."""
    heals: int = 0
    """In-process heals over the job (``faultTolerance.inProcessHealing``): failures after
    which the ranks that kept their processes passed their state to the restarted or
    replacement ranks, instead of every rank restarting and restoring. Each failure is
    still charged in ``restarts``. From the trainers' pages (the count travels with the
    state and the checkpoints); never decreases."""
    restarts_by_reason: dict[str, int] = Field(default_factory=dict)
    """Restart counts per reason (``Signal9``, ``Hang``, ``NodeFailure`` ...)."""
    restart_generation: int = 0
    """Bumped by every ``RestartAll``; pods of an older generation are recreated."""
    last_failure: FailureRecord | None = None
    kept_pods: list[str] = Field(default_factory=list)
    """Failed worker pods kept with their logs (``faultTolerance.keepFailedPods``), newest
    first: ``kubectl logs <pod>`` or ``llmtrain logs JOB --failed [N]`` reads one."""
    last_checkpoint: CheckpointRecord | None = None
    checkpoint_tiers: list[TierHealth] = Field(default_factory=list)
    """Each configured tier's health and newest step (condition ``CheckpointsDegraded``)."""
    checkpoint_cadence: CheckpointCadence | None = None
    """The checkpoint interval in force; with ``intervalSteps: auto``, how it was chosen."""
    quarantined_nodes: list[QuarantinedNode] = Field(default_factory=list)
    numerics: NumericsStatus | None = None
    """Rollbacks for bad numerics and the sample windows they skipped, as the trainers'
    checkpoints record them."""
    start_time: Timestamp | None = None
    """When the job first ran (RFC 3339)."""
    completion_time: Timestamp | None = None
    """When it Succeeded or Failed (RFC 3339)."""
    last_progress_time: Timestamp | None = None
    """When ``step`` last advanced (RFC 3339); the wedge check measures from here."""
    next_restart_time: Timestamp | None = None
    """Backoff: the last replacement waiting out its backoff is created at this time (RFC
    3339); each worker slot waits its own (``faultTolerance.backoff``)."""
    active_seconds: float = 0.0
    """Seconds spent not suspended, for ``activeDeadlineSeconds``."""
    goodput: float | None = None
    """Effective training time ratio so far: productive seconds / active seconds."""
    productive_seconds: float = 0.0
    """Seconds spent Running (training at or above ``replicas.min``)."""
    redo_seconds: float = 0.0
    """Seconds spent Running while redoing steps trained once already (lost since the
    last checkpoint before a failure): the trainers' newest step was below ``step``."""
    ettr: float | None = None
    """Effective training time ratio so far, counting only preserved progress:
    (productive seconds - redo seconds) / active seconds. Detection, recovery and
    scheduling are not Running; replayed steps are Running but not progress."""
    last_reconcile_time: Timestamp | None = None
    """When the operator last accounted time (RFC 3339)."""
    last_recovery_seconds: float | None = None
    """From the last detected failure to the first training step a trainer finished
    after it (as the trainer timed that step)."""
    internal: Internal = Field(default_factory=Internal, json_schema_extra={"x-llmtrain-opaque": True})
    """The operator's own bookkeeping, written in the same patch as the decisions it
    guards. Not an API: it may change between versions (the CRD does not check its shape;
    the operator reads it field by field: ``read_internal``)."""


SALVAGED = {"restarts": "restarts", "disruptions": "disruptions", "restartGeneration": "restart_generation", "step": "step"}
"""Counters kept from a status that cannot be read, so that the budget is never reset."""


def read_internal(raw: Any) -> Internal:
    """``status.internal`` field by field: one the operator cannot read (another version's
    shape, a hand edit; the CRD does not check it) is left out alone, and a key it does
    not know is ignored, so that the rest of the bookkeeping (the charged keys above all)
    still guards its charges."""
    if not isinstance(raw, dict):
        return Internal()
    kept: dict[str, Any] = {}
    for name, info in Internal.model_fields.items():
        key = info.alias or name
        if key in raw:
            try:
                Internal.model_validate({key: raw[key]})
            except ValidationError:
                continue
            kept[key] = raw[key]
    return Internal.model_validate(kept)


def read_status(raw: Any) -> LLMTrainJobStatus:
    """The status as written (of this version or an earlier one). A status that cannot be
    read (hand-edited, from an unknown version) must not wedge the job: its bookkeeping
    is read as far as it can be (``read_internal``), and the rest, when it cannot be read,
    as a fresh status that keeps the counters still found in it, so that the budget is
    never reset."""
    data = migrate(raw) if isinstance(raw, dict) else (raw or {})
    internal = read_internal(data.get("internal")) if isinstance(data, dict) else Internal()
    try:
        status = LLMTrainJobStatus.model_validate({**data, "internal": {}} if isinstance(data, dict) else data)
    except ValidationError:
        status = LLMTrainJobStatus()
        if isinstance(raw, dict):
            for key, attr in SALVAGED.items():
                value = raw.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    setattr(status, attr, value)
    status.internal = internal
    return status
