"""Operator configuration from ``LLMTRAIN_OPERATOR_*`` environment variables.

One frozen dataclass; every field documents its variable, unit, default and why. A bad
value raises :class:`ConfigError` naming the variable, before the operator starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from . import __version__

PREFIX = "LLMTRAIN_OPERATOR_"
DEFAULT_RUNTIME_IMAGE = f"ghcr.io/llmtrain/operator:{__version__}"
DEFAULT_NODE_FAILURE_CONDITIONS = frozenset({"KernelDeadlock", "ReadonlyFilesystem"})
"""node-problem-detector's two permanent node problems."""


class ConfigError(ValueError):
    """A misconfigured environment variable (the message names it)."""


@dataclass(frozen=True)
class OperatorSettings:
    namespace: str = ""
    """``LLMTRAIN_OPERATOR_NAMESPACE``: watch only this namespace. Default "": cluster-wide."""

    leader_election: bool = True
    """``LLMTRAIN_OPERATOR_LEADER_ELECTION``: only the holder of a ``coordination.k8s.io``
    Lease writes; the other replicas watch and stand by. Default true. Off for a single
    replica run outside a cluster (tests)."""

    lease_name: str = "llmtrain-operator"
    """``LLMTRAIN_OPERATOR_LEASE_NAME``: the leader-election Lease. Default
    ``llmtrain-operator``."""

    lease_namespace: str = ""
    """``LLMTRAIN_OPERATOR_LEASE_NAMESPACE``: where the Lease lives. Default "": the
    operator pod's own namespace (``POD_NAMESPACE``)."""

    lease_duration_seconds: float = 15.0
    """``LLMTRAIN_OPERATOR_LEASE_DURATION_SECONDS``: a standby takes the Lease over when
    it has not changed for this long (by the standby's own clock). Seconds. Default 15
    (controller-runtime's default)."""

    renew_deadline_seconds: float = 10.0
    """``LLMTRAIN_OPERATOR_RENEW_DEADLINE_SECONDS``: the leader stops writing when it
    could not renew for this long; shorter than the Lease duration, so it has stopped
    before anybody may take over. Seconds. Default 10."""

    retry_period_seconds: float = 2.0
    """``LLMTRAIN_OPERATOR_RETRY_PERIOD_SECONDS``: how often the leader renews and a
    standby retries. Seconds. Default 2."""

    resync_seconds: float = 10.0
    """``LLMTRAIN_OPERATOR_RESYNC_SECONDS``: a job is re-planned at least this often even
    without events (timers, probes). Seconds. Default 10."""

    probe_timeout_seconds: float = 1.0
    """``LLMTRAIN_OPERATOR_PROBE_TIMEOUT_SECONDS``: timeout of one page read (a trainer's or
    a launcher's), from the moment it holds a connection; greater than 0. Seconds.
    Default 1: a slow trainer must not slow every job's pass."""

    probe_pods_per_pass: int = 64
    """``LLMTRAIN_OPERATOR_PROBE_PODS_PER_PASS``: a job with more running workers than this
    has only some read at each pass: those whose answer matters now, and this many more,
    read longest ago; all of them when an answer shows a failure or a restart
    (``handlers/probing.py``). Default 64: a job of up to 64 workers is read whole at
    every pass (up to 8 when many jobs share ``PROBE_PAGES_PER_SECOND``); one of 1,024 in
    16 passes at most. 0: every worker at every pass."""

    probe_pages_per_second: float = 200.0
    """``LLMTRAIN_OPERATOR_PROBE_PAGES_PER_SECOND``: the pages all jobs' passes read, about,
    beyond their urgent ones: with many jobs being read each reads fewer than
    ``PROBE_PODS_PER_PASS`` workers a pass (8 at least), so that the probes of 64 jobs of
    128 workers do not starve the event loop that answers their failures
    (``handlers/probing.py``, ``pods_per_pass``). Default 200. 0: no limit but the cap."""

    check_secrets: bool = True
    """``LLMTRAIN_OPERATOR_CHECK_SECRETS``: read a job's S3 credentials Secret (never its
    data's use: only whether it exists) before creating pods, so that a missing one makes
    the job ``Invalid`` without a pod. Default true. The chart turns it off in
    cluster-wide mode, where it would need ``get`` on Secrets in every namespace: a
    missing Secret is then reported from the worker pods, which wait in
    ``CreateContainerConfigError`` naming it."""

    probes_enabled: bool = True
    """``LLMTRAIN_OPERATOR_PROBES``: scrape trainers for step/checkpoint progress.
    Default true. Off in API-contract tests, where pods have no IPs."""

    api_threads: int = 32
    """``LLMTRAIN_OPERATOR_API_THREADS``: threads for Kubernetes API calls (the client is
    synchronous). Default 32: enough for a burst of new jobs without queueing."""

    max_concurrent_reconciles: int = 8
    """``LLMTRAIN_OPERATOR_MAX_CONCURRENT_RECONCILES``: passes doing API work at once,
    across all jobs (controller-runtime's ``MaxConcurrentReconciles``; trainer probes run
    before a pass takes its slot). Default 8. A burst of new jobs then queues for a slot
    instead of sharing the API server 500 ways; the wait is exported as
    ``llmtrain_operator_reconcile_queue_seconds``, apart from the pass duration."""

    metrics_port: int = 8080
    """``LLMTRAIN_OPERATOR_METRICS_PORT``: the operator's own Prometheus endpoint; 0 off.
    Default 8080."""

    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    """``LLMTRAIN_OPERATOR_RUNTIME_IMAGE``: the image whose copy of the launcher, script
    runner and rendezvous store the pods of a ``trainer.command`` job run, copied in by an
    init container (docs/custom-scripts.md), so that a user's image needs only Python and
    torch. Default: this operator's own image, which has them; the chart passes the image
    it deploys."""

    allow_privileged_pods: bool = False
    """``LLMTRAIN_OPERATOR_ALLOW_PRIVILEGED_PODS``: accept a ``podTemplate`` that makes the
    job's pods privileged, puts them in the host's network, PID or IPC namespace, mounts a
    ``hostPath`` or adds capabilities beyond ``SYS_PTRACE`` (``planner/podpolicy.py``).
    Default false: creating an LLMTrainJob must not be a way to create any pod."""

    allowed_service_accounts: str = ""
    """``LLMTRAIN_OPERATOR_ALLOWED_SERVICE_ACCOUNTS``: comma-separated service accounts a
    ``podTemplate`` may name (one bound to cloud credentials for S3, say), ``*`` for any.
    Default "": none; the pods mount no token."""

    node_failure_conditions: str = ",".join(sorted(DEFAULT_NODE_FAILURE_CONDITIONS))
    """``LLMTRAIN_OPERATOR_NODE_FAILURE_CONDITIONS``: comma-separated node condition types
    that, True on a node, make the operator drain the job's pods from it (SIGTERM: each
    rank's emergency checkpoint) and quarantine it for the job before any rank fails
    (``planner/policies/node_health.py``). Default node-problem-detector's two permanent
    problems; add a GPU health agent's condition types. A node whose ``nvidia.com/gpu``
    allocatable falls below its capacity (NVIDIA's device plugin takes a GPU with an XID
    error out) is drained the same way, whatever this lists."""

    network_policy: bool = False
    """``LLMTRAIN_OPERATOR_NETWORK_POLICY``: give each job a NetworkPolicy that admits only
    the job's own pods to its pods, and the operator (and the metrics readers below) to
    their health and metrics ports (``planner/isolation.py``); a job's pods are created
    once its policy is seen. Default false (a run outside a cluster); the chart turns it on
    (``networkPolicy.jobs.enabled``). Needs the two settings below and ``POD_NAMESPACE``."""

    network_policy_operator_pods: str = ""
    """``LLMTRAIN_OPERATOR_NETWORK_POLICY_OPERATOR_PODS``: ``key=value,...``, the labels that
    select the operator's own pods in ``POD_NAMESPACE`` (the chart passes its selector
    labels): the peers that probe the jobs' pods."""

    network_policy_metrics_from: str = ""
    """``LLMTRAIN_OPERATOR_NETWORK_POLICY_METRICS_FROM``: comma-separated namespaces (their
    pods) and CIDRs that may also read the jobs' health and metrics ports (Prometheus, for
    the chart's PodMonitor). Default "": the operator alone."""

    token_key_file: str = ""
    """``LLMTRAIN_OPERATOR_TOKEN_KEY_FILE``: a file holding the key each job's token is
    drawn from (an HMAC of the job's uid: ``planner/tokens.py``); the chart mounts it from
    a Secret it keeps across upgrades. Default "": a random key for this process, so a
    job's token Secret deleted by hand and made again after the operator restarted holds
    another token than the job's running pods (its store refuses the new pods until it is
    restarted too)."""

    def failure_conditions(self) -> frozenset[str]:
        return frozenset(t.strip() for t in self.node_failure_conditions.split(",") if t.strip())

    progress_writes_per_second: float = 20.0
    """``LLMTRAIN_OPERATOR_PROGRESS_WRITES_PER_SECOND``: status writes that would only
    report progress (the step and when it advanced), across all jobs. Default 20. Up to
    ``20 x resyncSeconds`` jobs (200 at the defaults) this changes nothing; beyond, each
    job's step in the status is written at most every ``jobs / 20`` seconds (25 s at 500
    jobs), so the API server's load stays flat as jobs are added. A status with any other
    change (a phase, a condition, a failure, a checkpoint) is written at once. 0: no limit."""

    status_flush_seconds: float = 60.0
    """``LLMTRAIN_OPERATOR_STATUS_FLUSH_SECONDS``: when only time accounting changed, the
    status is written at most this often. Seconds. Default 60: an idle job costs no
    writes, and goodput stays at most a minute stale."""


AT_LEAST_ONE = frozenset({"api_threads", "max_concurrent_reconciles"})
"""Counts where 0 would stop all work (no thread, no slot) rather than turn a feature off."""
POSITIVE = frozenset({"lease_duration_seconds", "renew_deadline_seconds", "retry_period_seconds", "probe_timeout_seconds"})


def _parse(name: str, raw: str, kind: type) -> object:
    var = PREFIX + name.upper()
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a valid {kind.__name__}") from None
    if kind in (int, float) and value < 0:
        raise ConfigError(f"{var}={raw!r} must not be negative")
    if name.lower() in AT_LEAST_ONE and value < 1:
        raise ConfigError(f"{var}={raw!r} must be at least 1")
    if name.lower() in POSITIVE and value <= 0:
        raise ConfigError(f"{var}={raw!r} must be greater than 0")
    return value


def from_env(env: dict[str, str] | None = None) -> OperatorSettings:
    env = dict(os.environ if env is None else env)
    known = {PREFIX + f.name.upper() for f in fields(OperatorSettings)} | {PREFIX + "PROBES"}
    unknown = sorted(k for k in env if k.startswith(PREFIX) and k not in known)
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}  # each parsed to its field's type by _parse
    for f in fields(OperatorSettings):
        var = "PROBES" if f.name == "probes_enabled" else f.name.upper()
        if PREFIX + var in env:
            kind = type(f.default)
            values[f.name] = _parse(var, env[PREFIX + var], kind)
    settings = OperatorSettings(**values)
    # client-go's own checks: a leader must stop writing before its Lease can expire,
    # and must get more than one renewal attempt before it stops.
    if settings.renew_deadline_seconds >= settings.lease_duration_seconds:
        raise ConfigError(f"{PREFIX}RENEW_DEADLINE_SECONDS ({settings.renew_deadline_seconds:g}) must be less than "
                          f"{PREFIX}LEASE_DURATION_SECONDS ({settings.lease_duration_seconds:g})")
    if settings.retry_period_seconds * 1.2 >= settings.renew_deadline_seconds:
        raise ConfigError(f"{PREFIX}RETRY_PERIOD_SECONDS ({settings.retry_period_seconds:g}) must be well below "
                          f"{PREFIX}RENEW_DEADLINE_SECONDS ({settings.renew_deadline_seconds:g}): at most 1/1.2 of it")
    return settings
