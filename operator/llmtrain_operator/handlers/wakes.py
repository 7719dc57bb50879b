"""Which watch events wake which jobs' loops (docs/operator.md, "What wakes a job").

Every wake costs a pass: trainer probes, a plan, maybe a status write. At hundreds of
jobs, events that change nothing a pass reads would keep every loop busy, so:

- a job's own event wakes it unless only its status changed: the operator is the status's
  only writer, and each of its writes comes back as an event;
- a Node's event wakes only the jobs that own a pod on it or remember a failure of it,
  and only when what the planner reads of the node (``node_view``) changed; a kubelet's
  heartbeat changes none of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..api.observed import owned_by
from ..planner.accounting import node_of_key

Key = tuple[str, str]

_IGNORED_METADATA = ("resourceVersion", "managedFields")


def beyond_status(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """True when ``new`` differs from ``old`` in more than its status (spec, labels,
    annotations, deletion, generation...)."""
    def rest(body: dict[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in (body.get("metadata") or {}).items() if k not in _IGNORED_METADATA}
        return {**{k: v for k, v in body.items() if k not in ("status", "metadata")}, "metadata": meta}

    return rest(old) != rest(new)


def jobs_of_node(node: str, pods_by_job: Mapping[Key, Iterable[dict[str, Any]]],
                 bodies: Mapping[Key, dict[str, Any]]) -> set[Key]:
    """The jobs a change of ``node`` concerns: a pod they own (``owned_by``; the index is
    keyed by the job label, which only selects candidates) is bound to it, or their
    status keeps a charged failure of it (which a healed node clears)."""
    touched = set()
    for key, body in bodies.items():
        uid = (body.get("metadata") or {}).get("uid") or ""
        charged = (((body.get("status") or {}).get("internal") or {}).get("chargedFailures")) or ()
        if (any((p.get("spec") or {}).get("nodeName") == node and owned_by(p, uid) for p in pods_by_job.get(key, ()))
                or any(node_of_key(k) == node for k in charged)):
            touched.add(key)
    return touched
