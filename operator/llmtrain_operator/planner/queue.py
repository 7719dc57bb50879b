"""Kueue: a job labelled ``kueue.x-k8s.io/queue-name`` is queued. The operator is its
Kueue integration, as Kueue's own job reconcilers are for JobSet and Kubeflow's jobs: it
creates the job's Workload (owned by the job), keeps the job suspended until Kueue admits
the Workload, unsuspends it then (with the nodeSelector and tolerations of the assigned
ResourceFlavors on its pods), suspends it again when Kueue evicts it and then gives the
quota back, and marks the Workload Finished when the job ends. Policy in
``policies/queueing.py``; the finishing step here (``finish``) is used by
``policies/terminal.py``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..api.job import LLMTrainJob
from ..api.observed import WorkloadView, format_time
from . import names
from .context import Pass, PatchStatus

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
API_VERSION = "kueue.x-k8s.io/v1beta1"
KIND = "Workload"
PLURAL = "workloads"
FLAVORS = "resourceflavors"
WORKERS = "workers"
STORE = "rendezvous"
POLL_SECONDS = 5.0
"""A queued job's Workload is read at least this often (no watch): how soon an admission
or an eviction is acted on."""


def queue_of(job: LLMTrainJob) -> str | None:
    return (job.metadata.labels or {}).get(QUEUE_LABEL) or None


def workload_name(job_name: str) -> str:
    """Named as Kueue names its integrations' Workloads (``<kind>-<job>``)."""
    return f"llmtrainjob-{job_name}"[:253]


def workload(job: LLMTrainJob, owner: dict[str, Any], worker_pod: dict[str, Any], store_pod: dict[str, Any]) -> dict[str, Any]:
    """The job's Workload: one PodSet for the workers (``replicas.max`` pods; with
    ``replicas.min`` lower, Kueue may admit as few as that: partial admission) and one for
    the rendezvous store. The pod templates are the pods the operator will create."""
    workers: dict[str, Any] = {"name": WORKERS, "count": job.spec.replicas.max,
                               "template": {"metadata": {"labels": worker_pod["metadata"]["labels"]}, "spec": worker_pod["spec"]}}
    if job.spec.replicas.min < job.spec.replicas.max:
        workers["minCount"] = job.spec.replicas.min
    store = {"name": STORE, "count": 1, "template": {"metadata": {"labels": store_pod["metadata"]["labels"]}, "spec": store_pod["spec"]}}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": workload_name(job.metadata.name),
            "namespace": job.metadata.namespace or "default",
            "labels": {**names.job_labels(job.metadata.name), "kueue.x-k8s.io/job-uid": job.metadata.uid or ""},
            "ownerReferences": [owner],
        },
        "spec": {"queueName": queue_of(job), "podSets": [workers, store]},
    }


@dataclass(frozen=True)
class Admission:
    """What the queue decided in this pass (``policies/queueing.py``), handed by ``plan``
    to the policies that act on it: suspension and the creation of the pods. A job that
    is not queued (or runs without Kueue) gets ``UNQUEUED``."""

    hold: str | None = None
    """Kueue holds the job (not admitted, or evicted): it is suspended, for this reason."""
    admitted: bool = False
    """Kueue admitted the job: it runs, even while ``spec.suspend`` still says otherwise."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """The node labels of the flavors Kueue assigned, for the pods."""
    tolerations: tuple[dict[str, Any], ...] = ()
    """The tolerations of the flavors Kueue assigned, for the pods."""

    def suspends(self, job: LLMTrainJob) -> bool:
        """Whether the job is suspended in this pass: ``spec.suspend``, unless the queue decides."""
        if self.hold is not None:
            return True
        return job.spec.suspend and not self.admitted


UNQUEUED = Admission()


def place(pod: dict[str, Any], admission: Admission) -> dict[str, Any]:
    """The admission's flavors on a pod: their node labels join its nodeSelector, their
    tolerations its tolerations (as Kueue does for the jobs it admits)."""
    selector, tolerations = admission.node_selector, admission.tolerations
    if selector:
        pod["spec"]["nodeSelector"] = {**pod["spec"].get("nodeSelector", {}), **selector}
    if tolerations:
        have = pod["spec"].setdefault("tolerations", [])
        have += [dict(t) for t in tolerations if t not in have]
    return pod


def conditions_with(seen: WorkloadView, now: str, *changes: tuple[str, str, str, str]) -> list[dict[str, Any]]:
    """The Workload's conditions with (type, status, reason, message) set; a condition's
    time moves only when its status flips."""
    out = [dict(c) for c in seen.conditions]
    for type_, status, reason, message in changes:
        old = next((c for c in out if c.get("type") == type_), None)
        if old is None:
            out.append({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": now})
            continue
        if old.get("status") != status:
            old["lastTransitionTime"] = now
        old.update(status=status, reason=reason, message=message)
    return out


def finish(ctx: Pass, succeeded: bool, message: str) -> None:
    """A finished job's Workload gets ``Finished``: Kueue releases its quota."""
    seen = ctx.observed.workload
    if queue_of(ctx.job) is None or seen is None or not seen.exists or seen.finished:
        return
    reason = "Succeeded" if succeeded else "Failed"
    ctx.actions.append(PatchStatus(API_VERSION, KIND, workload_name(ctx.job.metadata.name), {
        "conditions": conditions_with(seen, format_time(ctx.now), ("Finished", "True", reason, message[:32768]))},
        seen.resource_version))
