"""Failures: their keys (so each is charged once) and the record of the latest one.

A failure is charged exactly once, by construction: each has a key, recorded in the same
status write that charges it and checked before any charge. A pass that planned from an
older status cannot write (status writes are conditional on its resourceVersion).
"""

from __future__ import annotations

from datetime import datetime

from ..api.observed import PodView, format_time
from ..api.status import FailureRecord
from ..api.vocabulary import FailureKind
from .context import DeletePod, Pass
from .decisions import FailureRecorded

MAX_CHARGED = 200
"""Failure keys kept in status (oldest dropped first). Only a key whose pod still exists
matters: a failed pod is deleted or kept right after its failure is charged, and a kept
pod is then known by its name in ``status.keptPods`` (at most 50) as well."""


def pod_key(pod: PodView) -> str:
    """The identity of a pod's failure: its uid (a replacement that took a deleted pod's
    name is another pod, so another failure)."""
    return f"pod:{pod.uid}" if pod.uid else f"pod:{pod.name}@{pod.created.isoformat() if pod.created else ''}"


NODE_KEY_PREFIX = "node:"


def node_key(ctx: Pass, name: str) -> str:
    """The identity of a node failure: the node and when its Ready condition last changed
    (a node that heals and fails again fails anew). A node whose object is gone has no
    transition time; that key lasts until the node is seen Ready again."""
    view = ctx.observed.nodes.get(name)
    return f"{NODE_KEY_PREFIX}{name}@{format_time(view.since)}" if view is not None and view.since else f"{NODE_KEY_PREFIX}{name}@gone"


def node_of_key(key: object) -> str | None:
    """The node a charged failure key names (``node_key``); None for a pod's key or for
    anything else a hand-edited status may hold."""
    if not isinstance(key, str) or not key.startswith(NODE_KEY_PREFIX):
        return None
    return key[len(NODE_KEY_PREFIX):].rsplit("@", 1)[0]


def charged(ctx: Pass, key: str) -> bool:
    return key in ctx.status.internal.charged_failures


MAX_FAILURE_MESSAGE = 2000
"""Characters of ``lastFailure.message`` kept (it quotes what a pod said)."""
MAX_SEEN = 200
"""Keys kept by ``first_sighting``'s lists (oldest dropped first)."""


def first_sighting(seen: list[str], key: str) -> bool:
    """Whether ``key`` is new to ``seen`` (a status list of things already announced); a
    new one is added, the list kept to ``MAX_SEEN``."""
    if key in seen:
        return False
    seen.append(key)
    del seen[:-MAX_SEEN]
    return True


def remember(ctx: Pass, *keys: str) -> None:
    """Record failure keys in the status being built (written with the charge itself)."""
    book = ctx.status.internal
    new = [k for k in dict.fromkeys(keys) if k not in book.charged_failures]
    if new:
        book.charged_failures = (book.charged_failures + new)[-MAX_CHARGED:]


def forget_healed_nodes(ctx: Pass) -> None:
    """A node seen Ready again starts a new history: its next failure is a new one."""
    book = ctx.status.internal
    healthy = {n.name for n in ctx.observed.nodes.values() if not n.failed}
    kept = [k for k in book.charged_failures if node_of_key(k) not in healthy]
    if len(kept) != len(book.charged_failures):
        book.charged_failures = kept


def record_failure(ctx: Pass, kind: FailureKind, reason: str, pod: PodView | None = None, node: str | None = None,
                   exit_code: int | None = None, message: str | None = None, since: datetime | None = None) -> None:
    """Make this the job's ``lastFailure``. ``since``: when the failure happened
    (default: the pod's exit), for time-to-detect."""
    happened = since or (pod.finished if pod else None)
    ctx.status.last_recovery_seconds = None  # until the first step after this failure
    record = FailureRecord(
        kind=kind, reason=reason, pod=pod.name if pod else None, node=node or (pod.node if pod else None),
        exit_code=exit_code, message=(message or "")[:MAX_FAILURE_MESSAGE] or None, time=ctx.stamp,
        detect_seconds=round((ctx.now - happened).total_seconds(), 3) if happened else None,
    )
    ctx.status.last_failure = record
    ctx.decide(FailureRecorded(record.kind, record.reason, record.pod, record.node, record.exit_code, record.detect_seconds))


def unhandled_kept(ctx: Pass) -> list[PodView]:
    """Pods labelled kept whose failure this operator never handled (someone else set the
    label before the charge): neither charged nor listed in the status's ``keptPods``
    (which only ever lists handled ones, ``policies/kept.py``). Judged as failures all the
    same, so that a label cannot make a failure go uncounted."""
    listed = set(ctx.status.kept_pods)
    # Kept pods this pass already deletes (beyond the limit) leave the list, but not unhandled.
    deleting = {a.name for a in ctx.actions if isinstance(a, DeletePod)}
    return [p for p in ctx.observed.kept_workers()
            if p.name not in listed and p.name not in deleting and not p.deleting and not charged(ctx, pod_key(p))]
