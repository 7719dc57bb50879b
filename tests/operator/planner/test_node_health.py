"""A node a health agent reports sick is drained of the job's pods before a rank fails
there (``policies/node_health.py``): a graceful delete (SIGTERM: the emergency
checkpoint), the node quarantined, a disruption, not a restart."""

from __future__ import annotations

from datetime import timedelta

from llmtrain_operator.api.observed import NodeView, node_view, slim_node
from llmtrain_operator.planner import plan
from support.planning import NOW, job, observed, running_status, summary, worker

W0 = "tiny-elastic-worker-0"


def nodes(sick: NodeView) -> list[NodeView]:
    return [sick] + [NodeView(f"node-{i}", "True", NOW - timedelta(hours=1)) for i in (1, 2, 3)]


def run(sick: NodeView, raw=None, now=NOW, **kwargs):
    raw = raw or job(status=running_status())
    return plan(raw, observed(raw, [worker(0), worker(1)], nodes=nodes(sick)), now, **kwargs)


def test_a_configured_condition_drains_the_pod_gracefully_and_quarantines_the_node():
    sick = NodeView("node-0", "True", NOW - timedelta(hours=1), problems=("KernelDeadlock",))
    result = run(sick)
    status = result.status
    assert summary(result.actions) == [f"delete {W0}"]  # graceful: not a force-delete
    assert status["disruptions"] == 1 and status.get("restarts", 0) == 0
    assert [q["node"] for q in status["quarantinedNodes"]] == ["node-0"]
    assert status["lastFailure"]["reason"] == "NodeUnhealthy" and "reports KernelDeadlock" in status["lastFailure"]["message"]
    assert "NodeUnhealthy" in [e.reason for e in result.events]
    again = plan({**job(), "status": status}, observed(job(), [worker(0, ready=True), worker(1)], nodes=nodes(sick)),
                 NOW + timedelta(seconds=1))
    assert "NodeUnhealthy" not in [e.reason for e in again.events] and again.status["disruptions"] == 1  # once per pod


GPU_JOB = {"spec.resources": {"limits": {"nvidia.com/gpu": 1}}}


def test_a_gpu_taken_out_of_allocatable_drains_a_gpu_job():
    sick = NodeView("node-0", "True", NOW - timedelta(hours=1), gpu_capacity=8, gpu_allocatable=7)
    result = run(sick, raw=job(GPU_JOB, status=running_status()))
    assert "7 of its 8 nvidia.com/gpu allocatable" in result.status["lastFailure"]["message"]


def test_no_gpu_allocatable_at_all_or_a_cpu_job_is_not_a_gpu_fault():
    restarting = NodeView("node-0", "True", NOW - timedelta(hours=1), gpu_capacity=8, gpu_allocatable=0)
    assert summary(run(restarting, raw=job(GPU_JOB, status=running_status())).actions) == []  # the plugin restarting
    sick = NodeView("node-0", "True", NOW - timedelta(hours=1), gpu_capacity=8, gpu_allocatable=7)
    assert summary(run(sick).actions) == []  # a CPU job does not care


def test_conditions_not_configured_and_healthy_nodes_are_left_alone():
    other = NodeView("node-0", "True", NOW - timedelta(hours=1), problems=("FrequentKubeletRestart",), gpu_capacity=8, gpu_allocatable=8)
    result = run(other)
    assert summary(result.actions) == [] and result.status.get("disruptions", 0) == 0
    configured = run(other, node_failure_conditions=frozenset({"FrequentKubeletRestart"}))
    assert summary(configured.actions) == [f"delete {W0}"]


def test_the_node_view_reads_true_conditions_and_gpu_counts_and_refuses_bad_values():
    node = {"metadata": {"name": "n"}, "status": {
        "conditions": [{"type": "Ready", "status": "True"}, {"type": "KernelDeadlock", "status": "True"},
                       {"type": "MemoryPressure", "status": "False"}, {"type": "bad type!", "status": "True"}, "junk"],
        "capacity": {"nvidia.com/gpu": "8", "cpu": "96"}, "allocatable": {"nvidia.com/gpu": "7"}}}
    view = node_view(slim_node(node))
    assert view.problems == ("KernelDeadlock",) and (view.gpu_capacity, view.gpu_allocatable) == (8, 7)
    node["status"]["allocatable"] = {"nvidia.com/gpu": "-1"}
    assert node_view(node).gpu_allocatable is None
