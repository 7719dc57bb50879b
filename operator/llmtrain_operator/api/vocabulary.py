"""The words of the API, in one place: phases, condition types, failure kinds, and the
reasons of conditions and Events. String enums, so they are the strings on the wire and
compare equal to them; the status model and the CRD's enums are built from these.

Failure reasons that come from the exit-code table (``ConfigError``, ``Hang``,
``SignalN`` ...) are not repeated here: ``llmtrain_contract.exitcodes`` owns them.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """``status.phase``, shown in ``kubectl get ltj``."""

    PENDING = "Pending"
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"


TERMINAL_PHASES = (Phase.SUCCEEDED, Phase.FAILED)


class PodPhase(StrEnum):
    """Kubernetes' own pod phases (``status.phase`` of a Pod)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    DEGRADED = "Degraded"
    CHECKPOINTS_DEGRADED = "CheckpointsDegraded"
    STRAGGLER = "Straggler"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID = "Invalid"
    REPLICA_FAILURE = "ReplicaFailure"
    """The API server refuses to create a child (quota, an admission webhook, Pod Security,
    RBAC), as Kubernetes' own ReplicaSets report it."""
    POD_GROUP_READY = "PodGroupReady"
    """A gang job's PodGroup exists and its scheduler lets the worker pods be created."""
    ADMITTED = "Admitted"
    """A queued job's Kueue Workload is admitted (label ``kueue.x-k8s.io/queue-name``)."""
    UNSCHEDULABLE = "Unschedulable"
    """The scheduler cannot place some of the job's pods; its words and the resources it
    finds short are the message. Not a failure: nothing is charged."""
    GPU_MEMORY_FITS = "GPUMemoryFits"
    """A built-in GPU job's memory plan against the largest GPU it can land on (nodes
    labelled by NVIDIA's GPU feature discovery); False names a change that fits."""
    NODES_DISRUPTED = "NodesDisrupted"
    """Most nodes of a zone went NotReady at once (a control-plane or network outage, not
    node failures): the pods on them are kept, as the node lifecycle controller stops
    evicting in such a zone."""


class FailureKind(StrEnum):
    """``status.lastFailure.kind``: what class of failure the operator acted on."""

    PROCESS_CRASH = "ProcessCrash"
    NODE_FAILURE = "NodeFailure"
    EVICTION = "Eviction"
    HANG = "Hang"
    WEDGED = "Wedged"
    BAD_NUMERICS = "BadNumerics"
    # checkpoints
    CHECKPOINT_TIER_DEGRADED = "CheckpointTierDegraded"
    CHECKPOINT_TIER_RECOVERED = "CheckpointTierRecovered"
    TIERS_HEALTHY = "TiersHealthy"
    CHECKPOINT_INTERVAL_CHANGED = "CheckpointIntervalChanged"
    PERMANENT = "Permanent"
    DEADLINE = "Deadline"


class Reason(StrEnum):
    """Reasons of Events and conditions (CamelCase, machine-readable)."""

    # children and lifecycle
    CREATED = "Created"
    CREATED_WORKERS = "CreatedWorkers"
    FAILED_CREATE = "FailedCreate"
    CREATES_ACCEPTED = "CreatesAccepted"
    CONFIG_UPDATED = "ConfigUpdated"
    SCALED_DOWN = "ScaledDown"
    STORE_RESTARTED = "StoreRestarted"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    COMPLETED = "Completed"
    TTL_EXPIRED = "TTLExpired"
    # failures
    POD_FAILED = "PodFailed"
    POD_DISRUPTED = "PodDisrupted"
    POD_UNRESPONSIVE = "PodUnresponsive"
    NODE_FAILURE = "NodeFailure"
    RESTART_ALL = "RestartAll"
    RESTARTED_IN_PLACE = "RestartedInPlace"
    ROLLED_BACK = "RolledBack"
    STRAGGLER = "Straggler"
    STRAGGLER_REPLACED = "StragglerReplaced"
    PREFLIGHT_FAILED = "PreflightFailed"
    NO_STRAGGLER = "NoStraggler"
    ZONE_DISRUPTED = "ZoneDisrupted"
    UNUSABLE_POD_VALUE = "UnusablePodValue"
    """A label, termination message field or metric from a pod that was ignored."""
    NODES_REACHABLE = "NodesReachable"
    UNSCHEDULABLE = "Unschedulable"
    SCHEDULED = "Scheduled"
    NODE_QUARANTINED = "NodeQuarantined"
    # local runs (llmtrain run)
    LOCAL_TIMEOUT = "LocalTimeout"
    INJECTED_NODE_LOSS = "InjectedNodeLoss"
    INJECTED_NODE_FREEZE = "InjectedNodeFreeze"
    NODE_UNHEALTHY = "NodeUnhealthy"
    """A health agent reports the node sick (a condition, a GPU out of allocatable): the
    job's pods there are drained before a rank fails."""
    FITS_GPU_MEMORY = "FitsGPUMemory"
    EXCEEDS_GPU_MEMORY = "ExceedsGPUMemory"
    BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    # validity
    INVALID_SPEC = "InvalidSpec"
    MISSING_DEPENDENCY = "MissingDependency"
    CONTAINER_CONFIG_ERROR = "ContainerConfigError"
    POD_TEMPLATE_REFUSED = "PodTemplateRefused"
    TIER_CONFLICT = "TierConflict"
    """A checkpoint tier (subPath, S3 prefix) is also an older live job's."""
    SPEC_VALID = "SpecValid"
    # condition reasons
    CHILDREN_CREATED = "ChildrenCreated"
    TRAINING = "Training"
    NOT_ENOUGH_WORKERS = "NotEnoughWorkers"
    RECOVERING = "RecoveringFromFailure"
    STABLE = "Stable"
    REDUCED_WORLD_SIZE = "ReducedWorldSize"
    FULL_SIZE = "FullSize"
    JOB_SUSPENDED = "JobSuspended"
    JOB_RESUMED = "JobResumed"
    # failure reasons the operator names itself (the rest come from the exit-code table)
    NODE_NOT_READY = "NodeNotReady"
    NO_PROGRESS = "NoProgress"
    DISRUPTION_TARGET = "DisruptionTarget"
    EVICTED = "Evicted"
    WEDGED = "Wedged"
    # checkpoints
    CHECKPOINT_TIER_DEGRADED = "CheckpointTierDegraded"
    CHECKPOINT_TIER_RECOVERED = "CheckpointTierRecovered"
    TIERS_HEALTHY = "TiersHealthy"
    CHECKPOINT_INTERVAL_CHANGED = "CheckpointIntervalChanged"
    # gang scheduling
    POD_GROUP_CREATED = "PodGroupCreated"
    POD_GROUP_API_MISSING = "PodGroupAPIMissing"
    POD_GROUP_PENDING = "PodGroupPending"
    POD_GROUP_DELETED = "PodGroupDeleted"
    READ_REFUSED = "ReadRefused"
    NOT_OWNED = "NotOwned"
    """An object of the name the job's PodGroup or Workload would have exists and is not
    the job's (another uid in its ownerReferences): never used, updated or deleted."""
    """The API server refused to let the operator read the PodGroup or the Workload (RBAC)."""
    # queueing (Kueue)
    KUEUE_API_MISSING = "KueueAPIMissing"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    ADMITTED_BY_KUEUE = "AdmittedByKueue"
    EVICTED_BY_KUEUE = "EvictedByKueue"
