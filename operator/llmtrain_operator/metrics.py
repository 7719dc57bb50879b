"""The operator's own Prometheus metrics.

Names follow Kubeflow's ``training_operator_jobs_*_total`` family, so dashboards port
over: ``llmtrain_operator_jobs_created_total`` and friends, labelled by namespace. The
labels that name a job are the pods' too (``MetricLabel``: ``namespace``, ``llmtrain_job``),
so that a query joins the operator's series with the trainers'.
"""

from __future__ import annotations

from typing import Any

from llmtrain_contract.names import MetricLabel
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

from .api.vocabulary import Phase
from .planner.decisions import Decision, FailureRecorded, JobFinished, JobStarted, RecoveryMeasured, RestartCharged

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)  # process_cpu_seconds_total, process_resident_memory_bytes ...
NS = (MetricLabel.NAMESPACE,)
JOB = (MetricLabel.NAMESPACE, MetricLabel.JOB)

JOBS_CREATED = Counter("llmtrain_operator_jobs_created_total", "Jobs the operator started", NS, registry=REGISTRY)
JOBS_SUCCESSFUL = Counter("llmtrain_operator_jobs_successful_total", "Jobs that Succeeded", NS, registry=REGISTRY)
JOBS_FAILED = Counter("llmtrain_operator_jobs_failed_total", "Jobs that Failed (by name: an alert names the job)", JOB,
                      registry=REGISTRY)
JOBS_RESTARTED = Counter("llmtrain_operator_jobs_restarted_total", "Job restarts (any reason)", NS, registry=REGISTRY)
JOBS_BY_PHASE = Gauge("llmtrain_operator_jobs", "Jobs by phase", ["phase"], registry=REGISTRY)
RESTARTS = Counter("llmtrain_operator_restarts_total", "Restarts counted against budgets, by namespace and reason",
                   [MetricLabel.NAMESPACE, "reason"], registry=REGISTRY)
FAILURES = Counter("llmtrain_operator_failures_detected_total", "Failures detected, by kind", ["kind"], registry=REGISTRY)
DETECT = Histogram("llmtrain_operator_time_to_detect_seconds", "From a failure to the operator acting on it",
                   buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300), registry=REGISTRY)
RECOVER = Histogram("llmtrain_operator_time_to_recover_seconds", "From a detected failure to the first training step after it",
                    buckets=(1, 2, 5, 10, 15, 30, 60, 120, 300, 600), registry=REGISTRY)
# Log-spaced (x1.5) from 1 ms to ~7 min: fine enough to read p50/p99 off the buckets, and
# wide enough that an overloaded operator's queue shows its true size, not the top bucket.
RECONCILE_BUCKETS = tuple(round(0.001 * 1.5**i, 6) for i in range(33))
RECONCILE = Histogram("llmtrain_operator_reconcile_duration_seconds",
                      "One reconcile pass (observe, plan, write), without the wait for a slot",
                      buckets=RECONCILE_BUCKETS, registry=REGISTRY)
QUEUE = Histogram("llmtrain_operator_reconcile_queue_seconds",
                  "Wait of a due pass for a free slot (LLMTRAIN_OPERATOR_MAX_CONCURRENT_RECONCILES) before it runs",
                  buckets=RECONCILE_BUCKETS, registry=REGISTRY)
EVENT_TO_ACTION = Histogram("llmtrain_operator_event_to_action_seconds",
                            "From a watch event about a job to the acknowledgement of the writes of the pass that answered it "
                            "(the wait for a slot, probes and failed attempts included)",
                            buckets=RECONCILE_BUCKETS, registry=REGISTRY)
LEADER = Gauge("llmtrain_operator_leader", "1 while this replica holds the leader Lease and may write", registry=REGISTRY)
GOODPUT = Gauge("llmtrain_operator_job_goodput_ratio", "Effective training time ratio of a job so far", JOB, registry=REGISTRY)
ETTR = Gauge("llmtrain_operator_job_ettr_ratio", "Effective training time ratio of a job so far, counting only preserved progress "
             "(replayed steps are not good time)", JOB, registry=REGISTRY)

_PHASES: dict[tuple[str, str], str] = {}


def serve(port: int) -> None:
    if port:
        start_http_server(port, registry=REGISTRY)


def set_leader(leading: bool) -> None:
    LEADER.set(1 if leading else 0)


def record_queue_wait(seconds: float) -> None:
    QUEUE.observe(seconds)


def record_event_to_action(seconds: float) -> None:
    EVENT_TO_ACTION.observe(seconds)


def record_pass(namespace: str, name: str, decisions: list[Decision], status: dict[str, Any], seconds: float) -> None:
    """One recorded pass: its duration, each of its decisions, the job's phase and goodput."""
    RECONCILE.observe(seconds)
    # Born at 0: a series that first appears at 1 has no increase, and the alert on it
    # (LLMTrainJobFailed) would never fire.
    JOBS_FAILED.labels(namespace, name)
    for decision in decisions:
        if isinstance(decision, JobStarted):
            JOBS_CREATED.labels(namespace).inc()
        elif isinstance(decision, JobFinished):
            if decision.succeeded:
                JOBS_SUCCESSFUL.labels(namespace).inc()
            else:
                JOBS_FAILED.labels(namespace, name).inc()
        elif isinstance(decision, RestartCharged):
            RESTARTS.labels(namespace, decision.reason).inc()
            JOBS_RESTARTED.labels(namespace).inc()
        elif isinstance(decision, FailureRecorded):
            FAILURES.labels(decision.kind).inc()
            if decision.detect_seconds is not None:
                DETECT.observe(decision.detect_seconds)
        elif isinstance(decision, RecoveryMeasured):
            RECOVER.observe(decision.seconds)
    if status.get("goodput") is not None:
        GOODPUT.labels(namespace, name).set(status["goodput"])
    if status.get("ettr") is not None:
        ETTR.labels(namespace, name).set(status["ettr"])
    _PHASES[(namespace, name)] = status.get("phase") or Phase.PENDING
    _refresh_phases()


def forget(namespace: str, name: str) -> None:
    _PHASES.pop((namespace, name), None)
    for series in (GOODPUT, ETTR, JOBS_FAILED):
        try:
            series.remove(namespace, name)
        except KeyError:
            pass
    _refresh_phases()


def _refresh_phases() -> None:
    counts: dict[str, int] = {}
    for phase in _PHASES.values():
        counts[phase] = counts.get(phase, 0) + 1
    for phase in Phase:
        JOBS_BY_PHASE.labels(phase.value).set(counts.get(phase, 0))
