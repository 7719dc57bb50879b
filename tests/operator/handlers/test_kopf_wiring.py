"""The real kopf operator (handlers, indexes, per-job loops) against kmock: watch events
wake the job's loop, which creates its children and reacts to a failed pod; kopf itself
writes nothing (no finalizer, no annotations)."""

from __future__ import annotations

import asyncio
import copy

import kopf
import pytest
import yaml
from support.planning import job

from .conftest import JOBS

NS, NAME = "ml", "tiny-elastic"


@pytest.fixture
def operator_env(api, tmp_path, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(api.url)}}],
        "users": [{"name": "kmock", "user": {}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("LLMTRAIN_OPERATOR_LEADER_ELECTION", "false")
    monkeypatch.setenv("LLMTRAIN_OPERATOR_PROBES", "false")
    monkeypatch.setenv("LLMTRAIN_OPERATOR_METRICS_PORT", "0")


async def wait_for(predicate, timeout=20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


def posts(api, suffix):
    return [r for r in api if str(r.method).endswith("POST") and r.url.path.endswith(suffix)]


async def test_the_operator_creates_children_and_replaces_a_failed_pod_keeping_it(api, operator_env):
    import llmtrain_operator.handlers  # noqa: F401 - registers the handlers

    # Cluster-wide: kmock cannot serve the namespace listing that namespaced mode reads.

    raw = job()
    api.objects[JOBS, NS, NAME] = raw
    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(standalone=True, clusterwide=True, stop_flag=stop))
    try:
        # The pods and the status patch go out in one concurrent round: wait for both.
        await wait_for(lambda: len(posts(api, "/pods")) >= 3
                       and (api.objects[JOBS, NS, NAME].raw.get("status") or {}).get("phase") == "Created")

        pod = copy.deepcopy(api.objects["v1/pods", NS, "tiny-elastic-worker-0"].raw)
        pod["status"] = {"phase": "Failed", "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
        async with api.patch(f"/api/v1/namespaces/{NS}/pods/tiny-elastic-worker-0", json=pod) as response:
            assert response.status == 200

        await wait_for(lambda: (api.objects[JOBS, NS, NAME].raw.get("status") or {}).get("restarts") == 1)
        status = api.objects[JOBS, NS, NAME].raw["status"]
        assert status["lastFailure"]["reason"] == "OOMKilled"
        # Kept for its log (labelled, not deleted), and its slot gets the next pod.
        await wait_for(lambda: (api.objects["v1/pods", NS, "tiny-elastic-worker-0"].raw["metadata"].get("labels") or {})
                       .get("llmtrain.io/kept") == "true")
        await wait_for(lambda: "tiny-elastic-worker-0-1" in {(r.data or {}).get("metadata", {}).get("name") for r in posts(api, "/pods")})
        assert not any(str(r.method).endswith("DELETE") and "/pods/" in r.url.path for r in api)
        # Only the job's status is written: no finalizer, no kopf annotations (a second
        # replica would write those too, outside the leader Lease).
        job_path = f"/apis/llmtrain.io/v1alpha1/namespaces/{NS}/llmtrainjobs/{NAME}"
        job_writes = {(str(r.method).split(".")[-1], r.url.path) for r in api
                      if r.url.path.startswith(job_path) and not str(r.method).endswith("GET")}
        assert job_writes == {("PATCH", job_path + "/status")}, job_writes
        assert not api.objects[JOBS, NS, NAME].raw["metadata"].get("finalizers")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
