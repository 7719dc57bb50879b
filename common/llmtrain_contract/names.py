"""Every name the operator and the trainer must agree on, in one place: environment
variables, metric names, termination-message keys, ports, annotations and paths.

The operator renders pods (and ``llmtrain run`` starts processes) with these names; the
trainer, its launcher and user scripts read them; dashboards and alerts query the metric
names. A name spelled twice drifts, so both sides import it from here.
"""

from __future__ import annotations


class Env:
    """Environment variables of a worker (pod or local process)."""

    POD_NAME = "POD_NAME"
    POD_NAMESPACE = "POD_NAMESPACE"
    POD_IP = "POD_IP"
    """The downward API's usual names; ``llmtrain run`` sets them too."""

    JOB = "LLMTRAIN_JOB"
    """The job's name."""
    RUN_DIR = "LLMTRAIN_RUN_DIR"
    """Per-pod scratch: exit records, step log, the metrics port file."""
    HANG_TIMEOUT_SECONDS = "LLMTRAIN_HANG_TIMEOUT_SECONDS"
    PREFLIGHT_MIN_MBPS = "LLMTRAIN_PREFLIGHT_MIN_MBPS"
    """The launcher's pre-flight floor (``faultTolerance.preflightMinMbps``): below it, through
    the rendezvous store and back, the pod exits ``PREFLIGHT_FAILED`` before it joins."""
    COLLECTIVE_TIMEOUT_SECONDS = "LLMTRAIN_COLLECTIVE_TIMEOUT_SECONDS"
    CHECKPOINT_DIR = "LLMTRAIN_CHECKPOINT_DIR"
    """Tier 1 (node-local) checkpoint directory."""
    SHARED_CHECKPOINT_DIR = "LLMTRAIN_SHARED_CHECKPOINT_DIR"
    """Tier 2 (shared filesystem) checkpoint directory, when configured."""
    S3_URI = "LLMTRAIN_S3_URI"
    """Tier 3, ``s3://bucket/prefix``, when configured."""
    CHECKPOINT_TIERS = "LLMTRAIN_CHECKPOINT_TIERS"
    """A script job's tiers as the built-in trainer's config lists them (JSON: name, uri,
    keep, intervalSteps, S3 settings), for the checkpoint API (``llmtrain_trainer/checkpoints.py``)."""
    JOB_UID = "LLMTRAIN_JOB_UID"
    """A script job's uid: what its checkpoints are owned by (``llmtrain_store.owner``)."""
    PROGRESS_FILE = "LLMTRAIN_PROGRESS_FILE"
    """Where a user's script may write its step, a number a line, to report progress
    (docs/custom-scripts.md); the launcher serves it as ``LauncherMetric.STEP``."""
    TERMINATION_LOG = "LLMTRAIN_TERMINATION_LOG"
    """Where the launcher writes the pod's termination message."""
    LOG_LEVEL = "LLMTRAIN_LOG_LEVEL"
    SUPERVISED = "LLMTRAIN_SUPERVISED"
    """Set to 1 by the launcher: its supervisor watches the ranks' heartbeats from outside."""
    ZYGOTE = "LLMTRAIN_ZYGOTE"
    """The socket of the pod's fork server (``llmtrain_trainer.launch.zygote``), set by the launcher
    for the built-in trainer; a user may set it to ``0`` to start every rank from scratch."""
    RDZV_TOKEN = "LLMTRAIN_RDZV_TOKEN"
    """The job's token (the Secret the operator makes for each job, ``<job>-token``), in the
    store's pod and the workers': the rendezvous state is signed with it and the store's
    lease port answers only lines that carry its MAC (``rendezvous/leases.py``). The torchrun
    agent takes it out of the ranks' environment (``pod/rdzvstate.py`` spells it too)."""
    PREFETCH = "LLMTRAIN_PREFETCH"
    """``0``: the launcher does not pull the job's newest checkpoint into tier 1 at pod
    start (``llmtrain_trainer.checkpoint.prefetch``); the restore pulls it on demand."""
    ADMIT_AFTER_FIRST_STEP = "LLMTRAIN_ADMIT_AFTER_FIRST_STEP"
    """The run dir whose heartbeat files the torchrun agent reads before it admits a
    waiting node (set by the launcher for the built-in trainer). ``torchrun_agent.py``
    spells it too: it imports nothing of this project's packages."""
    HEAL_STORE = "LLMTRAIN_HEAL_STORE"
    """``host:port/run-id``: the job's rendezvous store and run, where the ranks of a job
    with ``faultTolerance.inProcessHealing`` form their process groups and the torchrun
    agent counts the ranks it restarts in place. Set by the launcher only for such a job
    (``torchrun_agent.py`` spells it too)."""
    VICTIM_EXIT_CODES = "LLMTRAIN_VICTIM_EXIT_CODES"
    """Set with ``HEAL_STORE``: the exit codes of a rank that ended because a peer failed,
    which torchrun's agent restarts through a rendezvous, never in place."""
    FORKED_FOR = "LLMTRAIN_FORKED_FOR"
    """In a rank forked by the zygote: the pid torchrun started (the rank's stand-in), whose
    parent is the torchrun agent."""
    DIST_BACKEND = "LLMTRAIN_DIST_BACKEND"
    """``gloo`` or ``nccl``; default NCCL on a GPU, gloo on CPU. gloo lets several ranks
    share one GPU (NCCL refuses two ranks on one device)."""
    PERMANENT_EXIT_CODES = "LLMTRAIN_PERMANENT_EXIT_CODES"
    """Set by the launcher for torchrun's agent: the codes it never restarts in place
    (``torchrun_agent.py`` spells it too)."""
    FAULT_INJECT = "LLMTRAIN_FAULT_INJECT"
    """TEST ONLY: faults to inject (``llmtrain_trainer.train.faults``)."""
    FAULT_STATE_DIR = "LLMTRAIN_FAULT_STATE_DIR"
    """TEST ONLY: where fired faults are remembered (default: the run dir)."""

    AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
    AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
    AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
    """boto3's own names: the S3 credentials and endpoint."""

    PREFIX = "LLMTRAIN_"


class Metric:
    """The trainer's Prometheus metric names (counters without their ``_total``, which
    the client library appends)."""

    PREFIX = "llmtrain_trainer"
    STEP = f"{PREFIX}_step"
    SAMPLES = f"{PREFIX}_samples_consumed"
    LOSS = f"{PREFIX}_loss"
    MFU = f"{PREFIX}_mfu"
    """Model FLOPs utilisation of the newest step (``llmtrain_contract.flops``): absent on
    a CPU or a GPU missing from the peak table."""
    TOKENS = f"{PREFIX}_tokens"
    """Counter: tokens the node's ranks trained on, exported by its local rank 0 only, so
    that ``sum(rate(llmtrain_trainer_tokens_total[5m]))`` over a job's pods is its
    throughput (every rank's endpoint may be scraped: the others stay at 0)."""
    STEP_SECONDS = f"{PREFIX}_step_seconds"
    TOKENS_PER_SECOND = f"{PREFIX}_tokens_per_second"
    """The job's throughput over its newest step: the global batch's tokens over the
    step's wall time, the same on every rank (the operator shows it in the status)."""
    WORLD_SIZE = f"{PREFIX}_world_size"
    LAST_STEP_TIMESTAMP = f"{PREFIX}_last_step_timestamp_seconds"
    WORKER_GROUP_RESTARTS = f"{PREFIX}_worker_group_restarts"
    FAILED_ATTEMPTS = f"{PREFIX}_failed_attempts"
    """Label ``cause``: crash | hang | victim | preempted | permanent | gpu_oom (this one only
    once it happened: ``FAILED_ATTEMPT_CAUSES``)."""
    CHECKPOINT_STALL_SECONDS = f"{PREFIX}_checkpoint_stall_seconds"
    CHECKPOINT_PERSIST_SECONDS = f"{PREFIX}_checkpoint_persist_seconds"
    """Label ``tier``: from the snapshot to the commit in that tier."""
    CHECKPOINT_PERSISTED_BYTES = f"{PREFIX}_checkpoint_persisted_bytes"
    CHECKPOINT_RESTORE_SECONDS = f"{PREFIX}_checkpoint_restore_seconds"
    CHECKPOINT_RESTORED_BYTES = f"{PREFIX}_checkpoint_restored_bytes"
    CHECKPOINT_LAST_STEP = f"{PREFIX}_checkpoint_last_step"
    """Label ``tier``."""
    CHECKPOINT_LAST_TIMESTAMP = f"{PREFIX}_checkpoint_last_timestamp_seconds"
    CHECKPOINT_FAILURES = f"{PREFIX}_checkpoint_failures"
    """Labels ``tier``, ``reason``."""
    CHECKPOINT_TIER_HEALTHY = f"{PREFIX}_checkpoint_tier_healthy"
    """Label ``tier``: 1 healthy, 0 degraded."""
    CHECKPOINT_TIER_DEGRADED = f"{PREFIX}_checkpoint_tier_degraded"
    """Labels ``tier``, ``reason``: 1 for the reason a tier is degraded now."""
    CHECKPOINT_DEFERRED = f"{PREFIX}_checkpoint_deferred"
    """Checkpoints that fell due while the previous one was still being written."""
    CHECKPOINT_INTERVAL_STEPS = f"{PREFIX}_checkpoint_interval_steps"
    CHECKPOINT_COST_SECONDS = f"{PREFIX}_checkpoint_cost_seconds"
    """Adaptive cadence input: a checkpoint's cost to the training (stall plus write
    interference)."""
    CHECKPOINT_LATENCY_SECONDS = f"{PREFIX}_checkpoint_latency_seconds"
    """Adaptive cadence input: a checkpoint's write latency, snapshot to tier-1 commit
    (the interval is at least twice it)."""
    CHECKPOINT_MTBF_SECONDS = f"{PREFIX}_checkpoint_mtbf_seconds"
    """Adaptive cadence input: the job's mean time between failures."""
    CHECKPOINT_CADENCE_STEP_SECONDS = f"{PREFIX}_checkpoint_cadence_step_seconds"
    """Adaptive cadence input: the typical step time (the median of the recent steps) that
    converts the optimal seconds between checkpoints into steps."""
    NUMERICS_ROLLBACKS = f"{PREFIX}_numerics_rollbacks"
    """Gauge: the job's rollbacks for bad numerics (a non-finite or spiking loss)."""
    SKIPPED_SAMPLES = f"{PREFIX}_skipped_samples"
    """Gauge per skipped window, labels ``first_step``, ``last_step`` (the steps redone)
    and ``first_sample``, ``end_sample`` (the global sample range never trained on)."""
    STRAGGLER = f"{PREFIX}_straggler"
    """Gauge per straggling rank of the pod's node, label ``rank``: its local step time over
    the other ranks' median (exported by the node's local rank 0)."""
    HEALS = f"{PREFIX}_heals"
    """Counter, label ``role``: in-process heals (``inProcessHealing``) this process took
    part in. ``survivor``: a round it formed after a collective failed, the state then in
    every rank; ``replacement``: the round a rank restarted in place started in, its state
    received from a survivor (a process starts at 0: a replacement counts 1 at most)."""
    HEAL_ROUNDS = f"{PREFIX}_heal_rounds"
    """Gauge: in-process heals over the job (the rounds that passed a survivor's state to
    restarted or replacement ranks), the same on every rank: it travels with the state and
    the checkpoints (``numerics.DataPosition``), so a process that restarted still says it."""
    HEAL_SECONDS = f"{PREFIX}_heal_seconds"
    """Histogram, label ``role``: a survivor's seconds from the failed collective reaching
    the loop to the state in every rank (rounds that failed first included); a
    replacement's from the loop's start to the state received: its engine built and the
    state sent, not its process's start or its round's forming, which come before."""
    INFO = f"{PREFIX}_info"

    @staticmethod
    def total(name: str) -> str:
        """A counter's sample name as scraped."""
        return f"{name}_total"


class MetricLabel:
    """The labels that name a job on every llmtrain series, the operator's and the pods'
    alike, so that one query joins them. The operator exports both (its ServiceMonitor
    honours them); a pod's series get both from the PodMonitor's target labels."""

    NAMESPACE = "namespace"
    JOB = "llmtrain_job"
    """The LLMTrainJob's name. Not ``job``: Prometheus owns that label (the scrape job)."""


class LauncherMetric:
    """What the worker pod's launcher serves on ``/metrics`` beside its ``/healthz``
    (``HEALTH_PORT``): it outlives the ranks' in-place restarts."""

    PREFIX = "llmtrain_launcher"
    FAILED_ATTEMPTS = f"{PREFIX}_failed_attempts"
    """Counter, label ``cause`` as ``Metric.FAILED_ATTEMPTS``: counted the moment torchrun
    starts the next attempt."""
    ATTEMPT = f"{PREFIX}_worker_group_attempt"
    """Gauge: the attempt the local worker group runs (torchrun's restart count)."""
    WORKERS_RUNNING = f"{PREFIX}_workers_running"
    """Gauge: 1 while torchrun's worker processes run (``/readyz`` answers 200 then)."""
    STEP = f"{PREFIX}_step"
    """Gauge: the largest step a user's script reported in ``LLMTRAIN_PROGRESS_FILE``;
    absent until one does (the built-in trainer reports ``Metric.STEP`` itself)."""
    LAST_STEP_TIMESTAMP = f"{PREFIX}_last_step_timestamp_seconds"
    """Gauge: when the script last reported a step."""
    OOM_KILLS = f"{PREFIX}_oom_kills"
    """Counter: processes the kernel's OOM killer ended in this container (its memory
    cgroup's count) since the launcher started; absent when the cgroup cannot be read."""
    MEMORY_PEAK = f"{PREFIX}_memory_peak_bytes"
    """Gauge: the container's memory peak (its cgroup's high-water mark)."""
    MEMORY_LIMIT = f"{PREFIX}_memory_limit_bytes"
    """Gauge: the container's memory limit; absent when it has none."""
    PEER_WAIT = f"{PREFIX}_peer_wait_seconds"
    """Gauge: seconds since this pod's supervisor judged its ranks victims, blocked in a
    collective on a peer that stopped participating; served while none of the pod's ranks
    has made progress since (at least ``PEER_WAIT_SHOWN_SECONDS``), absent otherwise. The
    operator replaces a pod its peers wait on that does not answer and is not ready
    (``frozen_pods.py``)."""


PEER_WAIT_SHOWN_SECONDS = 15.0
"""``LauncherMetric.PEER_WAIT`` stays served this long after its verdict even when the
pod's ranks train again at once (an elastic job re-formed without the silent peer): the
operator, probing every second while a pod is silent, sees it."""


FAILED_ATTEMPT_CAUSES = ("crash", "hang", "victim", "preempted", "permanent", "gpu_oom")
"""What ended a failed attempt, the ``cause`` label of the trainer's and the launcher's
failed-attempts counters; the operator ignores any other. ``gpu_oom``: a rank of the pod
ran out of GPU memory (exit ``GPU_OUT_OF_MEMORY``), a crash named apart, reported only
once it happened: an operator older than it refuses counts that name it
(docs/exit-codes.md)."""


class Termination:
    """Keys of the JSON termination message the launcher writes and the operator reads."""

    CODE = "code"
    REASON = "reason"
    RANK = "rank"
    STEP = "step"
    MESSAGE = "message"
    CHECKPOINTS = "checkpoints"
    """Tier -> the newest step the pod's ranks saw committed there (their metrics are gone
    once the pod ends, so the final checkpoint is reported here)."""
    LAST_STEP = "lastStep"
    """``{"step": N, "loss": L}``: the newest step the pod's ranks finished and its agreed
    loss (a job that ends between two scrapes would otherwise keep the loss of an earlier
    step in its status)."""
    OOM = "oom"
    """Present when the pod ended because the kernel's OOM killer ended a rank:
    ``{"kills": N, "peakBytes": P, "limitBytes": L}`` (the container's memory cgroup; peak
    or limit null when unknown or unlimited). The reason is then ``OOMKilled``."""
    FAILED_ATTEMPTS = "failedAttempts"
    """cause -> the pod's failed attempts before its last (``failed_attempts_total``'s
    count at the end): an in-place restart just before the pod ended may have had no
    scrape to show it."""
    MEMORY = "memory"
    """``{"oomKills": N, "peakBytes": P, "limitBytes": L}``: the container's memory cgroup
    at the end (``LauncherMetric.OOM_KILLS`` and the gauges), whatever the exit."""
    COUNTED_IN_PLACE = "countedInPlace"
    """Present when the pod's last attempt hung and the launcher had already counted it as
    an in-place failure: its ``failed_attempts{cause="hang"}`` including that attempt. An
    operator that saw that count has charged this failure already."""


RDZV_PORT = 29400
"""The rendezvous store's port (its own pod, its own Service)."""
RDZV_LEASE_PORT_OFFSET = 1
"""The store's process holds the launchers' rendezvous leases on its port + this."""
METRICS_PORT = 9400
"""Default port of local rank 0's metrics endpoint; local rank r serves on port + r."""
HEALTH_PORT = 9399
"""The launcher's ``/healthz`` (the worker pod's liveness probe) and ``/metrics``
(``LauncherMetric``)."""
CONFIG_HASH_ANNOTATION = "llmtrain.io/config-hash"
GANG_MIN_AVAILABLE_ANNOTATION = "llmtrain.io/gang-min-available"
"""On a gang job's pods: the gang's minimum (a hint beside the scheduler's own PodGroup)."""
"""On the rendered-config ConfigMap: the hash of its content."""
TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default termination-message path."""


TIER_REASONS = {
    "NoSpace": "the filesystem is full",
    "PermissionDenied": "permission denied (check the volume's owner and mode)",
    "ReadOnly": "the filesystem is read-only",
    "IOError": "an I/O error on the device",
    "Unreachable": "the endpoint cannot be reached",
    "CredentialsRefused": "the credentials were refused (check the credentials Secret)",
    "NoCredentials": "no credentials were found (check the credentials Secret)",
    "NoSuchBucket": "the bucket does not exist",
    "ServerError": "the server answered with an error (5xx)",
    "Throttled": "the server throttles requests",
    "Timeout": "the operation timed out",
    "Corrupt": "what was written does not verify",
    "Error": "an unexpected error",
}
"""Why a checkpoint tier is degraded: the ``reason`` label of the trainer's tier metrics,
and what it means (the operator's condition message says it). Never a remote service's
own error text, which may quote a credential."""
