"""kopf registration: thin adapters around ``reconcile``.

Run with ``kopf run -m llmtrain_operator.handlers`` (the chart does).

- One loop per LLMTrainJob (``loops.py``), started and stopped by the job's watch
  events: it waits to be the leader, reconciles, then sleeps until the planner's next
  timer or until a watch event about the job, its pods, or one of its nodes wakes it
  (``wakes.py`` says which events do).
- Exactly one replica writes: the holder of a ``coordination.k8s.io`` Lease
  (``leadership.py``). Every replica watches, so a standby's indexes are warm when it
  takes over. kopf itself writes nothing: no peering, no finalizers, no progress
  annotations, no Events of its own.
- kopf indexes (fed by watches) hold the observed pods, nodes, services and configs, so
  a pass makes no read calls when nothing changed. They are keyed by the job label; a
  pass keeps the objects the job owns (its uid in their ownerReferences).
- State lives in the job's status, never in this process: a restarted (or failed-over)
  operator resumes every job where it was, without touching running pods.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from datetime import UTC, datetime
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from typing import Any

import kopf

from .. import __version__, metrics
from ..api.job import GROUP, PLURAL, VERSION
from ..api.observed import LABEL_JOB, NodeView, job_owner_uid, node_view, pod_view, slim_child, slim_node, slim_pod
from ..k8s.client import K8s, PermanentApiError, TransientApiError
from ..k8s.lease import LeaseClient
from ..planner.isolation import IsolationError
from ..planner.tokens import TokenKeyError
from ..settings import ConfigError, OperatorSettings, from_env
from .executor import NotLeader
from .leadership import AlwaysLeader, Gate, Leadership
from .loops import JobLoops, Key, Next
from .probing import DEFERRED_ROTATION_SECONDS
from .reconcile import PROBER, Children, isolation_of, job_uid, reconcile, token_key_of
from .reconcile import forget as forget_job_memory
from .slots import Slots
from .wakes import jobs_of_node
from ..planner.stranded import stranded

log = logging.getLogger("llmtrain.operator")

SETTINGS = OperatorSettings()
"""Replaced at startup from ``LLMTRAIN_OPERATOR_*`` (a bad value stops the operator with
a message naming the variable)."""
_K8S: K8s | None = None
_SLOTS: Slots | None = None
"""At most ``max_concurrent_reconciles`` passes' API work at once, across jobs (set at startup)."""
_GATE: Gate = AlwaysLeader()
_ELECTION: asyncio.Task[None] | None = None
_STOP_ELECTION = asyncio.Event()
_SWEEPER: asyncio.Task[None] | None = None
SWEEP_SECONDS = 5.0
"""How often the leader looks for a deleted job's pods stuck on a dead node."""
_INDEXES: dict[str, Any] = {}
"""kopf's live index views, captured from the first job event (they are the same objects
for the operator's whole life)."""
JOB_SELECTOR = {LABEL_JOB: kopf.PRESENT}


def identity() -> str:
    """This replica's name in the Lease and in the API server's audit log (user agent)."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _K8S, SETTINGS, _SLOTS, _GATE, _ELECTION
    SETTINGS = from_env()
    try:
        isolation_of(SETTINGS)  # a bad NetworkPolicy setting stops the operator here, not every pass
    except IsolationError as err:
        raise ConfigError(f"LLMTRAIN_OPERATOR_NETWORK_POLICY_*: {err}") from err
    try:
        token_key_of(SETTINGS)  # likewise an unreadable token key
    except TokenKeyError as err:
        raise ConfigError(f"LLMTRAIN_OPERATOR_TOKEN_KEY_FILE: {err}") from err
    if not SETTINGS.token_key_file:
        log.warning("no LLMTRAIN_OPERATOR_TOKEN_KEY_FILE: the jobs' tokens are drawn from a key of this process only")
    _SLOTS = Slots(SETTINGS.max_concurrent_reconciles)
    # Leader election is ours (a Lease); kopf's peering would pause the standby's
    # watches, and a standby with warm indexes takes over faster.
    settings.peering.standalone = True
    settings.posting.enabled = False  # our own Events say what happened
    settings.watching.server_timeout = 300  # re-list before the API server expires a watch (410)
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    me = identity()
    _K8S = K8s.from_environment(user_agent=f"llmtrain-operator/{__version__} ({me})", connections=SETTINGS.api_threads)
    metrics.serve(SETTINGS.metrics_port)
    # API calls run in threads (the Kubernetes client is synchronous); the default pool
    # (cores + 4) would queue a burst of new jobs' creates behind each other.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=SETTINGS.api_threads, thread_name_prefix="k8s-api"))
    if SETTINGS.leader_election:
        namespace = SETTINGS.lease_namespace or os.environ.get("POD_NAMESPACE") or "default"
        # Its own client and connections: renewals never wait for a connection that the
        # passes' API calls hold (and its own thread: Leadership.run).
        lease_k8s = K8s.from_environment(user_agent=f"llmtrain-operator/{__version__} ({me})", connections=2)
        election = Leadership(LeaseClient(lease_k8s, namespace, SETTINGS.lease_name), me, SETTINGS.lease_duration_seconds,
                              SETTINGS.renew_deadline_seconds, SETTINGS.retry_period_seconds)
        _GATE = election
        _STOP_ELECTION.clear()
        _ELECTION = asyncio.create_task(election.run(_STOP_ELECTION), name="leader-election")
        log.info("leader election on Lease %s/%s as %s", namespace, SETTINGS.lease_name, me)
    else:
        _GATE = AlwaysLeader()
        metrics.set_leader(True)
    global _SWEEPER
    _SWEEPER = asyncio.create_task(_sweep_stranded(), name="stranded-pods")


async def _sweep_stranded() -> None:
    """Force-delete what deleted jobs leave Terminating on dead nodes (planner/stranded.py),
    every ``SWEEP_SECONDS`` while this replica leads."""
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        try:
            if _K8S is not None and _GATE.holds():
                await _sweep_once(_K8S)
        except Exception:  # the sweep is a backstop; the next tick tries again
            log.exception("sweeping a deleted job's stranded pods failed")


_LABELLED_JOB: dict[tuple[str, str], str] = {}
"""(namespace, pod) -> the job its label names, for the candidates of the last sweep."""


def _gone_jobs_pods() -> list[tuple[str, dict[str, Any]]]:
    """(namespace, pod) of every indexed pod whose LLMTrainJob is gone, being deleted, or
    is another job of the same name (its uid differs), as far as the watches know."""
    out = []
    _LABELLED_JOB.clear()
    for key, store in list((_INDEXES.get("pods_by_job") or {}).items()):
        body = LOOPS.body(key)
        alive = body is not None and not (body.get("metadata") or {}).get("deletionTimestamp")
        for pod in list(store):
            owner = job_owner_uid(pod)
            if owner is not None and not (alive and body is not None and job_uid(body) == owner):
                out.append((key[0], pod))
                _LABELLED_JOB[(key[0], (pod.get("metadata") or {}).get("name", ""))] = key[1]
    return out


async def _sweep_once(k8s: K8s) -> None:
    candidates = [(ns, pod_view(pod), job_owner_uid(pod)) for ns, pod in _gone_jobs_pods()]
    if not candidates:
        return
    nodes = {n.name: n for n in map(node_view, (n for store in (_INDEXES.get("nodes_by_name") or {}).values() for n in store))}
    doomed = stranded([view for _, view, _ in candidates], nodes, datetime.now(UTC))
    for ns, view, owner in candidates:
        if view not in doomed:
            continue
        # The watch may not have delivered a live job yet (an operator just started): the
        # API server says whether the pod's job is really gone before anything is forced.
        job = _LABELLED_JOB.get((ns, view.name), "")
        _, body = await asyncio.to_thread(k8s.read_object, f"{GROUP}/{VERSION}", PLURAL, ns, job)
        if body is not None and job_uid(body) == owner and not (body.get("metadata") or {}).get("deletionTimestamp"):
            continue
        log.info("pod %s/%s of a deleted job is stuck Terminating on node %s, which is not Ready: force-deleting it",
                 ns, view.name, view.node)
        await asyncio.to_thread(k8s.delete_pod, ns, view.name, None, True)


@kopf.on.cleanup()
async def shutdown(**_: Any) -> None:
    if _SWEEPER is not None:
        _SWEEPER.cancel()
    await LOOPS.stop()
    await PROBER.close()
    if _ELECTION is not None:
        _STOP_ELECTION.set()  # the election loop releases the Lease on its way out
        await asyncio.wait_for(_ELECTION, timeout=10)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else $KUBECONFIG (read at call time)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


# ---------------------------------------------------------------- indexes (observed state)


@kopf.index("pods", labels=JOB_SELECTOR)
def pods_by_job(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): slim_pod(dict(body))}


@kopf.index("nodes")
def nodes_by_name(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {name: slim_node(dict(body))}


@kopf.index("services", labels=JOB_SELECTOR)
def services_by_job(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): slim_child(dict(body))}


@kopf.index("configmaps", labels=JOB_SELECTOR)
def configmaps_by_job(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): slim_child(dict(body))}


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels=JOB_SELECTOR)
def networkpolicies_by_job(namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[LABEL_JOB]): slim_child(dict(body))}


# ---------------------------------------------------------------- the per-job loops


def _indexed(key: Key, nodes: bool = True) -> Children:
    """What the indexes hold under the job's label (the pass keeps what the job owns);
    with ``nodes``, for a pass, also every node and every job body watched."""
    return Children(
        pods=list(_INDEXES["pods_by_job"].get(key, [])),
        nodes=[n for store in _INDEXES["nodes_by_name"].values() for n in store] if nodes else [],
        services=list(_INDEXES["services_by_job"].get(key, [])),
        configmaps=list(_INDEXES["configmaps_by_job"].get(key, [])),
        network_policies=list(_INDEXES["networkpolicies_by_job"].get(key, [])),
        jobs=list(LOOPS.bodies().values()) if nodes else [],
        body=LOOPS.body(key),
    )


async def _children(namespace: str, name: str) -> Children:
    key = (namespace, name)
    LOOPS.observe(key)
    return _indexed(key)


def _visible(key: Key, written: str | None, created: tuple[tuple[str, str], ...]) -> bool:
    body = LOOPS.body(key)
    if body is None:
        return True  # the job is gone
    if written is not None and (body.get("status") or {}).get("lastReconcileTime") != written:
        return False
    names = _indexed(key, nodes=False).owned_by(job_uid(body)).names()
    return all(name in names.get(kind, {name}) for kind, name in created)


async def _until_visible(key: Key, written: str | None, created: tuple[tuple[str, str], ...], timeout: float = 5.0) -> None:
    """Read-your-writes: wait until the watches delivered the status this pass wrote and
    the children it created, so the next pass neither plans from an older status nor
    creates the same pods again. (If they do not arrive in time, an older status cannot
    be written anyway: the status patch's resourceVersion precondition fails and the pass
    is retried; a duplicate create is refused as AlreadyExists.)"""
    deadline = asyncio.get_running_loop().time() + timeout
    while not _visible(key, written, created):
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.05)


async def _one_pass(key: Key) -> float | Next:
    if not _GATE.holds():
        await _GATE.wait()
        LOOPS.count_from_now(key)
    body = LOOPS.body(key)
    if body is None:
        return 0.0
    logger = logging.getLogger(f"llmtrain.job.{key[0]}.{key[1]}")
    if _K8S is None:
        raise RuntimeError("no API client: the operator's startup handler has not run")
    try:
        result = await reconcile(_K8S, body, _children, SETTINGS, slots=_SLOTS, gate=_GATE, urgent=LOOPS.answering(key),
                                 key=key, jobs=len(LOOPS.keys()))
        LOOPS.acted(key)
        await _until_visible(key, result.written, result.created)
        after = min(result.plan.requeue_after or SETTINGS.resync_seconds, SETTINGS.resync_seconds)
        if result.rotation_deferred:
            after = min(after, DEFERRED_ROTATION_SECONDS)
        return Next(after, result.plan.urgent_after)
    except NotLeader:
        logger.info("job %s/%s: lost the leadership during a pass; nothing was written after that", *key)
        return 0.0
    except TransientApiError as err:
        logger.warning("job %s/%s: pass interrupted, retrying in %.0fs: %s", *key, err.delay, err)
        return err.delay
    except PermanentApiError as err:
        logger.error("job %s/%s: the API refused a request: %s", *key, err)
        return SETTINGS.resync_seconds * 3


def _promote(key: Key) -> None:
    if _SLOTS is not None:
        _SLOTS.promote(key)


LOOPS = JobLoops(_one_pass, on_acted=metrics.record_event_to_action, on_wake=_promote)


# kopf passes each index as a keyword argument named after it, which its WatchingFn protocol cannot name.
@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]  # kopf's types: index kwargs
async def job_changed(type: str | None, namespace: str | None, name: str, body: kopf.Body, pods_by_job: kopf.Index,
                nodes_by_name: kopf.Index, services_by_job: kopf.Index, configmaps_by_job: kopf.Index,
                networkpolicies_by_job: kopf.Index, **_: Any) -> None:
    _INDEXES.update(pods_by_job=pods_by_job, nodes_by_name=nodes_by_name, services_by_job=services_by_job,
                    configmaps_by_job=configmaps_by_job, networkpolicies_by_job=networkpolicies_by_job)
    key = (namespace or "default", name)
    LOOPS.seen(key, type, dict(body))
    if type == "DELETED":
        metrics.forget(*key)
        forget_job_memory(*key)
        if _SLOTS is not None:
            _SLOTS.forget(key)


def _keep_indexes(kwargs: dict[str, Any]) -> None:
    """kopf hands every handler the indexes: keep them from whichever event comes first
    (an operator started after the last job was deleted sees pod and node events only)."""
    _INDEXES.update({k: kwargs[k] for k in ("pods_by_job", "nodes_by_name", "services_by_job", "configmaps_by_job",
                                            "networkpolicies_by_job") if k in kwargs})


@kopf.on.event("pods", labels=JOB_SELECTOR)
async def pod_changed(namespace: str | None, labels: Mapping[str, str], **kwargs: Any) -> None:
    _keep_indexes(kwargs)
    # Any pod with the job's label wakes it, owned or not: the pass keeps only its own, but
    # a namesake's leftover going away is what lets it create its own pod of that name.
    LOOPS.wake((namespace or "default", labels.get(LABEL_JOB, "")))  # as job_changed keys it


@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=JOB_SELECTOR)
async def network_policy_changed(namespace: str | None, labels: Mapping[str, str], **kwargs: Any) -> None:
    """A job's pods are created once its NetworkPolicy is seen (``policies/children.py``):
    its arrival wakes the job at once, and its deletion brings it back."""
    _keep_indexes(kwargs)
    LOOPS.wake((namespace or "default", labels.get(LABEL_JOB, "")))


_NODE_VIEWS: dict[str, NodeView] = {}
"""What the planner last read of each node: a node event that leaves it unchanged (a
kubelet's heartbeat) wakes no job."""


@kopf.on.event("nodes")
async def node_changed(type: str | None, name: str, body: kopf.Body, **kwargs: Any) -> None:
    _keep_indexes(kwargs)
    if type == "DELETED":
        _NODE_VIEWS.pop(name, None)
    else:
        view = node_view(dict(body))
        if _NODE_VIEWS.get(name) == view:
            return
        _NODE_VIEWS[name] = view
    for key in jobs_of_node(name, _INDEXES.get("pods_by_job", {}), LOOPS.bodies()):
        LOOPS.wake(key)
