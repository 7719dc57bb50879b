"""Which watch events wake which jobs' loops (docs/operator.md, "What wakes a job").

Every wake costs a pass: trainer probes, a plan, maybe a status write. At hundreds of
jobs, events that change nothing a pass reads would keep every loop busy, so:

- a job's own event wakes it unless only its status changed: the operator is the status's
  only writer, and each of its writes comes back as an event;
- a Node's event wakes only the jobs that have a pod on it or remember a failure of it,
  and only when what the planner reads of the node (``node_view``) changed; a kubelet's
  heartbeat changes none of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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
    """The jobs a change of ``node`` concerns: a pod of theirs is bound to it, or their
    status keeps a charged failure of it (which a healed node clears)."""
    touched = {key for key, pods in pods_by_job.items() if any((p.get("spec") or {}).get("nodeName") == node for p in pods)}
    mark = f"node:{node}@"
    for key, body in bodies.items():
        charged = (((body.get("status") or {}).get("internal") or {}).get("chargedFailures")) or ()
        if any(isinstance(k, str) and k.startswith(mark) for k in charged):
            touched.add(key)
    return touched
