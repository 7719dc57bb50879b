"""The kind bed's failure report (tests/e2e/kindreport.py): the pure parts that say why a
pod was left pending, read from API objects shaped as a real API server serves them."""

from __future__ import annotations

from datetime import datetime, UTC

from e2e.kindreport import events_since, node_room, pods_table


def _pod(name: str, node: str | None, phase: str, cpu: str = "1", ns: str = "e2e", **extra) -> dict:
    pod = {"metadata": {"name": name, "namespace": ns, **extra.get("meta", {})},
           "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu}}}]},
           "status": {"phase": phase, "conditions": extra.get("conditions", [])}}
    return pod


def _node(name: str, cpu: str = "2", gpus: str = "2", ready: str = "True", **spec) -> dict:
    return {"metadata": {"name": name}, "spec": spec,
            "status": {"allocatable": {"cpu": cpu, "nvidia.com/gpu": gpus}, "conditions": [{"type": "Ready", "status": ready}]}}


def test_a_pending_pod_shows_the_schedulers_words_and_system_pods_are_left_out():
    pending = _pod("job-worker-1", None, "Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "message": "0/5 nodes are available: 3 Insufficient cpu."}])
    lines = pods_table([pending, _pod("kube-proxy-x", "n1", "Running", ns="kube-system"),
                        _pod("job-worker-0", "n2", "Running", meta={"deletionTimestamp": "2026-12-06T17:00:00Z"})])
    assert lines == ["e2e/job-worker-1 node=- phase=Pending unschedulable: 0/5 nodes are available: 3 Insufficient cpu.",
                     "e2e/job-worker-0 node=n2 phase=Running deleting"]


def test_node_room_counts_the_requests_of_pods_still_running_only():
    pods = [_pod("a", "n1", "Running", "1"), _pod("b", "n1", "Running", "250m"), _pod("done", "n1", "Succeeded", "1"),
            _pod("c", "n2", "Pending", "0.5")]
    lines = node_room([_node("n1"), _node("n2", ready="False", unschedulable=True,
                                          taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])], pods)
    assert lines[0] == "n1 ready=True cpu requested 1250m of 2000m gpus=2"
    assert lines[1] == "n2 ready=False cpu requested 500m of 2000m gpus=2 cordoned taints=node.kubernetes.io/unreachable:NoExecute"


def test_node_room_counts_a_larger_init_container_as_the_scheduler_does():
    pod = _pod("init", "n1", "Pending", "250m")
    pod["spec"]["initContainers"] = [{"resources": {"requests": {"cpu": "1500m"}}}]
    assert node_room([_node("n1")], [pod, _pod("plain", "n1", "Running", "300m")]) == [
        "n1 ready=True cpu requested 1800m of 2000m gpus=2"]


def test_events_are_those_since_the_test_began_oldest_first():
    since = datetime(2026, 12, 6, 17, 0, tzinfo=UTC).timestamp()

    def ev(stamp: str, reason: str, ns: str = "e2e") -> dict:
        return {"metadata": {"namespace": ns}, "lastTimestamp": stamp, "reason": reason, "message": "a\n  b",
                "involvedObject": {"kind": "Pod", "name": "p"}}

    rows = events_since([ev("2026-12-06T17:00:05Z", "Second"), ev("2026-12-06T16:59:59Z", "Before"),
                         ev("2026-12-06T17:00:01Z", "First"), ev("2026-12-06T17:00:02Z", "System", ns="kube-system"),
                         {"metadata": {"namespace": "e2e"}, "reason": "Unstamped"}], since)
    assert rows == ["17:00:01 e2e/Pod/p First: a b", "17:00:05 e2e/Pod/p Second: a b"]
