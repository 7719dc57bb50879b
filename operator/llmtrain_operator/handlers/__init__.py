"""kopf registration: thin adapters around ``reconcile``.

Run with ``kopf run -m llmtrain_operator.handlers`` (the chart does).

- One daemon per LLMTrainJob loops: reconcile, then sleep until the planner's next timer
  or until a watch event about the job, its pods, or a node wakes it.
- kopf indexes (fed by watches) hold the observed pods, nodes, services and configs, so
  a pass makes no read calls when nothing changed.
- State lives in the job's status, never in this process: a restarted (or failed-over)
  operator resumes every job where it was, without touching running pods.
"""

from __future__ import annotations

import asyncio
import hashlib
from concurrent.futures import ThreadPoolExecutor
import logging
import os
from typing import Any

import kopf

from .. import metrics
from ..api.job import GROUP, PLURAL, VERSION
from ..api.observed import LABEL_JOB
from ..k8s.client import K8s, PermanentApiError, TransientApiError
from ..settings import OperatorSettings, from_env
from .reconcile import Children, reconcile
from .slots import Slots

SETTINGS = OperatorSettings()
"""Replaced at startup from ``LLMTRAIN_OPERATOR_*`` (a bad value stops the operator with
a message naming the variable)."""
_K8S: K8s | None = None
_WAKE: dict[tuple[str, str], asyncio.Event] = {}
_SLOTS: Slots | None = None
"""At most ``max_concurrent_reconciles`` passes' API work at once, across jobs (set at startup)."""
JOB_SELECTOR = {LABEL_JOB: kopf.PRESENT}


def _wake(namespace: str | None, name: str | None) -> None:
    event = _WAKE.get((namespace or "default", name or ""))
    if event is not None:
        event.set()


def priority_from_pod_name(name: str) -> int:
    """HA replicas need distinct peering priorities: with equal ones kopf warns of
    "conflicting operators" and every replica pauses, so no job is reconciled. Derive one
    from the pod name when none is configured, over 31 bits: a space of 10,000 once gave
    two replicas of one ReplicaSet the same priority in CI (1 in 2e9 now)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % (2**31 - 1) + 1 if name else 0


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _K8S, SETTINGS, _SLOTS
    SETTINGS = from_env()
    _SLOTS = Slots(SETTINGS.max_concurrent_reconciles)
    settings.peering.name = SETTINGS.peering_name
    settings.peering.priority = SETTINGS.priority or priority_from_pod_name(os.environ.get("POD_NAME", ""))
    settings.peering.standalone = SETTINGS.standalone
    settings.peering.clusterwide = not SETTINGS.namespace
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="llmtrain.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="llmtrain.io")
    settings.posting.level = logging.WARNING  # our own Events say what happened
    settings.watching.server_timeout = 300  # re-list before the API server expires a watch (410)
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    _K8S = K8s.from_environment()
    metrics.serve(SETTINGS.metrics_port)
    # API calls run in threads (the Kubernetes client is synchronous); the default pool
    # (cores + 4) would queue a burst of new jobs' creates behind each other.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=SETTINGS.api_threads, thread_name_prefix="k8s-api"))


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else $KUBECONFIG (read at call time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


# ---------------------------------------------------------------- indexes (observed state)


@kopf.index("pods", labels=JOB_SELECTOR)
def pods_by_job(namespace: str, labels: dict[str, str], body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): dict(body)}


@kopf.index("nodes")
def nodes_by_name(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: dict(body)}


@kopf.index("services", labels=JOB_SELECTOR)
def services_by_job(namespace: str, name: str, labels: dict[str, str], **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): name}


@kopf.index("configmaps", labels=JOB_SELECTOR)
def configmaps_by_job(namespace: str, name: str, labels: dict[str, str], annotations: dict[str, str], **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): (name, annotations.get("llmtrain.io/config-hash", ""))}


# ---------------------------------------------------------------- wake-ups


@kopf.on.event("pods", labels=JOB_SELECTOR)
def pod_changed(namespace: str, labels: dict[str, str], **_: Any) -> None:
    _wake(namespace, labels.get(LABEL_JOB))


@kopf.on.event("nodes")
def node_changed(**_: Any) -> None:
    for event in _WAKE.values():
        event.set()


@kopf.on.event(GROUP, VERSION, PLURAL)
def job_changed(namespace: str, name: str, **_: Any) -> None:
    _wake(namespace, name)


# ---------------------------------------------------------------- the per-job loop


async def _until_visible(body: kopf.Body, written: str | None, timeout: float = 5.0) -> None:
    """Read-your-writes: wait until the watch delivered the status this pass wrote."""
    if written is None:
        return
    deadline = asyncio.get_running_loop().time() + timeout
    while (body.get("status") or {}).get("lastReconcileTime") != written:
        if asyncio.get_running_loop().time() > deadline:
            return  # the next pass may plan from a slightly older status; counters are guarded
        await asyncio.sleep(0.05)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10)
async def run_job(stopped: kopf.DaemonStopped, namespace: str, name: str, body: kopf.Body, logger: logging.Logger,
                  pods_by_job: kopf.Index, nodes_by_name: kopf.Index, services_by_job: kopf.Index,
                  configmaps_by_job: kopf.Index, **_: Any) -> None:
    wake = _WAKE.setdefault((namespace, name), asyncio.Event())
    key = (namespace, name)

    async def from_indexes(ns: str, job: str) -> Children:
        return Children(
            pods=list(pods_by_job.get(key, [])),
            nodes=[n for store in nodes_by_name.values() for n in store],
            services=frozenset(services_by_job.get(key, [])),
            configmaps=dict(configmaps_by_job.get(key, [])),
        )

    try:
        while not stopped:
            wake.clear()
            try:
                result = await reconcile(_K8S, dict(body), from_indexes, SETTINGS, slots=_SLOTS)
                delay = min(result.plan.requeue_after or SETTINGS.resync_seconds, SETTINGS.resync_seconds)
                await _until_visible(body, result.written)
            except TransientApiError as err:
                logger.warning("pass interrupted, retrying in %.0fs: %s", err.delay, err)
                delay = err.delay
            except PermanentApiError as err:
                logger.error("the API refused a request: %s", err)
                delay = SETTINGS.resync_seconds * 3
            except Exception:  # noqa: BLE001 - a bug must not kill the job's loop
                logger.exception("reconcile pass failed")
                delay = SETTINGS.resync_seconds
            try:
                await asyncio.wait_for(wake.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass
    finally:
        _WAKE.pop(key, None)
        metrics.forget(namespace, name)
