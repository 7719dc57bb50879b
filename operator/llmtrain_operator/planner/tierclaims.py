"""Two live jobs on one checkpoint tier: the younger is refused.

A job's shared tier (a PVC's ``subPath``) and S3 tier (bucket and ``prefix``) default to
a path named after the job, but either can be given explicitly, and two jobs given the
same one would overwrite each other's steps of one number and each read the other's as
a resume point. The trainer scopes its own clean-up to its lineage
(``llmtrain_store.owner``); what it cannot see is whether another job is writing the
same place right now. The operator can: every job it watches is compared, and of two
live jobs that claim one location the younger (by creation, then namespace and name) is
``Invalid`` (reason ``TierConflict``) naming the other, until the other is gone or one
of them moves.

Read from raw bodies, as the watch holds them: a body that is not a valid job claims
nothing (it never runs). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..api.vocabulary import TERMINAL_PHASES
from . import names


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _path(value: str) -> str:
    """A subPath or prefix as the filesystem or S3 sees it: no leading, trailing or
    doubled slashes, no ``.`` segments."""
    return "/".join(p for p in value.split("/") if p not in ("", "."))


def locations(body: dict[str, Any]) -> dict[str, str]:
    """The places a job's checkpoints go that another job could share: a comparable key
    -> how it is said to a user. The node-local tier is left out (a hostPath is per node
    and per job: ``<hostPath>/<namespace>/<job>``)."""
    meta, ckpt = _dict(body.get("metadata")), _dict(_dict(body.get("spec")).get("checkpoint"))
    ns, name = _text(meta.get("namespace")) or "default", _text(meta.get("name"))
    if name is None or ckpt.get("enabled") is False:
        return {}
    out: dict[str, str] = {}
    shared = _dict(ckpt.get("shared"))
    if claim := _text(shared.get("claimName")):
        sub = _path(_text(shared.get("subPath")) or names.shared_sub_path(name, ns))
        out[f"pvc\0{ns}\0{claim}\0{sub}"] = f"PersistentVolumeClaim {ns}/{claim} subPath {sub or '/'}"
    s3 = _dict(ckpt.get("s3"))
    if bucket := _text(s3.get("bucket")):
        prefix = _path(_text(s3.get("prefix")) or names.s3_prefix(name, ns))
        endpoint = (_text(s3.get("endpoint")) or "").rstrip("/")
        where = f"s3://{bucket}/{prefix}" + (f" at {endpoint}" if endpoint else "")
        out[f"s3\0{endpoint}\0{bucket}\0{prefix}"] = where
    return out


def _order(body: dict[str, Any]) -> tuple[str, str, str]:
    meta = _dict(body.get("metadata"))
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("namespace") or "default"), str(meta.get("name") or ""))


def _live(body: dict[str, Any]) -> bool:
    return _dict(body.get("status")).get("phase") not in TERMINAL_PHASES  # a finished job writes no more checkpoints


def conflicts(body: dict[str, Any], others: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """Why ``body`` may not run beside ``others`` (every job the operator sees; ``body``
    itself among them is skipped): each location it shares with an older live job,
    naming that job. Empty when none."""
    mine = locations(body)
    if not mine:
        return ()
    me = _order(body)
    uid = _dict(body.get("metadata")).get("uid")
    found: list[str] = []
    for other in others:
        if other is body or (uid and _dict(other.get("metadata")).get("uid") == uid) or _order(other) >= me or not _live(other):
            continue
        shared = sorted(set(mine) & set(locations(other)))
        found += [f"checkpoint tier {mine[key]} is also used by job {_order(other)[1]}/{_order(other)[2]}, which is "
                  "older and still live" for key in shared]
    return tuple(sorted(found))
