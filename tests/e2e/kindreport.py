"""What a failed end-to-end test's report shows on the kind bed, read through the API
server while the cluster still runs (a CI run's cluster is gone by the time anyone reads
the report): every pod outside the system namespaces with its node and phase, why the
scheduler left any pending, each node's requests against what it can allocate, the Events since the test
began, and the last log lines of the pods that ran. The process bed's report reads its
pods' log files instead (``conftest._pod_log_tails``); on kind there are none, and the
first whole-suite run that failed on kind showed only "no pod wrote a log"."""

from __future__ import annotations

import json
import re
from datetime import datetime, UTC
from typing import Any

SYSTEM_NAMESPACES = frozenset({"kube-system", "local-path-storage", "kube-node-lease", "kube-public"})
LOG_LINES = 25
PODS_LOGGED = 10
EVENTS_SHOWN = 40


def _cpu_millis(value: str) -> int:
    """A CPU quantity in millicores ("1", "250m", "0.5")."""
    if value.endswith("m"):
        return int(value[:-1] or 0)
    try:
        return int(float(value) * 1000)
    except ValueError:
        return 0


def _pod_cpu(spec: dict[str, Any]) -> int:
    """A pod's CPU request as the scheduler counts it: its containers' sum, or its largest
    init container's when that is more (init containers run one at a time, first)."""
    def cpu(c: dict[str, Any]) -> int:
        return _cpu_millis(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))

    return max(sum(cpu(c) for c in spec.get("containers") or []), max((cpu(c) for c in spec.get("initContainers") or []), default=0))


def _stamp(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def pods_table(pods: list[dict[str, Any]]) -> list[str]:
    """One line per pod outside the system namespaces: where, what phase, and the
    scheduler's words for a pod it could not place."""
    lines = []
    for pod in pods:
        meta, spec, st = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        if meta.get("namespace") in SYSTEM_NAMESPACES:
            continue
        why = next((c.get("message", "") for c in st.get("conditions") or []
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")
        gone = " deleting" if meta.get("deletionTimestamp") else ""
        lines.append(f"{meta.get('namespace')}/{meta.get('name')} node={spec.get('nodeName') or '-'} "
                     f"phase={st.get('phase')}{gone}" + (f" unschedulable: {why}" if why else ""))
    return lines


def node_room(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[str]:
    """Each node's CPU requests (of pods not finished) against its allocatable CPU, its
    GPUs, readiness, taints and whether it is cordoned: why a pod fits nowhere."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        used[node] = used.get(node, 0) + _pod_cpu(pod["spec"])
    lines = []
    for node in nodes:
        name, st = node["metadata"]["name"], node.get("status") or {}
        alloc = st.get("allocatable") or {}
        ready = next((c.get("status") for c in st.get("conditions") or [] if c.get("type") == "Ready"), "?")
        taints = ",".join(f"{t.get('key')}:{t.get('effect')}" for t in (node.get("spec") or {}).get("taints") or [])
        lines.append(f"{name} ready={ready} cpu requested {used.get(name, 0)}m of {_cpu_millis(alloc.get('cpu', '0'))}m "
                     f"gpus={alloc.get('nvidia.com/gpu', '0')}" + (" cordoned" if node["spec"].get("unschedulable") else "")
                     + (f" taints={taints}" if taints else ""))
    return lines


def events_since(events: list[dict[str, Any]], since: float) -> list[str]:
    """Events outside the system namespaces at or after ``since`` (epoch seconds), oldest first."""
    floor = datetime.fromtimestamp(since, tz=UTC)
    rows = []
    for ev in events:
        when = _stamp(ev.get("lastTimestamp") or ev.get("eventTime") or (ev.get("metadata") or {}).get("creationTimestamp"))
        ns = (ev.get("metadata") or {}).get("namespace")
        if when is None or when < floor or ns in SYSTEM_NAMESPACES:
            continue
        obj = ev.get("involvedObject") or {}
        message = re.sub(r"\s+", " ", ev.get("message") or "")[:300]
        rows.append((when, f"{when:%H:%M:%S} {ns}/{obj.get('kind')}/{obj.get('name')} {ev.get('reason')}: {message}"))
    return [line for _, line in sorted(rows)][-EVENTS_SHOWN:]


def report(bed: Any, since: float) -> str:
    """The sections above, each read on its own: one that fails says why, not the rest."""
    parts: list[str] = []
    pods: list[dict[str, Any]] = []
    try:
        pods = json.loads(bed.kubectl("get", "pods", "-A", "-o", "json", timeout=30).stdout)["items"]
        parts.append("----- pods -----\n" + "\n".join(pods_table(pods)))
    except Exception as err:  # noqa: BLE001 - a report must not hide the test's own failure
        parts.append(f"----- pods: not read ({err}) -----")
    try:
        nodes = json.loads(bed.kubectl("get", "nodes", "-o", "json", timeout=30).stdout)["items"]
        parts.append("----- nodes -----\n" + "\n".join(node_room(nodes, pods)))
    except Exception as err:  # noqa: BLE001
        parts.append(f"----- nodes: not read ({err}) -----")
    try:
        events = json.loads(bed.kubectl("get", "events", "-A", "-o", "json", timeout=30).stdout)["items"]
        parts.append("----- events since the test began -----\n" + "\n".join(events_since(events, since)))
    except Exception as err:  # noqa: BLE001
        parts.append(f"----- events: not read ({err}) -----")
    recent = [p for p in pods if p["metadata"].get("namespace") not in SYSTEM_NAMESPACES
              and (when := _stamp((p.get("status") or {}).get("startTime"))) and when.timestamp() >= since - 600]
    for pod in sorted(recent, key=lambda p: p["status"].get("startTime", ""), reverse=True)[:PODS_LOGGED]:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            out = bed.kubectl("logs", name, "-n", ns, "--all-containers", f"--tail={LOG_LINES}", check=False, timeout=30)
            parts.append(f"----- pod {ns}/{name} (last {LOG_LINES} lines of each container) -----\n"
                         + (out.stdout or out.stderr).rstrip())
        except Exception as err:  # noqa: BLE001
            parts.append(f"----- pod {ns}/{name}: log not read ({err}) -----")
    return "\n".join(parts)
