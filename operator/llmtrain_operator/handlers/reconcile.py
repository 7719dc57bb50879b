"""One reconcile pass: observe -> plan (pure) -> write (actions and one status patch) -> events.

Used by the kopf daemon (observations from kopf's in-memory indexes, fed by watches)
and by API-contract tests and the scale benchmark (observations from list calls).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from llmtrain_contract.names import HEALTH_PORT

from .. import metrics
from ..api.observed import (LABEL_JOB, ROLE_WORKER, ConfigMapView, Observed, PodGroupView, WorkloadView, assigned_flavors,
                            node_view, parse_time, pod_group_view, pod_view, workload_view)
from ..api.vocabulary import TERMINAL_PHASES, ConditionType, Phase, PodPhase, Reason
from ..api.spec import LLMTrainJobSpec, SchedulingSpec
from ..k8s.client import K8s, PermanentApiError, TransientApiError
from ..k8s.patches import merge_patch
from ..planner import CreateObject, DeleteJob, DeleteObject, DeletePod, PatchStatus, Plan, ReplaceObject, SetSuspend, UpdateSpec, plan
from ..planner import queue
from ..planner.podgroup import api_of
from ..probe import AsyncProber, LauncherReport, combine, trainer_url
from ..settings import OperatorSettings
from .slots import Slots, no_slot

log = logging.getLogger("llmtrain.decisions")

VOLATILE = ("lastReconcileTime", "activeSeconds", "productiveSeconds", "goodput", "redoSeconds", "ettr")
"""Status fields that change on every pass; alone they do not justify a write."""
PROGRESS = ("step", "lastProgressTime")
"""Status fields that change at every step: alone they are written at the pace the
progress budget allows (``OperatorSettings.progress_writes_per_second``)."""


SLOW_PASS_SECONDS = 1.0
"""A pass that takes this long is logged with where its time went (probes, the wait for a
slot, planning and writes), as the API server traces its slow requests."""

REFUSAL_BACKOFF = (2.0, 300.0)
"""Seconds before retrying a refused create, doubling per refusal in a row: a quota or a
webhook may clear (another job ends, the webhook is fixed) without any watch event."""


@dataclass(frozen=True)
class Refusal:
    count: int
    messages: tuple[str, ...]
    at: datetime
    """When the latest refusal came."""

    @property
    def retry_after(self) -> float:
        first, cap = REFUSAL_BACKOFF
        return min(cap, first * 2 ** (self.count - 1))

    @property
    def retry_at(self) -> datetime:
        return self.at + timedelta(seconds=self.retry_after)


_REFUSALS: dict[tuple[str, str], Refusal] = {}
"""Per job: the creates the API server refused in its latest pass (in memory: a new
leader learns them again at its first attempt)."""


class NotLeader(Exception):
    """This replica does not hold the leader Lease (any more): nothing is written."""


class WriteGate(Protocol):
    def holds(self) -> bool: ...


@dataclass
class Children:
    pods: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    services: frozenset[str]
    configmaps: dict[str, ConfigMapView]
    body: dict[str, Any] | None = None
    """The newest job body, where the source has one (the watch-fed loops): a pass that
    waited for its slot plans from it."""


class ChildSource(Protocol):
    async def __call__(self, namespace: str, name: str) -> Children: ...


def listing_source(k8s: K8s) -> ChildSource:
    """Observe with list calls (no watches): tests and benchmarks."""

    async def source(namespace: str, name: str) -> Children:
        selector = f"{LABEL_JOB}={name}"
        pods, nodes, services, cms = await asyncio.gather(
            asyncio.to_thread(k8s.list_pods, namespace, selector),
            asyncio.to_thread(k8s.list_nodes),
            asyncio.to_thread(k8s.list_services, namespace, selector),
            asyncio.to_thread(k8s.list_configmaps, namespace, selector),
        )
        return Children(
            pods=pods, nodes=nodes,
            services=frozenset(s["metadata"]["name"] for s in services),
            configmaps={c["metadata"]["name"]: ConfigMapView.from_annotations(c["metadata"].get("annotations")) for c in cms},
        )

    return source


def _needs_dependency_check(body: dict[str, Any]) -> bool:
    """Secrets and PVCs are read only before pods exist or after a spec change; a
    steady job costs no reads."""
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    return status.get("phase") in (None, Phase.PENDING, Phase.INVALID) or status.get("observedGeneration") != generation


async def missing_dependencies(k8s: K8s, body: dict[str, Any], check_secrets: bool = True) -> tuple[str, ...]:
    """Referenced objects that do not exist. ``check_secrets`` off: Secrets are not read
    (no RBAC for them); the planner learns of a missing one from the pods' wait."""
    try:
        spec = LLMTrainJobSpec.model_validate(body.get("spec") or {})
    except ValueError:
        return ()  # the planner reports the invalid spec itself
    ns = (body.get("metadata") or {}).get("namespace", "default")
    wanted = []
    if spec.checkpoint.s3 is not None and check_secrets:
        wanted.append(("Secret", spec.checkpoint.s3.credentials_secret.name))
    if spec.checkpoint.shared is not None:
        wanted.append(("PersistentVolumeClaim", spec.checkpoint.shared.claim_name))
    found = await asyncio.gather(*(asyncio.to_thread(k8s.exists, kind, ns, name) for kind, name in wanted))
    return tuple(f"{kind} {name}" for (kind, name), ok in zip(wanted, found) if not ok)


def _needs_pod_group_read(body: dict[str, Any]) -> bool:
    """A gang job's PodGroup is read while worker pods may have to wait for it (not while
    the job runs steadily) and until a finished or suspended job gave it back."""
    status = body.get("status") or {}
    if status.get("observedGeneration") != (body.get("metadata") or {}).get("generation"):
        return True
    phase = status.get("phase")
    if phase == Phase.RUNNING:
        return False
    if phase in (*TERMINAL_PHASES, Phase.SUSPENDED):
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == ConditionType.POD_GROUP_READY), {})
        return ready.get("reason") != Reason.POD_GROUP_DELETED
    return True


async def read_pod_group(k8s: K8s, body: dict[str, Any]) -> PodGroupView | None:
    """The job's PodGroup, or None: not a gang job, its scheduling unreadable, or not needed
    now. Only a gang job's ``scheduling`` is parsed: this runs at every pass of every job."""
    scheduling = (body.get("spec") or {}).get("scheduling")
    if not isinstance(scheduling, dict) or scheduling.get("gang") is None or not _needs_pod_group_read(body):
        return None
    try:
        api = api_of(SchedulingSpec.model_validate(scheduling))
    except ValueError:
        return None  # the planner reports the invalid spec itself
    if api is None:
        return None
    meta = body["metadata"]
    try:
        served, obj = await asyncio.to_thread(k8s.read_object, api.api_version, api.plural, meta.get("namespace", "default"),
                                              meta["name"])
    except PermanentApiError as err:  # RBAC: the job says so (policies/gang.py)
        return PodGroupView(served=True, refused=f"read {api.kind} {meta['name']}: {err.server_message}")
    return pod_group_view(obj, served)


async def read_workload(k8s: K8s, body: dict[str, Any]) -> WorkloadView | None:
    """A queued job's Kueue Workload and the ResourceFlavors its admission assigned, read
    every pass (an admission or an eviction shows nowhere else); None for other jobs."""
    meta = body.get("metadata") or {}
    if not (meta.get("labels") or {}).get(queue.QUEUE_LABEL) or "name" not in meta:
        return None
    ns, name = meta.get("namespace", "default"), queue.workload_name(meta["name"])
    try:
        served, obj = await asyncio.to_thread(k8s.read_object, queue.API_VERSION, queue.PLURAL, ns, name)
        flavors = await asyncio.gather(*(asyncio.to_thread(k8s.read_object, queue.API_VERSION, queue.FLAVORS, None, flavor)
                                         for flavor in assigned_flavors(obj)))
    except PermanentApiError as err:  # RBAC: the job is held and says so (policies/queueing.py)
        return WorkloadView(served=True, refused=f"read the Workload {name} or its ResourceFlavors: {err.server_message}")
    return workload_view(obj, served, [f for _, f in flavors if f is not None])


def _running_workers(pods: list[Any]) -> list[Any]:
    """The worker pods that have an address to scrape."""
    return [p for p in pods if p.role == ROLE_WORKER and p.phase == PodPhase.RUNNING and p.ip]


PROBER = AsyncProber()


async def probe_workers(pods: list[Any], port: int, timeout: float) -> dict[str, Any]:
    targets = _running_workers(pods)
    results = await asyncio.gather(*(PROBER.trainer(trainer_url(p.ip, port), timeout) for p in targets))
    return {p.name: r for p, r in zip(targets, results) if r is not None}


async def probe_launchers(pods: list[Any], timeout: float) -> dict[str, LauncherReport]:
    """Pod name -> what each running worker's launcher reports."""
    targets = _running_workers(pods)
    results = await asyncio.gather(*(PROBER.launcher(f"http://{p.ip}:{HEALTH_PORT}/metrics", timeout) for p in targets))
    return {p.name: r for p, r in zip(targets, results) if r is not None}


def status_changed(old: dict[str, Any], new: dict[str, Any], flush_seconds: float, now: datetime,
                   progress_seconds: float = 0.0) -> bool:
    """Whether the pass writes the status: at once for any change but time accounting and
    progress; for progress, once ``progress_seconds`` passed since the last write; for
    time accounting alone, once ``flush_seconds`` did."""
    strip = lambda s, keys: {k: v for k, v in s.items() if k not in keys}  # noqa: E731
    if strip(old, VOLATILE + PROGRESS) != strip(new, VOLATILE + PROGRESS):
        return True
    last = parse_time(old.get("lastReconcileTime"))
    if last is None:
        return True
    since = (now - last).total_seconds()
    if strip(old, VOLATILE) != strip(new, VOLATILE):
        return since >= progress_seconds
    return since >= flush_seconds


def progress_pace(settings: OperatorSettings, jobs: int) -> float:
    """Seconds between a job's progress-only status writes, so that all ``jobs`` together
    stay within the progress budget."""
    rate = settings.progress_writes_per_second
    return jobs / rate if rate > 0 else 0.0


def _request(k8s: K8s, namespace: str, job: str, action: Any) -> Any:
    if isinstance(action, CreateObject):
        return asyncio.to_thread(k8s.create, action.manifest)
    if isinstance(action, ReplaceObject):
        return asyncio.to_thread(k8s.replace, action.manifest)
    if isinstance(action, UpdateSpec):
        return asyncio.to_thread(k8s.update_spec, action.manifest)
    if isinstance(action, DeletePod):
        return asyncio.to_thread(k8s.delete_pod, namespace, action.name, action.grace_seconds, action.force)
    if isinstance(action, DeleteObject):
        return asyncio.to_thread(k8s.delete_object, action.api_version, action.kind, namespace, action.name)
    if isinstance(action, PatchStatus):
        return asyncio.to_thread(k8s.patch_object_status, action.api_version, action.kind, namespace, action.name, action.status,
                                 action.resource_version)
    if isinstance(action, SetSuspend):
        return asyncio.to_thread(k8s.set_suspend, namespace, job, action.suspend)
    return asyncio.to_thread(k8s.delete_job, namespace, job)


def _check(gate: WriteGate | None) -> None:
    if gate is not None and not gate.holds():
        raise NotLeader()


async def write(k8s: K8s, body: dict[str, Any], result: Plan, status_patch: dict[str, Any] | None,
                gate: WriteGate | None = None) -> tuple[BaseException | None, BaseException | None, tuple[str, ...]]:
    """A pass's writes: the status patch and every create in one concurrent round, then
    the deletes. Returns (the first failed action's error, a permanent one first; the
    status patch's error; the creates the API server refused, with its words).

    Creates need no order: a pod created a moment before its ConfigMap is retried by the
    kubelet until the volume mounts (as with Kubeflow's and JobSet's children). One round
    matters because a pass's latency is the API server's latency times its rounds, and
    under a burst of new jobs that latency dominates (docs/benchmarks.md).

    Deletes wait for the status: deleting a failed pod destroys the evidence of the
    failure, so the decision (restart counted, failure recorded) is written first. If
    the status write fails, nothing is deleted and the next pass decides again; if a
    delete fails, the next pass finds the failure already counted and only deletes."""
    meta = body["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    # The job's own spec.suspend waits for the status too: written together, one of the two
    # writes would find the job at a newer version than the pass planned from.
    later = (DeletePod, DeleteObject, DeleteJob, SetSuspend)
    deletes = [a for a in result.actions if isinstance(a, later)]
    creates = [a for a in result.actions if not isinstance(a, later)]
    first = [_request(k8s, ns, name, a) for a in creates]
    if status_patch is not None:
        first.append(asyncio.to_thread(k8s.patch_status, ns, name, status_patch, meta.get("resourceVersion")))
    _check(gate)
    outcomes = list(await asyncio.gather(*first, return_exceptions=True))
    status_error = outcomes.pop() if status_patch is not None else None
    # A create the API server refuses (quota, admission, Pod Security, RBAC) is reported
    # and retried, not raised: the job's other work in this pass stands.
    refused = tuple(f"{describe(a)}: {o.server_message}" for a, o in zip(creates, outcomes) if isinstance(o, PermanentApiError))
    outcomes = [o for o in outcomes if not isinstance(o, PermanentApiError)]
    if not isinstance(status_error, BaseException):
        status_error = None
        if deletes:
            _check(gate)
        outcomes += await asyncio.gather(*(_request(k8s, ns, name, a) for a in deletes), return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    action_error = next((e for e in errors if not isinstance(e, TransientApiError)), errors[0] if errors else None)
    return action_error, status_error, refused


def describe(action: Any) -> str:
    if isinstance(action, CreateObject):
        return f"create {action.kind} {action.name}"
    if isinstance(action, ReplaceObject):
        return f"replace {action.manifest['kind']} {action.manifest['metadata']['name']}"
    if isinstance(action, UpdateSpec):
        return f"update {action.manifest['kind']} {action.manifest['metadata']['name']}"
    if isinstance(action, DeletePod):
        return f"{'force-delete' if action.force else 'delete'} Pod {action.name}"
    if isinstance(action, DeleteObject):
        return f"delete {action.kind} {action.name}"
    if isinstance(action, PatchStatus):
        return f"patch the status of {action.kind} {action.name}"
    if isinstance(action, SetSuspend):
        return f"set spec.suspend={str(action.suspend).lower()}"
    return f"delete the job ({action.reason})"


def log_decisions(namespace: str, name: str, result: Plan) -> None:
    """Every decision of a recorded pass at INFO, with the job's name: a failed CI run can
    be diagnosed from the operator's log alone."""
    for decision in result.decisions:
        log.info("job %s/%s: %s", namespace, name, decision)
    for action in result.actions:
        log.info("job %s/%s: %s", namespace, name, describe(action))


_PENDING: set[asyncio.Future[Any]] = set()


def _background(coro: Any) -> None:
    """Run without awaiting; keep a reference so the task is not garbage-collected."""
    task = asyncio.ensure_future(coro)
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


async def drain_background() -> None:
    """Wait for fire-and-forget work (tests, shutdown)."""
    if _PENDING:
        await asyncio.gather(*list(_PENDING), return_exceptions=True)


@dataclass
class PassResult:
    plan: Plan
    written: str | None
    """The ``lastReconcileTime`` written into status, or None when nothing was written.
    The loop waits until its watch shows it before the next pass (read-your-writes),
    so a pass never plans from a status older than the previous pass's decisions."""
    created: tuple[tuple[str, str], ...] = ()
    """(kind, name) of the children this pass created; the loop also waits until the
    watch shows them, so the next pass does not create them again."""


async def reconcile(k8s: K8s, body: dict[str, Any], source: ChildSource, settings: OperatorSettings,
                    now: datetime | None = None, slots: Slots | None = None, gate: WriteGate | None = None,
                    urgent: bool = False, key: Any = None, jobs: int = 1) -> PassResult:
    """One pass. With ``slots``, the API work waits for a free slot (``urgent``: ahead of
    routine passes, for a pass that answers an event; ``key`` lets an event that comes
    during the wait promote it, see slots.py); trainers are scraped before, outside it.
    What the pass plans from (the job, its pods, nodes and other children) is read again
    once it holds the slot, so a pass that waited acts on what happened meanwhile. The
    pass duration excludes that wait. With ``gate`` (the leader Lease), nothing is
    written unless this replica holds it."""
    started = time.perf_counter()
    meta = body["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    before = await source(ns, name)
    spec = body.get("spec") or {}
    port = (spec.get("metrics") or {}).get("port", 9400)
    probes: dict[str, Any] = {}
    attempts: dict[str, dict[str, int]] = {}
    if settings.probes_enabled:
        pods = [pod_view(p) for p in before.pods]
        # A user's script serves no trainer endpoint: its progress comes from the launcher.
        trainer_pods = pods if (spec.get("trainer") or {}).get("builtin") is not None else []
        trainers, launchers = await asyncio.gather(probe_workers(trainer_pods, port, settings.probe_timeout_seconds),
                                                   probe_launchers(pods, settings.probe_timeout_seconds))
        probes, attempts = combine(trainers, launchers)
    probed = time.perf_counter()
    async with slots.held(urgent, key) if slots is not None else no_slot() as waited:
        # A watch-fed source costs nothing to read again; a listing one (tests) is read once.
        children = await source(ns, name) if before.body is not None else before
        if children.body is not None:
            body = children.body
        try:
            return await _decide_and_write(k8s, body, settings, now or datetime.now(timezone.utc), started + waited,
                                           Observed(pods=tuple(pod_view(p) for p in children.pods),
                                                    nodes={n.name: n for n in map(node_view, children.nodes)},
                                                    services=children.services, configmaps=children.configmaps, probes=probes,
                                                    launcher_attempts=attempts, **refused_before(ns, name)), gate, jobs)
        finally:
            took = time.perf_counter() - started
            if took >= SLOW_PASS_SECONDS:
                log.info("job %s/%s: slow %s pass, %.2fs: probes %.2fs, waiting for a slot %.2fs, planning and writes %.2fs",
                         ns, name, "urgent" if urgent else "routine", took, probed - started, waited,
                         took - (probed - started) - waited)


def refused_before(namespace: str, name: str) -> dict[str, Any]:
    """``Observed`` fields for the creates the API server refused last time."""
    refusal = _REFUSALS.get((namespace, name))
    return {"refused": refusal.messages, "retry_creates_at": refusal.retry_at} if refusal is not None else {}


async def _decide_and_write(k8s: K8s, body: dict[str, Any], settings: OperatorSettings, now: datetime,
                            started: float, observed: Observed, gate: WriteGate | None, jobs: int = 1) -> PassResult:
    meta = body["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    if _needs_dependency_check(body):
        observed = replace(observed, missing=await missing_dependencies(k8s, body, settings.check_secrets))
    pod_group, workload = await asyncio.gather(read_pod_group(k8s, body), read_workload(k8s, body))
    if pod_group is not None:
        observed = replace(observed, pod_group=pod_group)
    if workload is not None:
        observed = replace(observed, workload=workload)
    result = plan(body, observed, now, settings.runtime_image)
    old_status = body.get("status") or {}
    changed = status_changed(old_status, result.status, settings.status_flush_seconds, now, progress_pace(settings, jobs))
    _check(gate)
    action_error, status_error, refused = await write(k8s, body, result, merge_patch(old_status, result.status) if changed else None, gate)
    _remember_refusals(ns, name, refused, now,
                       attempted=any(isinstance(a, (CreateObject, ReplaceObject, UpdateSpec)) for a in result.actions))
    for err in (action_error, status_error):
        if err is not None and not isinstance(err, TransientApiError):
            raise err
    if status_error is not None:
        raise status_error  # decisions not recorded: no Events or metrics for them; the next pass re-plans
    log_decisions(ns, name, result)
    for event in result.events:  # best effort, off the pass's critical path
        if gate is None or gate.holds():
            _background(asyncio.to_thread(k8s.post_event, body, event.type, event.reason, event.message))
    metrics.record_pass(ns, name, result.decisions, result.status, time.perf_counter() - started)
    if action_error is not None:
        raise action_error  # the status is recorded; the next pass retries what failed
    created = tuple((a.kind, a.name) for a in result.actions
                    if isinstance(a, CreateObject) and not any(r.startswith(describe(a) + ":") for r in refused))
    return PassResult(result, result.status.get("lastReconcileTime") if changed else None, created)


def _remember_refusals(namespace: str, name: str, refused: tuple[str, ...], now: datetime, attempted: bool) -> None:
    """The refusals the next passes report (``Observed.refused``) and the backoff they
    wait (counted in a row). A pass without a refusal clears them, unless the backoff held
    its creates back."""
    key = (namespace, name)
    if not refused:
        before = _REFUSALS.get(key)
        if before is not None and (attempted or now >= before.retry_at):
            del _REFUSALS[key]
        return
    before = _REFUSALS.get(key)
    _REFUSALS[key] = refusal = Refusal((before.count if before else 0) + 1, refused, now)
    for message in refused:
        log.warning("job %s/%s: the API server refused: %s (retrying in %.0fs)", namespace, name, message, refusal.retry_after)


def forget(namespace: str, name: str) -> None:
    """A deleted job's remembered refusals."""
    _REFUSALS.pop((namespace, name), None)
