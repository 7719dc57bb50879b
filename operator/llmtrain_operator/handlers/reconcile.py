"""One reconcile pass: observe -> plan (pure) -> write (actions and one status patch) -> events.

Used by the kopf daemon (observations from kopf's in-memory indexes, fed by watches)
and by API-contract tests and the scale benchmark (observations from list calls).

The job body is read once per pass (``api.job.receive``: the spec through ``parse_job``);
everything here that needs the spec reads the typed job, and the planner gets the same
reading. An invalid spec is the planner's to report, so nothing here reads for it. The
job's children are the objects it owns (``api.observed.owned_by``, its uid in their
ownerReferences); the job label only selects candidates. The writes are the executor's
(``executor.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, UTC
from pathlib import Path
from typing import Any, Protocol

from llmtrain_contract.names import HEALTH_PORT

from .. import metrics
from ..api.job import LLMTrainJob, Received, receive
from ..api.observed import (LABEL_JOB, ROLE_WORKER, ConfigMapView, ContainerMemory, Observed, PodGroupView, TrainerProbe,
                            WorkloadView, assigned_flavors, node_view, parse_time, pod_group_view, pod_view, workload_view)
from ..api.observed import owned_by as is_owned_by
from ..api.vocabulary import TERMINAL_PHASES, ConditionType, Phase, PodPhase, Reason
from ..k8s.client import K8s, PermanentApiError, TransientApiError
from ..k8s.patches import merge_patch
from ..planner import Plan, plan_received, podgroup, queue, tokens
from ..planner.isolation import Isolation
from ..planner.podpolicy import PodPolicy
from ..planner.tierclaims import conflicts as tier_conflicts
from ..probe import UNASKED, AsyncProber, LauncherReport, Unasked, combine, memory_of, peer_waits_of, trainer_url
from ..settings import OperatorSettings
from ..silence import Silences
from .probing import ProbeBook, pods_per_pass
from .executor import Refused, WriteGate, check, describe, write
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
    """Refusals in a row."""
    refused: tuple[Refused, ...]
    """The latest pass's refused writes, each with its action and the server's words."""
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


def _name(obj: dict[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


@dataclass(frozen=True)
class Children:
    """What a source found for a job: the objects carrying its label (candidates, until
    ``owned_by`` keeps those the job owns) and every node."""

    pods: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    services: list[dict[str, Any]]
    configmaps: list[dict[str, Any]]
    """Whole objects or their slim copies (``slim_pod``, ``slim_child``): only the metadata
    (and a pod's node and status) is read."""
    network_policies: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    """Every job body the source sees (the watch's), to find two on one checkpoint tier."""
    body: dict[str, Any] | None = None
    """The newest job body, where the source has one (the watch-fed loops): a pass that
    waited for its slot plans from it."""

    def owned_by(self, uid: str) -> Children:
        """Only the job's own pods, Services, ConfigMaps and NetworkPolicies: those whose
        ownerReferences name ``uid``."""
        return replace(self, pods=[p for p in self.pods if is_owned_by(p, uid)],
                       services=[s for s in self.services if is_owned_by(s, uid)],
                       configmaps=[c for c in self.configmaps if is_owned_by(c, uid)],
                       network_policies=[n for n in self.network_policies if is_owned_by(n, uid)])

    def names(self) -> dict[str, set[str]]:
        """Kind -> the names present (what a pass's creates are looked for)."""
        return {"Pod": {_name(p) for p in self.pods}, "Service": {_name(s) for s in self.services},
                "ConfigMap": {_name(c) for c in self.configmaps}, "NetworkPolicy": {_name(n) for n in self.network_policies}}

    def observed(self, **fields: Any) -> Observed:
        """The planner's view of these objects; ``fields``: the rest of ``Observed``."""
        return Observed(pods=tuple(pod_view(p) for p in self.pods), nodes={n.name: n for n in map(node_view, self.nodes)},
                        services=frozenset(_name(s) for s in self.services),
                        network_policies=frozenset(_name(n) for n in self.network_policies),
                        configmaps={_name(c): ConfigMapView.from_annotations((c.get("metadata") or {}).get("annotations"))
                                    for c in self.configmaps},
                        **fields)


def job_uid(body: dict[str, Any]) -> str:
    """The uid the job's children name in their ownerReferences."""
    return (body.get("metadata") or {}).get("uid") or ""


class ChildSource(Protocol):
    async def __call__(self, namespace: str, name: str) -> Children: ...


def listing_source(k8s: K8s) -> ChildSource:
    """Observe with list calls (no watches): tests and benchmarks. The label selector
    narrows the lists; the pass keeps what the job owns (``Children.owned_by``)."""

    async def source(namespace: str, name: str) -> Children:
        selector = f"{LABEL_JOB}={name}"
        pods, nodes, services, cms, policies = await asyncio.gather(
            asyncio.to_thread(k8s.list_pods, namespace, selector),
            asyncio.to_thread(k8s.list_nodes),
            asyncio.to_thread(k8s.list_services, namespace, selector),
            asyncio.to_thread(k8s.list_configmaps, namespace, selector),
            asyncio.to_thread(k8s.list_network_policies, namespace, selector),
        )
        return Children(pods=pods, nodes=nodes, services=services, configmaps=cms, network_policies=policies)

    return source


def _needs_dependency_check(received: Received) -> bool:
    """Secrets and PVCs are read only before pods exist or after a spec change; a
    steady job costs no reads."""
    status = received.status
    return status.phase in (Phase.PENDING, Phase.INVALID) or status.observed_generation != received.generation


async def missing_dependencies(k8s: K8s, job: LLMTrainJob, check_secrets: bool = True) -> tuple[str, ...]:
    """Referenced objects that do not exist. ``check_secrets`` off: Secrets are not read
    (no RBAC for them); the planner learns of a missing one from the pods' wait."""
    spec, ns = job.spec, job.metadata.namespace or "default"
    wanted = []
    if spec.checkpoint.s3 is not None and check_secrets:
        wanted.append(("Secret", spec.checkpoint.s3.credentials_secret.name))
    if spec.checkpoint.shared is not None:
        wanted.append(("PersistentVolumeClaim", spec.checkpoint.shared.claim_name))
    found = await asyncio.gather(*(asyncio.to_thread(k8s.exists, kind, ns, name) for kind, name in wanted))
    return tuple(f"{kind} {name}" for (kind, name), ok in zip(wanted, found) if not ok)


def _needs_pod_group_read(received: Received) -> bool:
    """A gang job's PodGroup is read while worker pods may have to wait for it (not while
    the job runs steadily) and until a finished or suspended job gave it back."""
    status = received.status
    if status.observed_generation != received.generation:
        return True
    if status.phase == Phase.RUNNING:
        return False
    if status.phase in (*TERMINAL_PHASES, Phase.SUSPENDED):
        ready = next((c for c in status.conditions if c.type == ConditionType.POD_GROUP_READY), None)
        return ready is None or ready.reason != Reason.POD_GROUP_DELETED
    return True


async def read_pod_group(k8s: K8s, received: Received) -> PodGroupView | None:
    """The job's PodGroup, or None: not a valid gang job, or not needed now."""
    job = received.job
    api = podgroup.api_for(job) if job is not None else None
    if job is None or api is None or not _needs_pod_group_read(received):
        return None
    ns, name = job.metadata.namespace or "default", job.metadata.name
    try:
        served, obj = await asyncio.to_thread(k8s.read_object, api.api_version, api.plural, ns, name)
    except PermanentApiError as err:  # RBAC: the job says so (policies/gang.py)
        return PodGroupView(served=True, refused=f"read {api.kind} {name}: {err.server_message}")
    return pod_group_view(obj, served, owner_uid=job.metadata.uid or None)


async def read_workload(k8s: K8s, job: LLMTrainJob | None) -> WorkloadView | None:
    """A queued job's Kueue Workload and the ResourceFlavors its admission assigned, read
    every pass (an admission or an eviction shows nowhere else); None for other jobs."""
    if job is None or queue.queue_of(job) is None:
        return None
    ns, name = job.metadata.namespace or "default", queue.workload_name(job.metadata.name)
    try:
        served, obj = await asyncio.to_thread(k8s.read_object, queue.API_VERSION, queue.PLURAL, ns, name)
        flavors = await asyncio.gather(*(asyncio.to_thread(k8s.read_object, queue.API_VERSION, queue.FLAVORS, None, flavor)
                                         for flavor in assigned_flavors(obj)))
    except PermanentApiError as err:  # RBAC: the job is held and says so (policies/queueing.py)
        return WorkloadView(served=True, refused=f"read the Workload {name} or its ResourceFlavors: {err.server_message}")
    return workload_view(obj, served, [f for _, f in flavors if f is not None], owner_uid=job.metadata.uid or None)


def isolation_of(settings: OperatorSettings, env: Mapping[str, str] = os.environ) -> Isolation | None:
    """The peers of the jobs' NetworkPolicies (``planner/isolation.py``); None when the
    operator makes none. IsolationError on a bad setting: the operator's startup calls
    this first, so a pass never meets one."""
    if not settings.network_policy:
        return None
    return _isolation(env.get("POD_NAMESPACE", ""), settings.network_policy_operator_pods, settings.network_policy_metrics_from)


@functools.lru_cache(maxsize=4)
def _isolation(namespace: str, operator_pods: str, metrics_from: str) -> Isolation:
    return Isolation.parse(namespace, operator_pods, metrics_from)


def token_key_of(settings: OperatorSettings) -> bytes:
    """The key the jobs' tokens are drawn from (``planner/tokens.py``): the file's bytes
    (surrounding whitespace left out), or a random key kept for this process when no file
    is set. TokenKeyError naming the file: the operator's startup calls this first."""
    return _token_key(settings.token_key_file)


@functools.lru_cache(maxsize=4)
def _token_key(path: str) -> bytes:
    if not path:
        return secrets.token_bytes(tokens.KEY_BYTES)
    try:
        key = Path(path).read_bytes().strip()
    except OSError as err:
        raise tokens.TokenKeyError(f"cannot read the token key {path}: {err.strerror or err}") from None
    if len(key) < tokens.KEY_BYTES:
        raise tokens.TokenKeyError(f"the token key {path} holds {len(key)} bytes, {tokens.KEY_BYTES} at least")
    return key


def _running_workers(pods: list[Any]) -> list[Any]:
    """The worker pods that have an address to scrape."""
    return [p for p in pods if p.role == ROLE_WORKER and p.phase == PodPhase.RUNNING and p.ip]


PROBER = AsyncProber()
SILENCES = Silences()
"""Each running worker's unanswered probes in a row (``silence.py``), per job."""
PROBE_BOOK = ProbeBook()
"""Each running worker's newest answers, per job: which workers a pass reads (``probing.py``)."""


async def probe_workers(targets: list[Any], port: int, timeout: float) -> dict[str, TrainerProbe | Unasked]:
    """Pod name -> what each of ``targets``' trainer (its local rank 0) reports."""
    results = await asyncio.gather(*(PROBER.trainer(trainer_url(p.ip, port), timeout) for p in targets))
    return {p.name: r for p, r in zip(targets, results) if r is not None}


async def probe_launchers(targets: list[Any], timeout: float) -> dict[str, LauncherReport | Unasked]:
    """Pod name -> what each of ``targets``' launcher reports."""
    results = await asyncio.gather(*(PROBER.launcher(f"http://{p.ip}:{HEALTH_PORT}/metrics", timeout) for p in targets))
    return {p.name: r for p, r in zip(targets, results) if r is not None}


@dataclass
class Reading:
    """What one pass learned from a job's running workers."""

    probed: list[Any]
    """The workers read this pass."""
    launchers: dict[str, LauncherReport]
    """Their launchers' answers (a pod absent did not answer)."""
    trainers: dict[str, TrainerProbe]
    """Their trainers' answers, and what lasts of the others' newest (``probing.lasting``)."""
    all_launchers: dict[str, LauncherReport]
    """``launchers``, and what lasts of the others' newest."""


async def read_workers(job: Any, running: list[Any], builtin: bool, port: int, settings: OperatorSettings,
                       urgent: bool = False) -> Reading:
    """Read the workers ``PROBE_BOOK`` picks, and every other one when their answers call
    for it (``probing.py``). ``builtin``: the pods serve our trainer's page (a user's script
    serves none: its progress comes through the launcher). The page budget is shared by the
    jobs whose workers the book reads (finished and waiting jobs read none). A pod either of
    whose pages could not even be asked for (the prober's queue, ``probe.UNASKED``) counts
    as not read this pass, and is read first at the next. ``urgent``: the pass answers an
    event (``ProbeBook.first_round``)."""
    timeout = settings.probe_timeout_seconds
    cap = pods_per_pass(settings.probe_pods_per_pass, settings.probe_pages_per_second, settings.resync_seconds,
                        PROBE_BOOK.jobs() + (0 if PROBE_BOOK.knows(job) else 1))

    async def read(targets: list[Any]) -> tuple[list[Any], dict[str, TrainerProbe], dict[str, LauncherReport]]:
        trainers, launchers = await asyncio.gather(probe_workers(targets if builtin else [], port, timeout),
                                                   probe_launchers(targets, timeout))
        unasked = {n for n, r in (*trainers.items(), *launchers.items()) if r is UNASKED}
        PROBE_BOOK.unasked(job, [p for p in targets if p.name in unasked])
        asked = [p for p in targets if p.name not in unasked]
        return (asked, {n: r for n, r in trainers.items() if n not in unasked and isinstance(r, TrainerProbe)},
                {n: r for n, r in launchers.items() if n not in unasked and isinstance(r, LauncherReport)})

    probed, trainers, launchers = await read(PROBE_BOOK.first_round(job, running, cap, urgent, settings.resync_seconds))
    rest = PROBE_BOOK.record(job, probed, running, trainers, launchers, builtin)
    if rest:
        more, more_trainers, more_launchers = await read(rest)
        PROBE_BOOK.record(job, more, running, more_trainers, more_launchers, builtin)
        probed, trainers, launchers = probed + more, {**trainers, **more_trainers}, {**launchers, **more_launchers}
    kept_trainers, kept_launchers = PROBE_BOOK.lasting(job, running, probed)
    return Reading(probed, launchers, {**kept_trainers, **trainers}, {**kept_launchers, **launchers})


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
    """(kind, name) of the children this pass created (new objects, not ones that existed
    already); the loop also waits until the watch shows them among the job's own, so the
    next pass does not create them again."""
    rotation_deferred: bool = False
    """The pass answered an event and left the job's due rotation of probes for a
    routine pass soon after (``probing.ProbeBook.first_round``)."""


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
    received = receive(body)
    before = await source(ns, name)
    probes: dict[str, Any] = {}
    attempts: dict[str, dict[str, int]] = {}
    memory: dict[str, ContainerMemory] = {}
    rejected: dict[str, tuple[str, ...]] = {}
    peer_waits: dict[str, float] = {}
    silent: dict[str, float] = {}
    since_answer: dict[str, float] = {}
    job = received.job
    if settings.probes_enabled and job is not None:  # the plan of an invalid job reads no probe
        heard_in_term(getattr(gate, "term", 0))
        running = _running_workers([pod_view(p) for p in before.owned_by(job_uid(body)).pods])
        reading = await read_workers((ns, name), running, job.spec.trainer.builtin is not None, job.spec.metrics.port,
                                     settings, urgent)
        probes, attempts, rejected = combine(reading.trainers, reading.all_launchers)
        memory, peer_waits = memory_of(reading.all_launchers), peer_waits_of(reading.launchers)
        silent = SILENCES.track((ns, name), reading.probed, reading.launchers, running)
        since_answer = SILENCES.since_answer((ns, name))
    probed = time.perf_counter()
    async with slots.held(urgent, key) if slots is not None else no_slot() as waited:
        # A watch-fed source costs nothing to read again; a listing one (tests) is read once.
        children = await source(ns, name) if before.body is not None else before
        if children.body is not None and children.body is not body:
            body, received = children.body, receive(children.body)
        observed = children.owned_by(job_uid(body)).observed(probes=probes, launcher_attempts=attempts, launcher_memory=memory,
                                                                 peer_waits=peer_waits, silent=silent, since_answer=since_answer,
                                                                 rejected_values=rejected,
                                                                 tier_conflicts=tier_conflicts(body, children.jobs),
                                                                 **refused_before(ns, name))
        try:
            return await _decide_and_write(k8s, body, received, settings, now or datetime.now(UTC), started + waited,
                                           observed, gate, jobs)
        finally:
            took = time.perf_counter() - started
            if took >= SLOW_PASS_SECONDS:
                log.info("job %s/%s: slow %s pass, %.2fs: probes %.2fs, waiting for a slot %.2fs, planning and writes %.2fs",
                         ns, name, "urgent" if urgent else "routine", took, probed - started, waited,
                         took - (probed - started) - waited)


def refused_before(namespace: str, name: str) -> dict[str, Any]:
    """``Observed`` fields for the creates the API server refused last time."""
    refusal = _REFUSALS.get((namespace, name))
    if refusal is None:
        return {}
    return {"refused": tuple(str(r) for r in refusal.refused), "retry_creates_at": refusal.retry_at}


async def _decide_and_write(k8s: K8s, body: dict[str, Any], received: Received, settings: OperatorSettings, now: datetime,
                            started: float, observed: Observed, gate: WriteGate | None, jobs: int = 1) -> PassResult:
    """``received``: ``body`` as read by ``receive``; the raw body is kept for what is
    written back (the status patch against the stored status, its resourceVersion, the
    Events' involved object)."""
    meta = body["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    if received.job is not None and _needs_dependency_check(received):
        observed = replace(observed, missing=await missing_dependencies(k8s, received.job, settings.check_secrets))
    pod_group, workload = await asyncio.gather(read_pod_group(k8s, received), read_workload(k8s, received.job))
    if pod_group is not None:
        observed = replace(observed, pod_group=pod_group)
    if workload is not None:
        observed = replace(observed, workload=workload)
    result = plan_received(received, observed, now, settings.runtime_image,
                           PodPolicy.from_settings(settings.allow_privileged_pods, settings.allowed_service_accounts),
                           settings.failure_conditions(), isolation_of(settings), token_key_of(settings))
    old_status = body.get("status") or {}
    changed = status_changed(old_status, result.status, settings.status_flush_seconds, now, progress_pace(settings, jobs))
    check(gate)
    written = await write(k8s, body, result.actions, merge_patch(old_status, result.status) if changed else None, gate)
    _remember_refusals(ns, name, written.refused, now, written.attempted)
    action_error, status_error = written.action_error, written.status_error
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
    created = tuple((a.kind, a.name) for a in written.created)
    return PassResult(result, result.status.get("lastReconcileTime") if changed else None, created,
                      PROBE_BOOK.rotation_deferred((ns, name)))


def _remember_refusals(namespace: str, name: str, refused: tuple[Refused, ...], now: datetime, attempted: bool) -> None:
    """The refusals the next passes report (``Observed.refused``) and the backoff they
    wait (counted in a row). A pass without a refusal clears them, unless the backoff held
    its creates back (``attempted``: the pass sent writes of the first round)."""
    key = (namespace, name)
    if not refused:
        before = _REFUSALS.get(key)
        if before is not None and (attempted or now >= before.retry_at):
            del _REFUSALS[key]
        return
    before = _REFUSALS.get(key)
    _REFUSALS[key] = refusal = Refusal((before.count if before else 0) + 1, refused, now)
    for one in refused:
        log.warning("job %s/%s: the API server refused: %s (retrying in %.0fs)", namespace, name, one, refusal.retry_after)


_TERM_HEARD = [0]
"""The leader term (``Leadership.term``) whose passes filled ``SILENCES`` and ``PROBE_BOOK``."""


def heard_in_term(term: int) -> None:
    """Forget every job's silences and probe answers when ``term`` is not the one they were
    heard in: a replica that leads again (it lost the Lease and won it back) starts from its
    first probes, as a new leader does. Called at the start of a pass, on the event loop."""
    if term != _TERM_HEARD[0]:
        SILENCES.clear()
        PROBE_BOOK.clear()
        _TERM_HEARD[0] = term


def forget(namespace: str, name: str) -> None:
    """A deleted job's remembered refusals, silences and probe answers."""
    _REFUSALS.pop((namespace, name), None)
    SILENCES.forget((namespace, name))
    PROBE_BOOK.forget((namespace, name))
