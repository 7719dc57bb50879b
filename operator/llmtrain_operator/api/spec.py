"""``LLMTrainJob.spec``: the typed model that the CRD is generated from.

Every field's docstring becomes its CRD description (and ``kubectl explain`` text):
it states the unit, the default and why. Each cross-field rule is written once, as a
``Rule`` beside its model (``llmtrain_contract.rules``): the Python check enforced by
``llmtrain validate`` and the operator, and the same rule in CEL for the API server,
with one message. ``api/rules.py`` gathers them into one table; the tests check every
rule against the model and, where the server can check it, against a real API server.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from llmtrain_contract.base import CamelModel, FieldRuleError
from llmtrain_contract.rules import Rule, Ruled, cel_get, cel_literal, default_of
from llmtrain_contract.config import TrainSpec, valid_world_sizes
from llmtrain_contract.names import HEALTH_PORT, METRICS_PORT, Env
from pydantic import Field, field_validator

from . import coretypes
from .coretypes import QUANTITY_PATTERN
from .observed import OPERATOR_LABEL_PREFIX
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _check_quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not _QUANTITY_RE.match(value):
        raise ValueError(f"'{value}' is not a Kubernetes quantity (e.g. '2', '500m', '16Gi')")
    return value


Quantity = Annotated[int | str, Field(json_schema_extra={"x-llmtrain-quantity": True})]
"""A Kubernetes resource quantity: an integer or a string such as ``500m`` or ``16Gi``."""


MAX_NODES = 1024
"""The largest ``replicas.max``."""

SPAN_OFFSETS = 43
"""How many node counts from ``replicas.min`` up the API server checks the batch rule at.
CEL has no loop over an unbounded range, so the rule walks a constant list of offsets, and
that list is evaluated at every write of the job, its status writes included: with all
1,024 offsets each write cost the API server about 100 ms of CPU (10 ms with this list;
docs/benchmarks.md, operator scale). 43 are as strict as 1,024: any 43 consecutive
integers have every m <= 43 among their divisors, so a range of 43 or more node counts
needs a global batch divisible by lcm(1..43) > 2**63 - 1, the largest integer the API
server holds. Such a spec fails at the first 43 offsets already (tests/contract/test_rules.py)."""


def cel(rule: str, message: str, **extra: Any) -> dict[str, Any]:
    """One ``x-kubernetes-validations`` entry."""
    return {"rule": rule, "message": message, **extra}


# --------------------------------------------------------------------------- trainer


class TrainerSpec(Ruled):
    """What runs in each worker: the built-in trainer, or the user's own script."""

    builtin: TrainSpec | None = None
    """The built-in DeepSpeed/DDP trainer: model preset, data, optimizer, batch sizes and
    a DeepSpeed config passthrough. Mutually exclusive with ``command``."""

    command: list[str] | None = Field(None, min_length=1)
    """Your own training script, run as ``torchrun <rendezvous flags> <command...>
    <args...>``: e.g. ``["/app/train.py"]`` or ``["-m", "mypkg.train"]``. torchrun supplies
    RANK/WORLD_SIZE/MASTER_ADDR; the operator also sets ``LLMTRAIN_*`` env (checkpoint
    dirs, timeouts, ``LLMTRAIN_PROGRESS_FILE``). Its exit code and uncaught exception reach
    the status. Contract: docs/custom-scripts.md. Mutually exclusive with ``builtin``."""

    args: list[str] | None = None
    """Arguments appended after ``command``."""

# -------------------------------------------------------------------------- replicas


class ReplicasSpec(Ruled):
    """The elastic range, in nodes (pods). Each pod runs ``procsPerNode`` ranks."""

    min: int = Field(1, ge=1, le=MAX_NODES)
    """Fewest healthy nodes that keep training going, 1..1024. Default 1. Below it the
    job waits (Degraded) for replacements instead of training."""

    max: int = Field(1, ge=1, le=MAX_NODES)
    """Nodes to run when all are available, 1..1024. Default 1. The operator creates
    this many pods and scales back up to it after a loss."""

class ResourcesSpec(CamelModel):
    """Per-pod compute resources, as in a container's ``resources``. The pod's CPUs (its
    limit, else its request) over ``procsPerNode`` set each rank's ``OMP_NUM_THREADS``
    (at least 1) unless ``env`` sets it."""

    requests: dict[str, Quantity] | None = None
    """Minimum resources, e.g. ``{cpu: "8", memory: 64Gi}``."""

    limits: dict[str, Quantity] | None = None
    """Maximum resources, e.g. ``{"nvidia.com/gpu": 8}``. Extended resources such as GPUs
    must also be requested; the operator copies a GPU limit into requests."""

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, int | str] | None) -> dict[str, int | str] | None:
        for name, qty in (value or {}).items():
            try:
                _check_quantity(qty)
            except ValueError as err:
                raise FieldRuleError((name,), str(err)) from None
        return value


class EnvVar(CamelModel):
    """An environment variable for the trainer container (Kubernetes ``EnvVar``)."""

    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Variable name. Not ``LLMTRAIN_RDZV_TOKEN``: the job's token, which the operator
    puts in the store's and the workers' pods from the job's Secret; a worker with
    another would be refused by its store."""

    value: str | None = None
    """Literal value."""

    @field_validator("name")
    @classmethod
    def _not_the_token(cls, value: str) -> str:
        if value == Env.RDZV_TOKEN:
            raise ValueError(f"{Env.RDZV_TOKEN} is the job's token, set by the operator from the job's Secret: a worker with "
                             "another would be refused by the job's rendezvous store")
        return value

    value_from: dict[str, Any] | None = Field(None, json_schema_extra=coretypes.field(coretypes.ENV_VAR_SOURCE))
    """A Kubernetes ``EnvVarSource`` (secretKeyRef, configMapKeyRef, fieldRef ...),
    checked against the upstream schema (field names, types), passed through."""

    @field_validator("value_from")
    @classmethod
    def _value_from(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return coretypes.checked(value, coretypes.ENV_VAR_SOURCE)


# ------------------------------------------------------------------------ checkpoint


class LocalTierSpec(CamelModel):
    """Tier 1: node-local disk (NVMe). Written asynchronously every checkpoint; training
    blocks only for the in-memory snapshot."""

    host_path: str | None = Field(None, pattern=r"^/")
    """Absolute path on the node. Default: an ``emptyDir`` (survives a container restart
    in place, not a pod replacement). A hostPath lets a replacement on the same node
    restore at NVMe speed."""

    size_limit: Quantity | None = None
    """``emptyDir`` size limit, e.g. ``200Gi``. Default none."""

    keep: int = Field(2, ge=1, le=100)
    """Committed checkpoints to keep on this tier, 1..100. Default 2."""

    @field_validator("size_limit")
    @classmethod
    def _quantity(cls, value: int | str | None) -> int | str | None:
        return None if value is None else _check_quantity(value)


class SharedTierSpec(CamelModel):
    """Tier 2: a shared filesystem (a ReadWriteMany PVC), fed from tier 1 in the
    background."""

    claim_name: str = Field(min_length=1, max_length=253)
    """Name of the PersistentVolumeClaim, in the job's namespace. Required."""

    sub_path: str | None = None
    """Folder inside the volume. Default: ``<namespace>/<job name>``. A job given the
    folder of an older live job is ``Invalid`` (reason ``TierConflict``) until that job
    is gone: two jobs writing one tier overwrite each other's steps."""

    interval_steps: int | None = Field(None, ge=1)
    """Least steps between two checkpoints kept in this tier: it stores the first
    checkpoint at or after each multiple of N. With a fixed ``checkpoint.intervalSteps``
    it must be a multiple of it. Default: every checkpoint."""

    keep: int = Field(3, ge=1, le=1000)
    """Committed checkpoints to keep on this tier, 1..1000. Default 3."""


class SecretKeyRef(CamelModel):
    """Where the S3 credentials are: a Secret in the job's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Secret name. Required. A missing Secret makes the job ``Invalid`` with a message
    naming it, instead of pods crash-looping."""

    access_key_id_key: str = "AWS_ACCESS_KEY_ID"
    """Key of the access key id in the Secret. Default ``AWS_ACCESS_KEY_ID``."""

    secret_access_key_key: str = "AWS_SECRET_ACCESS_KEY"
    """Key of the secret access key in the Secret. Default ``AWS_SECRET_ACCESS_KEY``."""


class S3TierSpec(CamelModel):
    """Tier 3: S3 or any S3-compatible store, fed from tier 1 in the background with
    concurrent multipart uploads."""

    bucket: str = Field(min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$")
    """Bucket name (S3 naming rules). Required."""

    prefix: str | None = None
    """Key prefix. Default: ``llmtrain/<namespace>/<job name>``. A job given the bucket
    and prefix of an older live job (any namespace) is ``Invalid`` (reason
    ``TierConflict``) until that job is gone."""

    endpoint: str | None = Field(None, pattern=r"^https?://")
    """Endpoint URL for S3-compatible stores (MinIO, Ceph ...). Default: AWS."""

    region: str | None = None
    """Region. Default: the SDK's default (``us-east-1``)."""

    credentials_secret: SecretKeyRef
    """Secret holding the access keys. Required."""

    force_path_style: bool | None = None
    """Path-style addressing (``endpoint/bucket/key``), which most S3-compatible servers
    need. Default: on when ``endpoint`` is set, off for AWS."""

    interval_steps: int | None = Field(None, ge=1)
    """Least steps between two checkpoints kept in S3: it stores the first checkpoint at
    or after each multiple of N (uploads run in the background from tier 1; a busy upload
    skips to the newest checkpoint). With a fixed ``checkpoint.intervalSteps`` it must be
    a multiple of it. Default: every checkpoint."""

    keep: int = Field(5, ge=1, le=10000)
    """Committed checkpoints to keep in S3, 1..10000. Default 5."""


class AutoCadenceSpec(Ruled):
    """The adaptive interval (``intervalSteps: auto``): Young/Daly's optimum
    ``sqrt(2 x cost x MTBF)``, from the measured cost of a checkpoint to the training
    (its stall plus its background write's interference with the steps) and the job's own
    mean time between failures."""

    initial_steps: int = Field(50, ge=1, le=10_000_000)
    """The interval until the first checkpoint's cost is measured. Default 50."""

    min_steps: int = Field(1, ge=1, le=10_000_000)
    """The shortest interval chosen, steps. Default 1."""

    max_steps: int = Field(100_000, ge=1, le=10_000_000)
    """The longest interval chosen, steps. Default 100000."""

    mtbf_prior_seconds: float = Field(14_400.0, gt=0, le=1e9)
    """The MTBF assumed before the job has failed, counted as one failure: the job's
    MTBF is (prior + active seconds) / (1 + failures). Default 14400 (4 hours)."""


AUTO = "auto"
IntervalSteps = Annotated[
    Annotated[int, Field(ge=1, le=10_000_000)] | Literal["auto"],
    Field(json_schema_extra={"x-llmtrain-int-or-keyword": AUTO}),
]
"""A step count, or ``auto``."""


class CheckpointSpec(Ruled):
    """Tiered checkpoints. Restore takes the newest step that every rank can load, from
    the fastest tier that holds a verified copy."""

    enabled: bool = True
    """Take checkpoints at all. Default true. Off means a failure restarts from step 0."""

    interval_steps: IntervalSteps = 50
    """Take a checkpoint every N optimizer steps (the tier-1 cadence), 1..10000000, or
    ``auto``: the interval adapts to the measured cost of a checkpoint and the job's
    failure rate (``auto`` holds its bounds and prior); the interval in force is in
    ``status.checkpointCadence``. Default 50."""

    auto: AutoCadenceSpec | None = None
    """Bounds and prior of ``intervalSteps: auto``. Default: the defaults below. Only
    with ``intervalSteps: auto``."""

    local: LocalTierSpec = Field(default_factory=LocalTierSpec)
    """Tier 1, node-local. Always on when checkpoints are enabled."""

    shared: SharedTierSpec | None = None
    """Tier 2, shared filesystem. Default off."""

    s3: S3TierSpec | None = None
    """Tier 3, S3. Default off."""

    sigterm_budget_seconds: int = Field(20, ge=1, le=3600)
    """Seconds the trainer may spend on an emergency checkpoint after SIGTERM (eviction,
    preemption). Default 20. The pod's termination grace period is set above it."""

    allow_fresh_start: bool = False
    """When every checkpoint fails verification, start from step 0 instead of failing
    with ``CorruptCheckpoint``. Default false, so that committed progress is never
    silently discarded."""

# ------------------------------------------------------------------- fault tolerance


class NumericsSpec(CamelModel):
    """Bad numerics: a non-finite loss, or a loss spike, rolls the job back to its newest
    checkpoint and skips the samples trained on since then (recorded in
    ``status.numerics``)."""

    spike_std_devs: float = Field(6.0, ge=0, le=1000)
    """A loss this many standard deviations above the mean of the recent window is a
    spike. 0 turns the spike rule off (non-finite losses are always bad). Default 6."""

    spike_min_rise: float = Field(0.5, ge=0, le=1e6)
    """A spike must also be at least this far above the window's mean, in the loss's units
    (nats for a cross-entropy loss). Near convergence the window's deviation is tiny and
    ordinary noise is many of them: a loss of 0.37 after a mean of 0.17 was 6 deviations
    above it. 0 leaves only the deviation rule. Default 0.5."""

    window_steps: int = Field(50, ge=5, le=100_000)
    """Steps in the recent window; the spike rule applies once it is full. Default 50."""

    max_rollbacks: int = Field(3, ge=0, le=1000)
    """Rollbacks allowed over the job; one more bad step fails the job with
    ``BadNumerics``. Default 3."""


class StragglerSpec(CamelModel):
    """Stragglers: a rank whose local share of each step (data, forward, backward up to
    the gradient all-reduce) stays above the other ranks'."""

    factor: float = Field(2.0, gt=1, le=1000)
    """Slow: above this multiple of the other ranks' median. Default 2."""

    steps: int = Field(20, ge=0, le=100_000)
    """Consecutive slow steps before a rank is a straggler (as many within the bound
    clear it). 0 turns the watch off. Default 20."""

    min_excess_seconds: float = Field(0.05, ge=0, le=3600)
    """Slow also means at least this many seconds above the median. Default 0.05."""

    action: Literal["Report", "Replace"] = "Report"
    """``Report``: the ``Straggler`` condition, an Event and the trainer's metric.
    ``Replace``: also delete the straggler's pod and quarantine its node for
    ``nodeQuarantineSeconds`` (not charged to the restart budget). Default Report."""


class BackoffSpec(CamelModel):
    """Exponential backoff before a failed worker's replacement, per worker slot:
    ``initial * factor^(k-1)``, capped, where ``k`` counts the slot's failures in a row. A
    failure elsewhere in the job does not delay the slot; a job-wide restart
    (``RestartAll``, the progress backstop) holds back every slot by its own count."""

    initial_seconds: float = Field(1.0, ge=0, le=3600)
    """Delay before a slot's first replacement, in seconds. Default 1."""

    max_seconds: float = Field(300.0, ge=0, le=86400)
    """Upper bound of the delay, in seconds. Default 300."""

    factor: float = Field(2.0, ge=1.0, le=10.0)
    """Growth per failure in a row, 1..10. Default 2."""

    reset_after_seconds: int = Field(600, ge=0, le=86400)
    """A slot that has not failed for this long after its replacement was due counts its
    next failure as the first again (the kubelet's CrashLoopBackOff resets after 10 minutes
    of running). Seconds, 0..86400. Default 600."""


class FaultToleranceSpec(Ruled):
    """How failures are detected and what a recovery costs."""

    max_restarts: int = Field(10, ge=0, le=100_000)
    """Job-wide restart budget. Default 10. Counted in ``status.restarts`` and never
    reset, not even when pods are recreated; exhausting it fails the job with
    ``BackoffLimitExceeded``. Disruptions (evictions, preemptions) do not count."""

    restart_policy: Literal["ReplaceFailed", "RestartAll"] = "ReplaceFailed"
    """``ReplaceFailed``: replace only the lost pods; survivors re-rendezvous and keep
    their processes. ``RestartAll``: recreate every pod on any failure (simpler, slower).
    Default ``ReplaceFailed``."""

    hang_timeout_seconds: int = Field(300, ge=10, le=86400)
    """No optimizer step for this long means a hang (a stuck NCCL/gloo collective, a
    frozen or GIL-holding rank). The launcher's supervisor sees it from outside the
    ranks, dumps the stacks and ends the cause with the hang code (its peers as victims);
    the launcher's liveness probe fails after as long. The first step after every
    (re)start gets twice as long, and at least 60 s more (NCCL connects in it, caches
    warm up). Seconds, 10..86400. Default 300; set it above your slowest step plus
    checkpoint."""

    collective_timeout_seconds: int = Field(120, ge=5, le=7200)
    """Timeout of every collective and of process-group init, in seconds, 5..7200.
    Default 120, instead of torch's 10 min (NCCL) / 30 min (gloo) that make a dead peer
    look like a hang."""

    node_failure_grace_seconds: int = Field(40, ge=0, le=3600)
    """How long a node may be NotReady/Unknown/unreachable before its pods are
    force-deleted and replaced elsewhere. Seconds. Default 40."""

    node_quarantine_seconds: int = Field(600, ge=0, le=86400)
    """After a node failure, keep this job's replacements off that node for this long.
    Seconds. Default 600."""

    node_failure_threshold: int = Field(2, ge=1, le=20)
    """Failures of this job's pods that point at one node (killed with no report from
    the pod's launcher, or lost without an exit) within ``nodeFailureWindowSeconds`` after
    which the node is quarantined for the job, as after a NotReady episode. 1..20.
    Default 2. A crash the launcher reports (an exception, a hang, an OOM) is the
    program's and never counts against the node."""

    node_failure_window_seconds: int = Field(600, ge=10, le=86400)
    """The window of ``nodeFailureThreshold``. Such failures on one node within this of
    the episode's first, charged one are that episode: charged once as a restart however
    often the node kills the job's pods, and once more per window after. Seconds,
    10..86400. Default 600."""

    progress_timeout_seconds: int = Field(900, ge=0, le=604800)
    """Operator-side backstop: if ``status.step`` does not advance for this long while
    Running, Restarting or Created with workers alive (not while one waits to be
    scheduled), restart all pods. 0 disables. Seconds. Default 900; must exceed
    ``hangTimeoutSeconds``. A ``trainer.command`` script is watched only once it has
    reported a step (``LLMTRAIN_PROGRESS_FILE``, docs/custom-scripts.md)."""

    preflight_min_mbps: float = Field(50, ge=0, le=100000)
    """The pre-flight check the launcher of a pod joining a job that has trained (a
    replacement, a scale-up) makes before it joins: 4 MiB sent through the job's rendezvous
    store and back, twice, the best rate counting. Below this many MB/s (10^6 bytes a
    second) the pod exits ``PreflightFailed`` (87) naming the rate, and the operator keeps
    the job off the node (quarantine, not charged) instead of letting a degraded link slow
    every collective. A store that cannot be reached, or is busy with other checks, skips
    it. 0 turns it off. Default 50 (a 1 Gb/s link carries about 110)."""

    keep_failed_pods: int = Field(3, ge=0, le=50)
    """Failed worker pods kept, with their logs, after they were replaced (as a Job keeps
    its failed pods): each replacement is a new pod (``<job>-worker-<slot>-<n>``), the
    failed one is labelled ``llmtrain.io/kept=true`` and listed in ``status.keptPods``, and
    the oldest beyond this many are deleted. A kept pod has ended, so it holds no CPU,
    memory or GPU; its log stays until it is deleted (with the job at the latest). 0..50.
    Default 3; 0 deletes a failed pod once it is charged. Pods lost with their node (their
    logs went with it) are not kept, nor the healthy pods a ``RestartAll`` ends."""

    in_process_healing: bool = False
    """A rank that crashes is restarted in its pod by the torchrun agent, and the other
    pods keep their processes: they form a new process group with it and one of them sends
    it the whole state from memory (no restore from a checkpoint, no restart of the job's
    other ranks). A pod lost whole (its node gone) is healed too when fewer pods than
    replicas.min would be left without it: the pod that replaces it takes its seat and gets
    the state from the survivors, which wait for it up to the collective timeout (and the
    hang timeout), so both must outlast the node's NotReady, nodeFailureGraceSeconds and
    the new pod's start. What cannot heal so recovers as without it, later: a lost pod the
    job can go on without about 5 s later (torchrun re-forms it smaller), a round that does
    not form by the collective timeout. The built-in
    trainer's DDP only. With several ranks a pod, torchrun stops a failed rank's pod's
    other ranks too and restarts them all in place; they get the state from the other
    pods' ranks (a job of one pod restores from its checkpoints). Default false.
    docs/trainer.md, "In-process healing"."""

    backoff: BackoffSpec = Field(default_factory=BackoffSpec)
    """Delay between successive restarts."""

    numerics: NumericsSpec = Field(default_factory=NumericsSpec)
    """Bad numerics: when a loss is bad, and how many rollbacks are allowed."""

    stragglers: StragglerSpec = Field(default_factory=StragglerSpec)
    """Stragglers: when a rank is one, and what happens then."""

# ------------------------------------------------------------------------ scheduling


class Toleration(CamelModel):
    """A Kubernetes toleration."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class GangSpec(CamelModel):
    """Gang scheduling: the operator creates the PodGroup of the chosen scheduler, owned
    by the job, and names it on the worker pods."""

    min_available: int = Field(ge=1, le=1024)
    """Worker pods that must be placeable together before any starts (the PodGroup's
    ``minMember``). Usually ``replicas.min``."""

    scheduler: Literal["volcano", "scheduler-plugins"] | None = None
    """Whose PodGroup: ``volcano`` (``scheduling.volcano.sh/v1beta1``; the worker pods
    are created once Volcano moved it out of Pending) or ``scheduler-plugins``
    (coscheduling, ``scheduling.x-k8s.io/v1alpha1``). Default: ``volcano`` when
    ``schedulerName`` is ``volcano``, else ``scheduler-plugins``."""

    queue: str | None = Field(None, min_length=1, max_length=253)
    """Volcano: the Queue of the PodGroup. Default Volcano's (``default``)."""

    schedule_timeout_seconds: int | None = Field(None, ge=1)
    """scheduler-plugins: how long the coscheduling plugin waits for the whole gang before
    it gives the pods' places up. Default the plugin's."""


class SchedulingSpec(CamelModel):
    """Where worker pods may run."""

    node_selector: dict[str, str] | None = None
    """Node labels the pods require, e.g. ``{gpu: h100}``."""

    tolerations: list[Toleration] | None = None
    """Taints the pods tolerate (e.g. ``nvidia.com/gpu:NoSchedule``)."""

    affinity: dict[str, Any] | None = Field(None, json_schema_extra=coretypes.field(coretypes.AFFINITY))
    """A Kubernetes ``Affinity``, checked against the upstream schema (field names,
    types), passed through."""

    priority_class_name: str | None = None
    """PriorityClass for the pods; preemption by higher priorities is handled as a
    disruption."""

    scheduler_name: str | None = None
    """A non-default scheduler (e.g. ``volcano``)."""

    gang: GangSpec | None = None
    """Gang scheduling hint. Default none."""

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return coretypes.checked(value, coretypes.AFFINITY)


class PodTemplateMetadata(CamelModel):
    """What a template may add to the worker pods' metadata. Nothing else: a template's
    ``namespace`` would put the pods elsewhere and its ``finalizers`` would keep them from
    ever being deleted (the operator's name, labels and owner win anyway)."""

    labels: dict[str, str] | None = None
    """Labels added to the worker pods (the operator's own win a clash). Keys under
    ``llmtrain.io/`` are the operator's (which slot, which incarnation, kept for its log)
    and are refused."""

    annotations: dict[str, str] | None = None
    """Annotations added to the worker pods."""

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        owned = sorted(key for key in value or {} if key.startswith(OPERATOR_LABEL_PREFIX))
        if owned:
            raise ValueError(f"{', '.join(owned)}: labels under {OPERATOR_LABEL_PREFIX} are the operator's (a pod's slot, "
                             "incarnation, whether it is kept for its log); a template may not set them")
        return value


class PodTemplateSpec(CamelModel):
    """A partial Pod merged over the generated worker pods (see ``podTemplate``)."""

    metadata: PodTemplateMetadata | None = None
    """Labels and annotations to add to the worker pods."""

    spec: dict[str, Any] | None = Field(None, json_schema_extra=coretypes.field(coretypes.POD_SPEC))
    """A partial PodSpec (volumes, sidecars, securityContext ...), checked against the
    upstream schema (field names, types, enums: a misspelt ``volumeMount`` is refused
    naming it); required fields are checked on the whole pod when it is created."""

    @field_validator("spec")
    @classmethod
    def _spec(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        checked = coretypes.checked(value, coretypes.POD_SPEC)
        for container in (checked or {}).get("containers") or []:
            if any(isinstance(var, dict) and var.get("name") == Env.RDZV_TOKEN for var in container.get("env") or []):
                raise ValueError(f"containers[{container.get('name')!r}].env: {Env.RDZV_TOKEN} is the job's token, set by the "
                                 "operator from the job's Secret: a worker with another would be refused by the job's "
                                 "rendezvous store")
        return checked


class MetricsSpec(CamelModel):
    """The trainer's Prometheus endpoint in each pod."""

    port: int = Field(METRICS_PORT, ge=1024, le=65000)
    """Container port of local rank 0's endpoint; local rank r uses ``port + r``.
    1024..65000. Default 9400."""


# ------------------------------------------------------------------------------ spec


class LLMTrainJobSpec(Ruled):
    """The desired state of an elastic training job."""

    image: str = Field(min_length=1, max_length=1024)
    """Container image of the workers: the trainer image, or for ``trainer.command`` any
    image with Python and torch (the launcher is copied in from the operator's runtime
    image by an init container)."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy. Default ``IfNotPresent``."""

    trainer: TrainerSpec = Field(json_schema_extra={
        "x-kubernetes-validations": [
            cel("self == oldSelf", "trainer is immutable: checkpoints of one model/data config cannot resume another; create a new job"),
        ]
    })
    """The built-in trainer or your own script. Immutable."""

    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    """Elastic node range."""

    procs_per_node: int = Field(1, ge=1, le=64, json_schema_extra={
        "x-kubernetes-validations": [
            cel("self == oldSelf", "procsPerNode is immutable"),
        ]
    })
    """Ranks per pod (``torchrun --nproc-per-node``), usually the GPUs per node, 1..64.
    Default 1. Immutable."""

    resources: ResourcesSpec | None = None
    """Per-pod resources. Set ``limits: {nvidia.com/gpu: N}`` on GPU clusters."""

    env: list[EnvVar] | None = None
    """Extra environment for the trainer container."""

    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Tiered checkpointing. Default: tier 1 only, every 50 steps."""

    fault_tolerance: FaultToleranceSpec = Field(default_factory=FaultToleranceSpec)
    """Failure detection and the restart budget."""

    scheduling: SchedulingSpec | None = None
    """Node selection, tolerations, priority and gang scheduling."""

    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    """The trainer's Prometheus endpoint."""

    suspend: bool = False
    """Suspend the job: delete the pods but keep status and checkpoints. Unsuspending
    resumes from the newest checkpoint that outlived the pods (shared or S3 tier, or a
    hostPath local tier; an emptyDir local tier goes with its pod), without counting a
    restart. A job labelled ``kueue.x-k8s.io/queue-name`` has it set by the operator
    while Kueue has not admitted its Workload, and cleared on admission. Default false."""

    active_deadline_seconds: int | None = Field(None, ge=1)
    """Fail the job (``DeadlineExceeded``) after this many seconds since it started,
    suspended time excluded. Default none."""

    ttl_seconds_after_finished: int | None = Field(None, ge=0)
    """Delete the job (and through ownerReferences its children) this many seconds after
    it Succeeded or Failed. Default none (keep)."""

    pod_template: PodTemplateSpec | None = None
    """Escape hatch: a partial Pod (``metadata`` and ``spec``) merged over the generated
    worker pods, as kubectl's strategic merge would: maps merge recursively;
    ``containers``, ``initContainers``, ``volumes``, ``env`` and ``imagePullSecrets`` merge
    by name, ``volumeMounts`` by mountPath, ``ports`` by containerPort; other lists are
    replaced. Operator-owned fields (command, its env, labels) win. The pods are Pod
    Security "restricted" by default; ``spec.securityContext`` and the ``trainer``
    container's ``securityContext`` here override that, for the rendezvous pod too."""

    def world_sizes(self) -> range:
        """World sizes the job may run at, smallest first."""
        return range(
            self.replicas.min * self.procs_per_node,
            self.replicas.max * self.procs_per_node + 1,
            self.procs_per_node,
        )


# ------------------------------------------------------------------------- the rules
# Each cross-field rule once: the check, its CEL, one message, and an example (relative to
# the model) that breaks it. api/rules.py gathers them into the job's one rule table.

TrainerSpec.RULES = (
    Rule("builtin-or-command", "builtin",
         "set exactly one of trainer.builtin (the built-in trainer) or trainer.command (your own torchrun script)",
         check=lambda t: "" if (t.builtin is None) == (t.command is None) else None,
         cel="has(self.builtin) != has(self.command)",
         example={"command": ["/app/train.py"]}),
    Rule("args-need-command", "args", "trainer.args needs trainer.command",
         check=lambda t: "" if t.args is not None and t.command is None else None,
         cel="!has(self.args) || has(self.command)",
         example={"args": ["--foo"]}),
)

_MIN = cel_get("self.min", default_of(ReplicasSpec, "min"))
_MAX = cel_get("self.max", default_of(ReplicasSpec, "max"))
ReplicasSpec.RULES = (
    Rule("replicas-ordered", "min", "replicas.min must be <= replicas.max",
         check=lambda r: f"{r.min} > {r.max}" if r.min > r.max else None,
         cel=f"{_MIN} <= {_MAX}",
         example={"min": 3, "max": 2}),
)

_INTERVAL = cel_get("self.intervalSteps", default_of(CheckpointSpec, "interval_steps"))


def _cadence_rule(tier: str) -> Rule:
    def check(c: CheckpointSpec) -> str | None:
        spec = getattr(c, tier)
        fixed = c.interval_steps
        if spec is not None and spec.interval_steps and fixed != AUTO and spec.interval_steps % fixed:
            return f"{spec.interval_steps} % {fixed} != 0"
        return None

    example = {"shared": {"claimName": "ckpt", "intervalSteps": 15}} if tier == "shared" else \
        {"s3": {"bucket": "ckpts", "credentialsSecret": {"name": "s3"}, "intervalSteps": 25}}
    return Rule(f"{tier}-cadence-multiple", f"{tier}.intervalSteps",
                f"checkpoint.{tier}.intervalSteps must be a multiple of a fixed checkpoint.intervalSteps", check=check,
                cel=f"!has(self.{tier}) || !has(self.{tier}.intervalSteps) || type({_INTERVAL}) == string"
                    f" || self.{tier}.intervalSteps % int({_INTERVAL}) == 0",
                example=example)


def _auto_only_with_auto(c: CheckpointSpec) -> str | None:
    return f"intervalSteps is {c.interval_steps}" if c.auto is not None and c.interval_steps != AUTO else None


CheckpointSpec.RULES = (
    _cadence_rule("shared"), _cadence_rule("s3"),
    Rule("auto-needs-auto-interval", "auto", "checkpoint.auto applies only with checkpoint.intervalSteps: auto",
         check=_auto_only_with_auto, cel=f"!has(self.auto) || type({_INTERVAL}) == string", example={"auto": {"minSteps": 5}}),
)
_AUTO_MIN = cel_get("self.minSteps", default_of(AutoCadenceSpec, "min_steps"))
_AUTO_MAX = cel_get("self.maxSteps", default_of(AutoCadenceSpec, "max_steps"))
AutoCadenceSpec.RULES = (
    Rule("auto-bounds-ordered", "minSteps", "checkpoint.auto.minSteps must be <= checkpoint.auto.maxSteps",
         check=lambda a: f"{a.min_steps} > {a.max_steps}" if a.min_steps > a.max_steps else None,
         cel=f"{_AUTO_MIN} <= {_AUTO_MAX}", example={"minSteps": 10, "maxSteps": 5}),
)

_PROGRESS = cel_get("self.progressTimeoutSeconds", default_of(FaultToleranceSpec, "progress_timeout_seconds"))
_HANG = cel_get("self.hangTimeoutSeconds", default_of(FaultToleranceSpec, "hang_timeout_seconds"))
FaultToleranceSpec.RULES = (
    Rule("backstop-after-watchdog", "progressTimeoutSeconds",
         "faultTolerance.progressTimeoutSeconds must be 0 (off) or greater than faultTolerance.hangTimeoutSeconds",
         check=lambda f: (f"{f.progress_timeout_seconds} <= {f.hang_timeout_seconds}"
                          if f.progress_timeout_seconds and f.progress_timeout_seconds <= f.hang_timeout_seconds else None),
         cel=f"{_PROGRESS} == 0 || {_PROGRESS} > {_HANG}",
         example={"progressTimeoutSeconds": 20}),
)


def _bad_world_sizes(spec: LLMTrainJobSpec) -> str | None:
    builtin = spec.trainer.builtin
    if builtin is None:
        return None
    bad = [w for w in spec.world_sizes() if builtin.global_batch_size % (builtin.micro_batch_size * w)]
    if not bad:
        return None
    valid = valid_world_sizes(builtin.global_batch_size, builtin.micro_batch_size)
    return (f"{builtin.global_batch_size} breaks at world sizes {bad} with microBatchSize {builtin.micro_batch_size}; "
            f"world sizes that keep it: {valid[:16]}")


_R_MIN = cel_get("self.replicas.min", default_of(ReplicasSpec, "min"))
_R_MAX = cel_get("self.replicas.max", default_of(ReplicasSpec, "max"))
_GBS = cel_get("self.trainer.builtin.globalBatchSize", default_of(TrainSpec, "global_batch_size"))
_MBS = cel_get("self.trainer.builtin.microBatchSize", default_of(TrainSpec, "micro_batch_size"))
_PPN = cel_get("self.procsPerNode", default_of(LLMTrainJobSpec, "procs_per_node"))
_MPORT = cel_get("self.metrics.port", default_of(MetricsSpec, "port"))
LLMTrainJobSpec.RULES = (
    Rule("metrics-ports-clear-of-health-port", "metrics.port",
         f"metrics.port .. metrics.port + procsPerNode - 1 must not include {HEALTH_PORT}, the launcher's /healthz port",
         check=lambda j: (f"{j.metrics.port} .. {j.metrics.port + j.procs_per_node - 1}"
                          if j.metrics.port <= HEALTH_PORT < j.metrics.port + j.procs_per_node else None),
         cel=f"!({_MPORT} <= {HEALTH_PORT} && {HEALTH_PORT} < {_MPORT} + {_PPN})",
         example={"metrics.port": HEALTH_PORT}),
    Rule("gang-within-replicas", "scheduling.gang.minAvailable", "scheduling.gang.minAvailable must be <= replicas.max",
         check=lambda j: (f"{j.scheduling.gang.min_available} > {j.replicas.max}"
                          if j.scheduling and j.scheduling.gang and j.scheduling.gang.min_available > j.replicas.max else None),
         cel=f"!has(self.scheduling) || !has(self.scheduling.gang) || self.scheduling.gang.minAvailable <= {_R_MAX}",
         example={"scheduling": {"gang": {"minAvailable": 3}}}),
    Rule("healing-needs-builtin-ddp", "faultTolerance.inProcessHealing",
         "faultTolerance.inProcessHealing needs the built-in trainer with strategy kind 'ddp' (a ZeRO shard lost with its "
         "rank has no copy to heal from; your own script heals nothing in process)",
         check=lambda j: (("trainer.command" if j.trainer.builtin is None else f"strategy '{j.trainer.builtin.strategy.kind}'")
                          if j.fault_tolerance.in_process_healing
                          and (j.trainer.builtin is None or j.trainer.builtin.strategy.kind != "ddp") else None),
         cel=f"!{cel_get('self.faultTolerance.inProcessHealing', False)} || (has(self.trainer.builtin) && "
             f"{cel_get('self.trainer.builtin.strategy.kind', 'ddp')} == 'ddp')",
         example={"faultTolerance.inProcessHealing": True, "trainer.builtin.strategy": {"kind": "deepspeed"}}),
    Rule("global-batch-fixed-across-world-sizes", "trainer.builtin.globalBatchSize",
         "trainer.builtin.globalBatchSize must be divisible by microBatchSize x procsPerNode x nodes for every node count "
         "in replicas.min..max (it stays fixed as the world size changes)",
         check=_bad_world_sizes,
         cel=f"!has(self.trainer.builtin) || {cel_literal(range(SPAN_OFFSETS))}.all(i, i > {_R_MAX} - {_R_MIN} || "
             f"{_GBS} % ({_MBS} * {_PPN} * ({_R_MIN} + i)) == 0)",
         example={"replicas": {"min": 2, "max": 4}, "trainer.builtin.globalBatchSize": 16}),
)
