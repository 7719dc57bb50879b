"""What the operator observed in one pass: pods, nodes, children, trainer probes.

Plain frozen dataclasses, built from raw Kubernetes objects by pure ``from_object``
functions. The k8s layer lists the objects; the planner only ever sees these views, so
its table tests need no cluster and no client library.
"""

from __future__ import annotations

import re

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, UTC
from typing import Any

from llmtrain_contract.names import CONFIG_HASH_ANNOTATION

from . import untrusted
from .vocabulary import PodPhase

ZONE_LABEL = "topology.kubernetes.io/zone"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""A GPU's memory in MiB, as NVIDIA's GPU feature discovery labels its nodes."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""The GPU's product name with dashes for spaces (``NVIDIA-H100-80GB-HBM3``), likewise."""
GPU_LABELS = (GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL)
GPU_RESOURCE = "nvidia.com/gpu"
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
OPERATOR_LABEL_PREFIX = "llmtrain.io/"
"""Every label the operator puts on its pods is under this prefix; a job's podTemplate may
not set one (``spec.PodTemplateMetadata``)."""
LABEL_JOB = "llmtrain.io/job"
LABEL_ROLE = "llmtrain.io/role"
LABEL_SLOT = "llmtrain.io/slot"
LABEL_GENERATION = "llmtrain.io/generation"
LABEL_INCARNATION = "llmtrain.io/incarnation"
"""Which of a slot's pods this is: 0 for the first, one more for each replacement (its
name ends ``-<n>``, so a failed pod can be kept with its log while the next one runs)."""
MAX_INCARNATION = 1_000_000
"""Above this an incarnation label is refused (read as 0): no operator writes one so high."""
LABEL_KEPT = "llmtrain.io/kept"
"""``"true"`` on a failed worker pod the operator keeps for its log: it has been charged
and replaced, and no policy acts on it but the retention of ``faultTolerance.keepFailedPods``."""
ROLE_WORKER = "worker"
ROLE_STORE = "rendezvous"
CADENCE_ANNOTATION = "llmtrain.io/cadence-failures"
"""On the job's ConfigMap: the failure count its ``cadence.json`` holds (auto cadence)."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = str(value).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)  # a stamp without a zone is UTC


def format_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_time_ms(value: datetime) -> str:
    """To the millisecond, for a deadline a second's truncation would move by up to a
    second (a 1 s backoff); a whole second is written as ``format_time`` writes it."""
    ms = value.microsecond // 1000
    return format_time(value) if not ms else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ms:03d}Z"


@dataclass(frozen=True)
class PodView:
    name: str
    role: str
    slot: int | None
    generation: int
    phase: str
    """Pending | Running | Succeeded | Failed | Unknown."""
    uid: str = ""
    """The pod object's uid: a failure is charged once per uid (a replacement under the
    same stable name is another pod)."""
    node: str | None = None
    ready: bool = False
    ready_since: datetime | None = None
    """When the Ready condition last changed (its ``lastTransitionTime``, whole seconds, by
    the clock of whoever wrote it: the kubelet, or the node lifecycle controller)."""
    deleting: bool = False
    created: datetime | None = None
    started: datetime | None = None
    exit_code: int | None = None
    """The trainer container's exit code once it terminated."""
    finished: datetime | None = None
    """When the container terminated."""
    reason: str | None = None
    """``state.terminated.reason`` (OOMKilled, Error ...) or the pod's status reason (Evicted)."""
    message: str | None = None
    termination: dict[str, Any] = field(default_factory=dict)
    """The launcher's termination message (code, reason, rank, step), when present: only
    its fields with usable values (``untrusted.termination``)."""
    rejected: tuple[str, ...] = ()
    """Values this pod supplied that were unusable and ignored, each named (a label, a
    termination message's field): reported once as an Event (``policies/pod_values.py``)."""
    disruption: bool = False
    """A ``DisruptionTarget`` condition or an eviction: the pod was taken away."""
    unschedulable: bool = False
    schedule_message: str | None = None
    """The scheduler's words when it cannot place the pod (the ``PodScheduled`` condition's
    message: ``0/4 nodes are available: 3 Insufficient nvidia.com/gpu ...``), bounded."""
    ip: str | None = None
    waiting_reason: str | None = None
    """Why the trainer container has not started (``state.waiting.reason``), e.g.
    ``CreateContainerConfigError`` for a missing Secret or key."""
    waiting_message: str | None = None
    """The kubelet's words for it (``state.waiting.message``)."""
    incarnation: int = 0
    """``LABEL_INCARNATION``: 0 for a slot's first pod, one more for each replacement."""
    kept: bool = False
    """A failed worker pod kept for its log (``LABEL_KEPT``); the label on any other pod is
    refused (``rejected``), so no live or finished pod can be hidden from the operator (a
    kept pod nobody charged is charged all the same: ``policies/pod_failures.py``)."""

    @property
    def active(self) -> bool:
        return not self.deleting and self.phase in (PodPhase.PENDING, PodPhase.RUNNING, PodPhase.UNKNOWN)

    @property
    def terminated(self) -> bool:
        return self.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)


def _container_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses: list[dict[str, Any]] = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == "trainer" or len(statuses) == 1:
            return status
    return {}


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What ``pod_view`` reads of a pod, for the operator's in-memory index: its metadata
    but the field-manager history, its node, its status. The spec (containers, env,
    volumes) is most of a pod's size, and the index holds every pod of every job."""
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    node = (pod.get("spec") or {}).get("nodeName")
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": pod.get("status") or {}}


def slim_child(obj: dict[str, Any]) -> dict[str, Any]:
    """What the operator reads of a job's Service or ConfigMap, for its in-memory index:
    the name, the owners (``owned_by``) and the annotations (a ConfigMap's say what it
    holds: ``ConfigMapView``)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name", ""), "ownerReferences": list(meta.get("ownerReferences") or []),
                         "annotations": dict(meta.get("annotations") or {})}}


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether ``obj`` is a child of the object with ``uid``: one of its ownerReferences
    names that uid. The job label only selects candidates: an object a namesake job left
    behind (deleted and created again under the same name) or a copy labelled by hand
    carries the label too, and is not this job's to count, replace or delete."""
    return bool(uid) and any(isinstance(ref, dict) and ref.get("uid") == uid
                             for ref in (obj.get("metadata") or {}).get("ownerReferences") or ())


def job_owner_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the LLMTrainJob ``obj`` belongs to (its ownerReferences), if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("kind") == "LLMTrainJob" and isinstance(ref.get("uid"), str):
            return str(ref["uid"])
    return None


def slim_node(node: dict[str, Any]) -> dict[str, Any]:
    """What ``node_view`` reads of a Node: its name, zone and GPU labels, taints,
    conditions and GPU count (not its other labels, images, addresses or resources)."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    kept = {key: labels[key] for key in (ZONE_LABEL, *GPU_LABELS) if key in labels}
    return {"metadata": {"name": meta.get("name", ""), **({"labels": kept} if kept else {})},
            "spec": {"taints": (node.get("spec") or {}).get("taints") or []},
            "status": {"conditions": (node.get("status") or {}).get("conditions") or [],
                       **{part: {GPU_RESOURCE: amounts[GPU_RESOURCE]} for part in ("capacity", "allocatable")
                          if isinstance(amounts := (node.get("status") or {}).get(part), dict) and GPU_RESOURCE in amounts}}}


def _zone(node: dict[str, Any]) -> str | None:
    return ((node.get("metadata") or {}).get("labels") or {}).get(ZONE_LABEL)


MESSAGE_LIMIT = 600
"""Characters of a component's message the status repeats (the scheduler's lists every
node's reason and grows with the cluster)."""


def _bounded(message: Any) -> str | None:
    if not isinstance(message, str) or not message:
        return None
    return message if len(message) <= MESSAGE_LIMIT else message[:MESSAGE_LIMIT] + "..."


def pod_view(pod: dict[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    cstatus = _container_state(pod)
    terminated = (cstatus.get("state") or {}).get("terminated") or (cstatus.get("lastState") or {}).get("terminated")
    if status.get("phase") not in (PodPhase.SUCCEEDED, PodPhase.FAILED):
        terminated = (cstatus.get("state") or {}).get("terminated")
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    termination, rejected = untrusted.termination(terminated.get("message")) if terminated else ({}, [])
    generation = untrusted.count(labels.get(LABEL_GENERATION, "0") or "0")
    if generation is None:
        rejected.append(f"label {LABEL_GENERATION} ({untrusted.shown(labels.get(LABEL_GENERATION))})")
    raw_code = terminated.get("exitCode") if terminated else None
    code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) and -2**31 <= raw_code < 2**31 else None
    if raw_code is not None and code is None:
        rejected.append(f"exit code ({untrusted.shown(raw_code)})")
    reason = (terminated or {}).get("reason") or status.get("reason")
    if reason is not None and untrusted.token(reason) is None:
        rejected.append(f"termination reason ({untrusted.shown(reason)})")
        reason = None
    sched = conditions.get("PodScheduled") or {}
    slot = untrusted.count(labels[LABEL_SLOT]) if isinstance(labels.get(LABEL_SLOT), str) else None
    if LABEL_SLOT in labels and slot is None:
        rejected.append(f"label {LABEL_SLOT} ({untrusted.shown(labels[LABEL_SLOT])})")
    incarnation = untrusted.count(labels.get(LABEL_INCARNATION, "0") or "0")
    if incarnation is not None and incarnation > MAX_INCARNATION:
        incarnation = None
    if incarnation is None:
        rejected.append(f"label {LABEL_INCARNATION} ({untrusted.shown(labels.get(LABEL_INCARNATION))})")
    phase = status.get("phase") or PodPhase.PENDING
    kept = labels.get(LABEL_KEPT) == "true" and labels.get(LABEL_ROLE) == ROLE_WORKER and phase == PodPhase.FAILED
    if LABEL_KEPT in labels and not kept:
        rejected.append(f"label {LABEL_KEPT} ({untrusted.shown(labels[LABEL_KEPT])}) on a pod that has not failed")
    waiting = (cstatus.get("state") or {}).get("waiting") or {}
    unschedulable = sched.get("status") == "False" and sched.get("reason") == "Unschedulable"
    return PodView(
        name=meta.get("name", ""),
        role=labels.get(LABEL_ROLE, ""),
        slot=slot,
        generation=generation or 0,
        phase=phase,
        uid=meta.get("uid") or "",
        node=(pod.get("spec") or {}).get("nodeName"),
        ready=(conditions.get("Ready") or {}).get("status") == "True",
        ready_since=parse_time((conditions.get("Ready") or {}).get("lastTransitionTime")),
        deleting=meta.get("deletionTimestamp") is not None,
        created=parse_time(meta.get("creationTimestamp")),
        started=parse_time(status.get("startTime")),
        exit_code=code,
        finished=parse_time(terminated.get("finishedAt")) if terminated else None,
        reason=reason,
        message=status.get("message"),
        termination=termination,
        rejected=tuple(rejected),
        disruption=(conditions.get("DisruptionTarget") or {}).get("status") == "True" or status.get("reason") == "Evicted",
        unschedulable=unschedulable,
        schedule_message=_bounded(sched.get("message")) if unschedulable else None,
        ip=status.get("podIP"),
        waiting_reason=waiting.get("reason"),
        waiting_message=waiting.get("message"),
        incarnation=incarnation or 0,
        kept=kept,
    )


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: str
    """The Ready condition's status: True | False | Unknown."""
    since: datetime | None
    """When the Ready condition last changed."""
    unreachable: bool = False
    """Tainted ``node.kubernetes.io/unreachable`` (or ``not-ready``) by the node controller."""
    zone: str = ""
    """``topology.kubernetes.io/zone`` ("" without one): nodes that fail together in a zone
    are a disruption, not failures (policies/node_failures.py)."""
    gpu_memory_mib: int | None = None
    """``nvidia.com/gpu.memory``, when the node has it and it is a number."""
    gpu_product: str = ""
    """``nvidia.com/gpu.product`` ("" without one)."""
    problems: tuple[str, ...] = ()
    """The node's conditions other than Ready that are True (a node-problem-detector's or a
    GPU health agent's ``KernelDeadlock``, say), each a valid condition type; which of them
    count as a failure is the operator's setting (``policies/node_health.py``)."""
    gpu_capacity: int | None = None
    gpu_allocatable: int | None = None
    """``nvidia.com/gpu`` in the node's capacity and allocatable: NVIDIA's device plugin
    takes a GPU it finds unhealthy (an XID error) out of allocatable."""

    @property
    def failed(self) -> bool:
        # Ready decides: the controller removes its unreachable taint a moment *after* a
        # node is Ready again, and that moment must not look like a failure.
        return self.ready != "True"


def node_view(node: dict[str, Any]) -> NodeView:
    status = node.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    ready = conds.get("Ready") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    bad = {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}
    labels = (node.get("metadata") or {}).get("labels") or {}
    return NodeView(
        name=(node.get("metadata") or {}).get("name", ""),
        ready=ready.get("status", "Unknown"),
        since=parse_time(ready.get("lastTransitionTime")),
        unreachable=any(t.get("key") in bad and t.get("effect") in ("NoExecute", "NoSchedule") for t in taints),
        zone=_zone(node) or "",
        gpu_memory_mib=untrusted.count(labels.get(GPU_MEMORY_LABEL)) if isinstance(labels.get(GPU_MEMORY_LABEL), str) else None,
        gpu_product=product if isinstance(product := labels.get(GPU_PRODUCT_LABEL), str) and _LABEL_VALUE.fullmatch(product) else "",
        problems=tuple(sorted(t for t, c in conds.items() if isinstance(t, str) and t != "Ready" and untrusted.token(t)
                              and isinstance(c, dict) and c.get("status") == "True")),
        gpu_capacity=_gpus(status.get("capacity")),
        gpu_allocatable=_gpus(status.get("allocatable")),
    )


def _gpus(resources: Any) -> int | None:
    value = resources.get(GPU_RESOURCE) if isinstance(resources, dict) else None
    return untrusted.count(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class ContainerMemory:
    """A worker container's memory cgroup as its launcher reads it (``memcg.py``)."""

    oom_kills: int
    """Processes the kernel's OOM killer ended in the container since the launcher started."""
    peak_bytes: int | None = None
    limit_bytes: int | None = None


@dataclass(frozen=True)
class TrainerProbe:
    """What one worker's trainer reported on its metrics endpoint."""

    step: int | None = None
    world_size: int | None = None
    restarts: int | None = None
    """torchrun's failure restarts in this pod."""
    failed_attempts: dict[str, int] = field(default_factory=dict)
    """cause -> failed attempts in this pod: ``crash`` and ``hang`` (a rank here failed:
    charged), ``victim`` (a peer elsewhere vanished: not charged), ``preempted``."""
    last_step_time: float | None = None
    """Unix time the trainer finished its newest step (recovery ends at the first new one)."""
    last_checkpoint: dict[str, int] = field(default_factory=dict)
    """tier -> newest committed step."""
    tier_degraded: dict[str, str] = field(default_factory=dict)
    """tier -> why it is degraded now (a ``TIER_REASONS`` key); healthy tiers absent."""
    interval_steps: int | None = None
    """The checkpoint interval in force."""
    cost_seconds: float | None = None
    """The adaptive cadence's measured checkpoint cost (reported by global rank 0)."""
    latency_seconds: float | None = None
    """The adaptive cadence's measured write latency (reported by global rank 0)."""
    mtbf_seconds: float | None = None
    """The adaptive cadence's MTBF (reported by global rank 0)."""
    step_seconds: float | None = None
    """The adaptive cadence's typical step time (reported by global rank 0)."""
    loss: float | None = None
    """The newest step's loss (the global batch's mean, the same on every rank)."""
    tokens_per_second: float | None = None
    """The job's throughput over its newest step (the same on every rank)."""
    rank: int | None = None
    """The global rank of the process that serves this page (the pod's local rank 0):
    0 on the pod that holds global rank 0, whose log is the job's step log."""
    rollbacks: int | None = None
    """Rollbacks for bad numerics over the job."""
    heals: int | None = None
    """In-process heals over the job."""
    skipped: tuple[tuple[int, int, int, int], ...] = ()
    """Skipped windows: (first step, last step, first sample, end sample)."""
    stragglers: dict[int, float] = field(default_factory=dict)
    """Straggling ranks of this pod's node -> local step time over the others' median."""
    rejected: tuple[str, ...] = ()
    """Values on the page that were unusable and ignored, each named (``probe.parse``);
    ``probe.combine`` gathers them into ``Observed.rejected_values``."""


@dataclass(frozen=True)
class ConfigMapView:
    config_hash: str
    """The hash annotation of the rendered trainer config."""
    cadence: str | None = None
    """The failure history it carries for the adaptive cadence (its annotation)."""

    @classmethod
    def from_annotations(cls, annotations: dict[str, str] | None) -> ConfigMapView:
        annotations = annotations or {}
        return cls(annotations.get(CONFIG_HASH_ANNOTATION, ""), annotations.get(CADENCE_ANNOTATION))


@dataclass(frozen=True)
class PodGroupView:
    """The gang job's PodGroup as read this pass (``scheduling.gang``)."""

    served: bool
    """The cluster serves the PodGroup API of the chosen scheduler (its CRD is installed)."""
    exists: bool = False
    phase: str = ""
    """``status.phase`` as the scheduler set it (Volcano: Pending, Inqueue, Running ...)."""
    spec: dict[str, Any] = field(default_factory=dict)
    refused: str = ""
    """The API server's words when it refused to let the operator read it (RBAC)."""
    foreign: str = ""
    """An object of that name exists that is not this job's (its ownerReferences name no
    such uid): never taken for the job's, updated or deleted; the workers wait."""
    uid: str = ""


def _foreign(kind: str, obj: dict[str, Any], owner_uid: str | None) -> str:
    """Why ``obj`` is not this job's, or "" when it is (or no owner was given to check)."""
    if owner_uid is None or owned_by(obj, owner_uid):
        return ""
    name = (obj.get("metadata") or {}).get("name", "")
    return (f"a {kind} named {name} exists that is not this job's (its ownerReferences do not name the job's uid): "
            "a namesake job's left on its way out, or someone else's; the job waits until it is gone")


def pod_group_view(obj: dict[str, Any] | None, served: bool = True, owner_uid: str | None = None) -> PodGroupView:
    """``owner_uid``: the job's uid, which a PodGroup of the job names in its ownerReferences."""
    if not served:
        return PodGroupView(served=False)
    if obj is None:
        return PodGroupView(served=True)
    if foreign := _foreign("PodGroup", obj, owner_uid):
        return PodGroupView(served=True, foreign=foreign)
    return PodGroupView(served=True, exists=True, phase=str((obj.get("status") or {}).get("phase") or ""),
                        spec=dict(obj.get("spec") or {}), uid=str((obj.get("metadata") or {}).get("uid") or ""))


@dataclass(frozen=True)
class WorkloadView:
    """A queued job's Kueue Workload as read this pass (label ``kueue.x-k8s.io/queue-name``)."""

    served: bool
    """The cluster serves Kueue's Workload API."""
    exists: bool = False
    admitted: bool = False
    """Kueue admitted it (condition ``Admitted``) and has not evicted it since."""
    reserved: bool = False
    """It holds quota (``status.admission`` is set)."""
    evicted: str | None = None
    """Kueue's words when its ``Evicted`` condition is True."""
    finished: bool = False
    cluster_queue: str = ""
    conditions: tuple[dict[str, Any], ...] = ()
    resource_version: str = ""
    node_selector: dict[str, str] = field(default_factory=dict)
    foreign: str = ""
    """As ``PodGroupView.foreign``: a Workload of that name that is not this job's."""
    """The assigned ResourceFlavors' ``nodeLabels``, for the pods (read with them)."""
    tolerations: tuple[dict[str, Any], ...] = ()
    """The assigned ResourceFlavors' ``tolerations``."""
    refused: str = ""
    """The API server's words when it refused to let the operator read it (RBAC)."""


def _true(conditions: dict[str, dict[str, Any]], type_: str) -> dict[str, Any] | None:
    cond = conditions.get(type_)
    return cond if cond is not None and cond.get("status") == "True" else None


def workload_view(obj: dict[str, Any] | None, served: bool = True, flavors: Sequence[dict[str, Any]] = (),
                  owner_uid: str | None = None) -> WorkloadView:
    """``flavors``: the ResourceFlavor objects the admission assigned; ``owner_uid``: the
    job's uid, which the job's Workload names in its ownerReferences."""
    if not served:
        return WorkloadView(served=False)
    if obj is None:
        return WorkloadView(served=True)
    if foreign := _foreign("Workload", obj, owner_uid):
        return WorkloadView(served=True, foreign=foreign)
    status = obj.get("status") or {}
    raw = tuple(c for c in status.get("conditions") or [] if isinstance(c, dict))
    conditions: dict[str, dict[str, Any]] = {c.get("type", ""): c for c in raw}
    evicted = _true(conditions, "Evicted")
    admission = status.get("admission") or {}
    selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    for flavor in flavors:
        spec = flavor.get("spec") or {}
        selector.update(spec.get("nodeLabels") or {})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
    return WorkloadView(
        served=True, exists=True,
        admitted=bool(admission) and _true(conditions, "Admitted") is not None and evicted is None,
        reserved=bool(admission), evicted=(evicted.get("message") or evicted.get("reason") or "evicted") if evicted else None,
        finished=_true(conditions, "Finished") is not None, cluster_queue=str(admission.get("clusterQueue") or ""),
        conditions=raw, resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""),
        node_selector=selector, tolerations=tuple(tolerations),
    )


def assigned_flavors(obj: dict[str, Any] | None) -> list[str]:
    """The ResourceFlavor names a Workload's admission assigned, each once."""
    admission = ((obj or {}).get("status") or {}).get("admission") or {}
    names: list[str] = []
    for assignment in admission.get("podSetAssignments") or []:
        for name in (assignment.get("flavors") or {}).values():
            if name not in names:
                names.append(name)
    return names


@dataclass(frozen=True)
class Observed:
    pods: tuple[PodView, ...] = ()
    nodes: dict[str, NodeView] = field(default_factory=dict)
    services: frozenset[str] = frozenset()
    configmaps: dict[str, ConfigMapView] = field(default_factory=dict)
    """ConfigMap name -> what its annotations say it holds."""
    network_policies: frozenset[str] = frozenset()
    """The job's own NetworkPolicies, by name (``manifests.network_policy``)."""
    probes: dict[str, TrainerProbe] = field(default_factory=dict)
    """Pod name -> probe."""
    launcher_attempts: dict[str, dict[str, int]] = field(default_factory=dict)
    """Pod name -> failed attempts by cause, as the pod's launcher counts them: the same
    count as the trainer's ``TrainerProbe.failed_attempts``, known seconds sooner (and
    while the restarted trainer is not up yet)."""
    launcher_memory: dict[str, ContainerMemory] = field(default_factory=dict)
    """Pod name -> its container's OOM kills, memory peak and limit, as its launcher reads
    them (a rank the OOM killer ended is restarted in place and looks like any crash)."""
    peer_waits: dict[str, float] = field(default_factory=dict)
    """Pod name -> seconds its ranks have been blocked on a peer in another pod, as its
    launcher's supervisor judged them (victims); only pods whose ranks are."""
    silent: dict[str, float] = field(default_factory=dict)
    """Running worker pod -> seconds its launcher has not answered the operator's probes
    (since the first unanswered one in a row, by this operator's clock); only pods whose
    launcher did not answer this pass."""
    since_answer: dict[str, float] = field(default_factory=dict)
    """Silent pod -> seconds since its launcher last answered this operator (only pods it
    heard before: not after a leader change, nor a pod never heard)."""
    rejected_values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Pod name -> values its trainer's or launcher's endpoint served that were unusable
    and ignored, each named (``probe.parse``): reported once as an Event."""
    missing: tuple[str, ...] = ()
    """Referenced objects that do not exist, e.g. ``Secret s3-creds``, ``PersistentVolumeClaim ckpt``."""
    tier_conflicts: tuple[str, ...] = ()
    """Checkpoint tiers the job shares with an older live job, each naming it
    (``planner/tierclaims.py``)."""
    refused: tuple[str, ...] = ()
    """Creates the API server refused in the previous pass, with its words, e.g. ``create
    Pod x: pods "x" is forbidden: exceeded quota: gpu, requested: ...``."""
    retry_creates_at: datetime | None = None
    """Refused creates are tried again from this time on (backoff)."""
    pod_group: PodGroupView | None = None
    """A gang job's PodGroup; None when it was not read this pass (a steady job's is not)."""
    workload: WorkloadView | None = None
    """A queued job's Kueue Workload; None for a job without the queue label."""

    def workers(self) -> list[PodView]:
        """The job's worker pods but those kept for their logs (``kept_workers``): every
        policy acts on these; a kept pod was charged and replaced already."""
        return [p for p in self.pods if p.role == ROLE_WORKER and not p.kept]

    def kept_workers(self) -> list[PodView]:
        """Failed worker pods kept for their logs, newest first (``policies/kept.py``)."""
        kept = [p for p in self.pods if p.role == ROLE_WORKER and p.kept]
        return sorted(kept, key=lambda p: (p.finished or p.created or _EPOCH, p.incarnation, p.name), reverse=True)

    def next_incarnation(self, slot: int) -> int:
        """The incarnation of a new pod for ``slot``: one more than any pod of the slot
        still here (kept ones included, so a kept pod's name is never asked for again);
        0 when none is. Deterministic: a pass that plans again from the same pods asks for
        the same name, and the API server's AlreadyExists keeps a slot to one pod."""
        mine = [p.incarnation for p in self.pods if p.role == ROLE_WORKER and p.slot == slot]
        return max(mine) + 1 if mine else 0

    def worker_probes(self) -> list[TrainerProbe]:
        """The probes of the job's current worker pods (a probe of a pod gone is not)."""
        return [self.probes[p.name] for p in self.workers() if p.name in self.probes]

    def store(self) -> PodView | None:
        return next((p for p in self.pods if p.role == ROLE_STORE and not p.deleting), None)
