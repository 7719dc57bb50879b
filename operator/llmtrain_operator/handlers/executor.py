"""The executor: how each planner action is written to the API server, in which round,
and how it reads in the log (docs/operator.md, "One pass", step 3).

``APPLIERS`` is the one map from action type to applier, as JobSet's
``actionFunctionMap``: an action type missing from it is an error that names the type,
raised before any request of the pass goes out, never a default that writes (or
deletes) something. tests/operator/handlers/test_executor.py checks that the map covers every member
of the planner's ``Action`` union.

A pass's writes go in two rounds. The first is every create (and the other writes that
need no order: a replaced ConfigMap, a PodGroup's spec, a Workload's status) together
with the job's status patch, concurrently: a pod created a moment before its ConfigMap
is retried by the kubelet until the volume mounts (as with Kubeflow's and JobSet's
children), and one round matters because a pass's latency is the API server's latency
times its rounds, which under a burst of new jobs dominates (docs/benchmarks.md). The
second, only once the status write succeeded, is every delete and the job's own
``spec.suspend``: deleting a failed pod destroys the evidence of the failure, so the
decision (restart counted, failure recorded) is written first. If the status write
fails, nothing is deleted and the next pass decides again; if a delete fails, the next
pass finds the failure already counted and only deletes.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..k8s.client import K8s, PermanentApiError, TransientApiError
from ..planner import (Action, CreateObject, DeleteJob, DeleteObject, DeletePod, KeepPod, PatchStatus, ReplaceObject, SetSuspend,
                       UpdateSpec)
from ..planner.manifests import kept_pod_patch

A = TypeVar("A")


class Round(enum.Enum):
    """When an action goes out in a pass."""

    WITH_STATUS = "with the status"
    """In one concurrent round with the status patch (creates, and writes that need no order)."""
    AFTER_STATUS = "after the status"
    """Only once the status write succeeded (deletes, and the job's ``spec.suspend``: written
    together with the status, one of the two writes would find the job at a newer version
    than the pass planned from)."""


@dataclass(frozen=True)
class Applier(Generic[A]):
    apply: Callable[[K8s, str, str, A], Any]
    """(client, the job's namespace, the job's name, the action) -> the client's answer;
    a blocking call, run in a thread."""
    describe: Callable[[A], str]
    """The action in the operator's log and in a refusal's message."""
    round: Round


def _kind_name(manifest: dict[str, Any]) -> str:
    return f"{manifest['kind']} {manifest['metadata']['name']}"


def _create(k8s: K8s, namespace: str, action: CreateObject) -> bool:
    """Create the object; False if this job's own already exists. An object of that name
    that the job does not own (one made by hand, a copy ``kubectl debug --copy-to``
    labelled alike, one planted to take over the job's rendezvous) is never adopted: the
    create is refused, naming it, and retried with the refusals' backoff."""
    if k8s.create(action.manifest):
        return True
    ours = {str(ref.get("uid")) for ref in action.manifest["metadata"].get("ownerReferences") or []}
    theirs = k8s.owner_uids(action.kind, namespace, action.name)
    if ours and theirs is not None and not ours & set(theirs):
        owners = ", ".join(theirs) if theirs else "none"
        raise PermanentApiError(f"create {action.kind} {namespace}/{action.name}: it exists and is not this job's", 409,
                                server_message=f"{action.kind} {action.name} exists and is not this job's (its owners' uids: "
                                               f"{owners}); it is left alone: delete or rename it")
    return False


APPLIERS: Mapping[type, Applier[Any]] = {
    CreateObject: Applier[CreateObject](
        lambda k8s, ns, job, a: _create(k8s, ns, a),
        lambda a: f"create {a.kind} {a.name}", Round.WITH_STATUS),
    ReplaceObject: Applier[ReplaceObject](
        lambda k8s, ns, job, a: k8s.replace(a.manifest),
        lambda a: f"replace {_kind_name(a.manifest)}", Round.WITH_STATUS),
    UpdateSpec: Applier[UpdateSpec](
        lambda k8s, ns, job, a: k8s.update_spec(a.manifest),
        lambda a: f"update {_kind_name(a.manifest)}", Round.WITH_STATUS),
    PatchStatus: Applier[PatchStatus](
        lambda k8s, ns, job, a: k8s.patch_object_status(a.api_version, a.kind, ns, a.name, a.status, a.resource_version),
        lambda a: f"patch the status of {a.kind} {a.name}", Round.WITH_STATUS),
    SetSuspend: Applier[SetSuspend](
        lambda k8s, ns, job, a: k8s.set_suspend(ns, job, a.suspend),
        lambda a: f"set spec.suspend={str(a.suspend).lower()}", Round.AFTER_STATUS),
    DeletePod: Applier[DeletePod](
        lambda k8s, ns, job, a: k8s.delete_pod(ns, a.name, a.grace_seconds, a.force),
        lambda a: f"{'force-delete' if a.force else 'delete'} Pod {a.name}", Round.AFTER_STATUS),
    KeepPod: Applier[KeepPod](
        lambda k8s, ns, job, a: k8s.patch_pod_metadata(ns, a.name, kept_pod_patch(a.uid)),
        lambda a: f"keep Pod {a.name} for its log", Round.AFTER_STATUS),
    DeleteObject: Applier[DeleteObject](
        lambda k8s, ns, job, a: k8s.delete_object(a.api_version, a.kind, ns, a.name, a.uid),
        lambda a: f"delete {a.kind} {a.name}", Round.AFTER_STATUS),
    DeleteJob: Applier[DeleteJob](
        lambda k8s, ns, job, a: k8s.delete_job(ns, job),
        lambda a: f"delete the job ({a.reason})", Round.AFTER_STATUS),
}


class UnknownAction(TypeError):
    """The planner produced an action the executor has no applier for: a bug in the
    operator. ``write`` raises it before any request of the pass, so nothing of the pass
    is written; the job's loop logs it and tries again."""

    def __init__(self, action: object):
        self.action_type = type(action)
        super().__init__(f"no applier for the planner action {self.action_type.__module__}.{self.action_type.__qualname__} "
                         "(handlers/executor.py APPLIERS)")


def applier(action: object) -> Applier[Any]:
    try:
        return APPLIERS[type(action)]
    except KeyError:
        raise UnknownAction(action) from None


def describe(action: Action) -> str:
    return applier(action).describe(action)


@dataclass(frozen=True)
class Refused:
    """A write of the first round that the API server refused (a quota, an admission
    webhook, Pod Security, RBAC), with its words."""

    action: Action
    message: str

    def __str__(self) -> str:
        return f"{describe(self.action)}: {self.message}"


@dataclass(frozen=True)
class Written:
    """What a pass's writes came to."""

    action_error: BaseException | None
    """The first failed action's error, a permanent one first (refusals apart)."""
    status_error: BaseException | None
    """The status patch's error."""
    refused: tuple[Refused, ...] = ()
    """The first round's writes the API server refused: reported and retried, not raised,
    so that the job's other work in this pass stands."""
    created: tuple[CreateObject, ...] = ()
    """The creates that made a new object (not one that existed already, not a refused one)."""
    attempted: bool = False
    """Whether any write of the first round went out (a pass whose creates the refusal
    backoff held back has none)."""


class WriteGate(Protocol):
    def holds(self) -> bool: ...


class NotLeader(Exception):
    """This replica does not hold the leader Lease (any more): nothing is written."""


def check(gate: WriteGate | None) -> None:
    if gate is not None and not gate.holds():
        raise NotLeader()


def _creates(action: Action, kind: str) -> bool:
    return isinstance(action, CreateObject) and action.kind == kind


def _send(k8s: K8s, namespace: str, job: str, action: Action, how: Applier[Any]) -> Any:
    return asyncio.to_thread(how.apply, k8s, namespace, job, action)


async def write(k8s: K8s, body: dict[str, Any], actions: list[Action], status_patch: dict[str, Any] | None,
                gate: WriteGate | None = None) -> Written:
    """A pass's writes: the job's token Secret first, when the pass creates one (its pods
    read it as they start), then the first round (the status patch and every other create)
    concurrently, then, once the status is written, the second (the deletes). A token
    Secret that could not be created holds back the pass's pod creates (they would wait
    for it in ``CreateContainerConfigError``). Every action's applier is looked up before
    any request: an action without one raises ``UnknownAction`` and nothing at all is
    written."""
    meta = body["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    planned = [(action, applier(action)) for action in actions]
    tokens = [(a, how) for a, how in planned if _creates(a, "Secret")]
    first = [(a, how) for a, how in planned if how.round is Round.WITH_STATUS and not _creates(a, "Secret")]
    later = [(a, how) for a, how in planned if how.round is Round.AFTER_STATUS]
    before: list[Any] = []
    if tokens:
        check(gate)
        before = list(await asyncio.gather(*(_send(k8s, ns, name, a, how) for a, how in tokens), return_exceptions=True))
        if any(isinstance(o, BaseException) for o in before):
            first = [(a, how) for a, how in first if not _creates(a, "Pod")]
    requests = [_send(k8s, ns, name, a, how) for a, how in first]
    if status_patch is not None:
        requests.append(asyncio.to_thread(k8s.patch_status, ns, name, status_patch, meta.get("resourceVersion")))
    check(gate)
    outcomes = before + list(await asyncio.gather(*requests, return_exceptions=True))
    status_error = outcomes.pop() if status_patch is not None else None
    first = tokens + first
    sent = [a for a, _ in first]
    refused = tuple(Refused(a, o.server_message) for a, o in zip(sent, outcomes) if isinstance(o, PermanentApiError))
    created = tuple(a for a, o in zip(sent, outcomes) if isinstance(a, CreateObject) and o is True)
    errors = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, PermanentApiError)]
    if not isinstance(status_error, BaseException):
        status_error = None
        if later:
            check(gate)
        errors += [o for o in await asyncio.gather(*(_send(k8s, ns, name, a, how) for a, how in later), return_exceptions=True)
                   if isinstance(o, BaseException)]
    action_error = next((e for e in errors if not isinstance(e, TransientApiError)), errors[0] if errors else None)
    return Written(action_error, status_error, refused, created, attempted=bool(first))
