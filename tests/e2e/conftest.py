"""End-to-end: the operator installed with helm on the local cluster (or kind), jobs
applied with kubectl, a real Prometheus scraping both."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from support.chart import install_operator

OPERATOR_NS = "llmtrain-system"


POD_LOG_LINES = 25
POD_LOGS_SHOWN = 10
AGENT_LOG_LINES = 30
STAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed end-to-end test's report ends with the last lines of the job pods it ran
    (the local cluster's container logs, newest first; on kind, ``kindreport``: the pods,
    the nodes' room, the Events and ``kubectl logs``), since a CI run's cluster is gone by
    the time anyone reads it."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and (item.get_closest_marker("e2e") or item.get_closest_marker("kind")):
        bed = item.funcargs.get("operator")
        if os.environ.get("LLMTRAIN_E2E_BED") == "kind" and bed is not None:
            from .kindreport import report as kind_report

            report.sections.append(("the kind bed (pods, nodes, events, logs)", kind_report(bed, call.start)))
        else:
            report.sections.append(("pod logs (newest first)", _pod_log_tails(call.start)))


def _pod_log_tails(since: float) -> str:
    from localcluster.cluster import LocalCluster

    written = {}
    for path in (LocalCluster.default().state / "pods").glob("*/*.log"):
        try:
            written[path] = path.stat().st_mtime
        except OSError:
            continue  # the bed removed the pod's folder meanwhile
    # The operator's own logs are kept whole (the operator fixture's teardown).
    logs = sorted((p for p, t in written.items() if p.stem != "operator" and t >= since), key=written.get, reverse=True)
    parts = []
    for path in logs[:POD_LOGS_SHOWN]:
        try:
            pod = json.loads(path.with_suffix(".json").read_text()).get("hostname", path.parent.name)
            lines = path.read_text(errors="replace").splitlines()[-POD_LOG_LINES:]
        except (OSError, ValueError):
            continue
        stamp = time.strftime("%H:%M:%S", time.gmtime(written[path]))
        parts.append(f"----- pod {pod}, container {path.stem} (last written {stamp} UTC) -----\n" + "\n".join(lines))
    agent = _agent_log_since(LocalCluster.default().state / "logs" / "node-agent.log", since)
    if agent:
        parts.append("----- the node agent (deletes, signals, warnings) -----\n" + "\n".join(agent[-AGENT_LOG_LINES:]))
    return "\n".join(parts) or "no pod wrote a log during the test"


def _agent_log_since(path, since: float) -> list[str]:
    """The node agent's lines stamped at or after ``since`` (its stamps are local time)."""
    floor = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    # Only stamped lines: a traceback's lines carry no time of their own.
    return [line for line in text.splitlines() if STAMPED.match(line) and line[:19] >= floor]


@pytest.fixture(scope="module")
def prometheus(operator, tmp_path_factory):
    """A real Prometheus scraping the cluster's annotated pods (one at a time: a fixed port)."""
    from .prometheus import Prometheus

    prom = Prometheus(operator, tmp_path_factory.mktemp("prometheus")).start()
    yield prom
    prom.stop()


def operator_values(bed) -> tuple[str, ...]:
    """The suite's ``--set`` values: two replicas on the system node, a fast resync, and
    this machine (where the suite's Prometheus runs, outside the cluster) among those that
    may read the jobs' and the operator's metrics through their NetworkPolicies."""
    return ("replicaCount=2", "operator.resyncSeconds=5", "nodeSelector.llmtrain\\.io/pool=system",
            f"networkPolicy.metricsFrom={{{bed.host_address}/32}}")


@pytest.fixture(scope="session")
def operator(local_cluster):
    """helm install of charts/llmtrain-operator with 2 replicas (kopf peering)."""
    bed = local_cluster
    install_operator(bed, OPERATOR_NS, *operator_values(bed))
    bed.kubectl("rollout", "status", "deployment/llmtrain", "-n", OPERATOR_NS, "--timeout=120s")
    yield bed
    pods = json.loads(bed.kubectl("get", "pods", "-n", OPERATOR_NS, "-o", "json").stdout)["items"]
    for pod in pods:  # keep the operator's logs for a failed run's post-mortem
        (bed.state / f"operator-{pod['metadata']['name']}.log").write_text(bed.pod_log(OPERATOR_NS, pod["metadata"]["name"]))


@pytest.fixture(scope="session")
def real_nodes(request):
    """The operator's bed (``operator``) where its nodes are real: a kubelet and a
    container runtime on each (kind, ``hack/kind/e2e.sh``). A test of what only they do
    (marked ``kind``) fails on the process bed, naming how to run it, before any bed starts."""
    if os.environ.get("LLMTRAIN_E2E_BED") != "kind":
        pytest.fail("needs real nodes (a kubelet and a container runtime): run it on the kind bed, "
                    "bash hack/kind/e2e.sh <its module>")
    return request.getfixturevalue("operator")
