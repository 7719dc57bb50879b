"""Builders for planner tests: jobs, pods, nodes and probes without a cluster."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, UTC
from typing import Any

from llmtrain_operator.api.observed import ConfigMapView, NodeView, Observed, PodView, TrainerProbe, format_time
from llmtrain_operator.planner import (CreateObject, DeleteJob, DeleteObject, DeletePod, KeepPod, PatchStatus, ReplaceObject,
                                      SetSuspend, UpdateSpec)
from llmtrain_operator.planner.manifests import CONFIG_HASH_ANNOTATION, config_map
from llmtrain_operator.api import parse_job
from support.specs import apply_set, load_job

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)
CREATED = NOW - timedelta(minutes=10)


def ago(seconds: float) -> str:
    return format_time(NOW - timedelta(seconds=seconds))


def job(changes: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> dict[str, Any]:
    raw = load_job()
    raw["metadata"].update(namespace="ml", uid="uid-1", generation=1, creationTimestamp=format_time(CREATED))
    raw = apply_set(raw, changes or {})
    if status is not None:
        raw["status"] = copy.deepcopy(status)
    return raw


def worker(slot: int, phase: str = "Running", ready: bool = True, node: str | None = None, generation: int = 0,
           exit_code: int | None = None, reason: str | None = None, deleting: bool = False,
           disruption: bool = False, termination: dict[str, Any] | None = None, created: datetime = CREATED,
           incarnation: int = 0, kept: bool = False, finished: datetime | None = None, uid: str = "") -> PodView:
    return PodView(
        name=f"tiny-elastic-worker-{slot}" + (f"-{incarnation}" if incarnation else ""), role="worker", slot=slot,
        generation=generation, phase=phase, node=node or f"node-{slot}", ready=ready and phase == "Running", deleting=deleting,
        created=created, exit_code=exit_code, reason=reason, disruption=disruption, termination=termination or {},
        incarnation=incarnation, kept=kept, finished=finished, uid=uid,
    )


def store(phase: str = "Running") -> PodView:
    return PodView(name="tiny-elastic-rdzv", role="rendezvous", slot=None, generation=0, phase=phase, node="node-0", ready=True)


def node(name: str, ready: str = "True", since_seconds: float = 3600, unreachable: bool = False) -> NodeView:
    return NodeView(name, ready, NOW - timedelta(seconds=since_seconds), unreachable)


def infrastructure(raw: dict[str, Any]) -> dict[str, Any]:
    """Services and the ConfigMap as they exist after the first pass."""
    try:
        cm = config_map(parse_job({**raw, "status": None}))
    except ValueError:  # an invalid spec has no rendered config
        cm = None
    return {
        "services": frozenset({"tiny-elastic-workers", "tiny-elastic-rdzv"}),
        "configmaps": {cm["metadata"]["name"]: ConfigMapView(cm["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])} if cm else {},
    }


def observed(raw: dict[str, Any], pods: list[PodView], nodes: list[NodeView] | None = None,
             probes: dict[str, TrainerProbe] | None = None, with_store: bool = True, **extra: Any) -> Observed:
    all_pods = tuple(pods) + ((store(),) if with_store else ())
    node_list = nodes if nodes is not None else [node(f"node-{i}") for i in range(4)]
    return Observed(pods=all_pods, nodes={n.name: n for n in node_list}, probes=probes or {},
                    **{**infrastructure(raw), **extra})


def summary(actions: list[Any]) -> list[str]:
    """Actions as short strings: ``create Pod/x``, ``delete x``, ``force-delete x``, ``keep x``."""
    out = []
    for a in actions:
        if isinstance(a, CreateObject):
            out.append(f"create {a.kind}/{a.name}")
        elif isinstance(a, ReplaceObject):
            out.append(f"replace {a.manifest['kind']}/{a.manifest['metadata']['name']}")
        elif isinstance(a, DeletePod):
            out.append(f"{'force-delete' if a.force else 'delete'} {a.name}")
        elif isinstance(a, KeepPod):
            out.append(f"keep {a.name}")
        elif isinstance(a, UpdateSpec):
            out.append(f"update {a.manifest['kind']}/{a.manifest['metadata']['name']}")
        elif isinstance(a, DeleteObject):
            out.append(f"delete {a.kind}/{a.name}")
        elif isinstance(a, PatchStatus):
            out.append(f"patch-status {a.kind}/{a.name}")
        elif isinstance(a, SetSuspend):
            out.append(f"suspend={str(a.suspend).lower()}")
        elif isinstance(a, DeleteJob):
            out.append("delete-job")
    return out


def running_status(**extra: Any) -> dict[str, Any]:
    base = {"phase": "Running", "startTime": ago(600), "lastReconcileTime": ago(5), "lastProgressTime": ago(5), "step": 20}
    return {**base, **extra}
