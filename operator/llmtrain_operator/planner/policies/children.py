"""Children: services, the job's NetworkPolicy (when the operator makes them), the rendered
config, the job's token Secret (with every pod created), the rendezvous store, and one
worker pod per slot (created when missing, removed on scale-down or when of an older
generation)."""

from __future__ import annotations

from llmtrain_contract.names import CONFIG_HASH_ANNOTATION

from ...api.observed import CADENCE_ANNOTATION
from ...api.vocabulary import ConditionType, PodPhase, Reason
from .. import backoff, manifests, names
from ..conditions import is_true
from ..context import CreateObject, DeletePod, Pass, ReplaceObject, Verdict
from ..decisions import CadenceShared
from ..podgroup import GangGate
from ..quarantine import active_quarantine
from ..queue import Admission, place
from ..tokens import JobToken


POLICY_SEEN_SECONDS = 1.0
"""The latest the next pass comes after a job's NetworkPolicy is created, should the
policy's own watch event (which wakes the job at once) be late."""


def handle(ctx: Pass, admission: Admission, gate: GangGate) -> Verdict:
    """``admission``: the queue's decision (the pods' placement); ``gate``: the gang's
    (whether worker pods may be created now)."""
    report_refusals(ctx)
    held = creates_held(ctx)
    isolated = False
    if not held:
        isolated = ensure_infrastructure(ctx, admission)
    reconcile_workers(ctx, admission, may_create=not held and isolated and gate.workers_held is None)
    return Verdict.CONTINUE


def report_refusals(ctx: Pass) -> None:
    """Creates the API server refused last time (a quota, an admission webhook, Pod
    Security, RBAC): the ``ReplicaFailure`` condition with the server's words and one
    Warning Event when it starts; the creates are retried after a backoff
    (``creates_held``) since a quota or a webhook may clear, and the condition clears
    when they pass."""
    if ctx.observed.refused:
        message = "; ".join(ctx.observed.refused)
        if ctx.condition(ConditionType.REPLICA_FAILURE, True, Reason.FAILED_CREATE, message):
            ctx.event(Reason.FAILED_CREATE, message, warning=True)
    elif is_true(ctx.status.conditions, ConditionType.REPLICA_FAILURE):
        ctx.condition(ConditionType.REPLICA_FAILURE, False, Reason.CREATES_ACCEPTED, "the API server accepts the job's objects again")
        ctx.event(Reason.CREATES_ACCEPTED, "the API server accepts the job's objects again")


def creates_held(ctx: Pass) -> bool:
    """Refused creates wait for their backoff (``Observed.retry_creates_at``); everything
    else in the pass (failures, deletes, timers) goes on."""
    at = ctx.observed.retry_creates_at
    if at is None or ctx.now >= at:
        return False
    ctx.after((at - ctx.now).total_seconds())
    return True


def ensure_infrastructure(ctx: Pass, admission: Admission) -> bool:
    """Creates what is missing of the job's Services, NetworkPolicy, config and store;
    whether the job's pods may be created now: not while its NetworkPolicy (when the
    operator makes one) is still to be seen, since a pod that started first would be open
    to every pod of the cluster until then. The policy's own watch event brings the next
    pass; a refused create is reported like any other (``report_refusals``)."""
    job = ctx.job
    created = []
    for manifest in (manifests.workers_service(job), manifests.store_service(job)):
        if manifest["metadata"]["name"] not in ctx.observed.services:
            ctx.actions.append(CreateObject(manifest))
            created.append(f"Service {manifest['metadata']['name']}")
    isolated = True
    if ctx.isolation is not None:
        policy = manifests.network_policy(job, ctx.isolation)
        if policy["metadata"]["name"] not in ctx.observed.network_policies:
            ctx.actions.append(CreateObject(policy))
            created.append(f"NetworkPolicy {policy['metadata']['name']}")
            isolated = False
            ctx.after(POLICY_SEEN_SECONDS)  # the pass after this one's writes are seen creates the pods
    cadence = ctx.status.checkpoint_cadence
    cm = manifests.config_map(job, cadence.history if cadence is not None else None)
    if cm is not None:
        annotations = cm["metadata"]["annotations"]
        have = ctx.observed.configmaps.get(cm["metadata"]["name"])
        if have is None:
            ctx.actions.append(CreateObject(cm))
            created.append(f"ConfigMap {cm['metadata']['name']}")
        elif have.config_hash != annotations[CONFIG_HASH_ANNOTATION]:
            ctx.actions.append(ReplaceObject(cm))
            ctx.event(Reason.CONFIG_UPDATED,
                      f"re-rendered ConfigMap {cm['metadata']['name']}; running workers keep the old one until they restart")
        elif have.cadence != annotations.get(CADENCE_ANNOTATION):
            # The failure history changed: the kubelet refreshes it in the running pods.
            ctx.actions.append(ReplaceObject(cm))
            ctx.decide(CadenceShared(int(annotations.get(CADENCE_ANNOTATION, "0"))))
    store = ctx.observed.store()
    if store is None:
        if isolated:  # else the next pass, once the policy is seen
            token = ensure_token(ctx)
            ctx.actions.append(CreateObject(place(manifests.store_pod(job, ctx.runtime_image, token), admission)))
            created.append(f"Pod {names.store_pod(job.metadata.name)} (rendezvous store)")
    elif store.terminated:
        ctx.actions.append(DeletePod(store.name))
        ctx.event(Reason.STORE_RESTARTED, f"the rendezvous store pod {store.name} ended ({store.phase}); recreating it", warning=True)
    if created:
        ctx.event(Reason.CREATED, "created " + ", ".join(created))
    return isolated


def ensure_token(ctx: Pass) -> JobToken | None:
    """Create the job's token Secret (``tokens.py``) for the pods this pass creates; the
    token they read, or None (no key: no token). The operator may create Secrets but not
    read them, so it does not know whether the Secret is there: it is created with every
    pass that creates a pod (one request; the API server answers 409 when it exists, and a
    Secret deleted by hand comes back with the same token), and the executor sends it
    before the pods (``handlers/executor.py``), which the kubelet would otherwise hold in
    ``CreateContainerConfigError`` until it exists."""
    token = ctx.job_token()
    if token is None:
        return None
    secret = CreateObject(manifests.token_secret(ctx.job, token))
    if secret not in ctx.actions:  # the store and the workers in one pass: one request
        ctx.actions.append(secret)
    return token


def reconcile_workers(ctx: Pass, admission: Admission, may_create: bool = True) -> None:
    """Scale down, replace old generations, and create missing slots (after backoff)."""
    spec, status = ctx.spec, ctx.status
    workers = ctx.observed.workers()
    for pod in workers:
        if pod.deleting or pod.terminated:
            continue
        if pod.slot is None or pod.slot >= spec.replicas.max:
            ctx.actions.append(DeletePod(pod.name))
            ctx.event(Reason.SCALED_DOWN, f"deleting {pod.name}: replicas.max is {spec.replicas.max}")
        elif pod.generation < status.restart_generation:
            ctx.actions.append(DeletePod(pod.name))
    # Any pod still holding a slot (running, finished, failed or being deleted) blocks its
    # replacement until it is gone or kept for its log (``workers`` leaves kept pods out):
    # one live pod per slot, so one pod per host name.
    occupied = {p.slot for p in workers if p.slot is not None}
    missing = [s for s in range(spec.replicas.max) if s not in occupied]
    if not missing:
        return
    if any(p.phase == PodPhase.SUCCEEDED for p in workers):
        return  # training finished on some worker: never start new ones
    if not may_create:
        return
    waits = {slot: backoff.wait_seconds(ctx, slot) for slot in missing}
    if any(waits.values()):
        ctx.after(min(w for w in waits.values() if w > 0), floor=backoff.TIMER_FLOOR, urgent=True)
    missing = [slot for slot in missing if waits[slot] <= 0]
    if not missing:
        return
    avoid = active_quarantine(ctx)
    token = ensure_token(ctx)
    created = []
    taken = {p.name for p in ctx.observed.pods}
    for slot in missing:
        incarnation = ctx.observed.next_incarnation(slot)
        while names.worker_pod(ctx.job.metadata.name, slot, incarnation) in taken:
            incarnation += 1  # a pod whose incarnation label was changed holds that name
        ctx.actions.append(CreateObject(place(manifests.worker_pod(ctx.job, slot, status.restart_generation, avoid, ctx.runtime_image,
                                                                   incarnation, joining=status.step > 0, token=token), admission)))
        created.append(names.worker_pod(ctx.job.metadata.name, slot, incarnation))
    pods = ", ".join(created)
    extra = f" (avoiding quarantined nodes {', '.join(avoid)})" if avoid else ""
    ctx.event(Reason.CREATED_WORKERS, f"created {pods} for generation {status.restart_generation}{extra}")
