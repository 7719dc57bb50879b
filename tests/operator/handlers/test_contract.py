"""The exact requests a reconcile pass makes, and how it survives API errors.

The pass under test is the operator's real one (observe -> plan -> apply -> status ->
events) with the real Kubernetes client, against kmock's stateful emulator.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import re
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from llmtrain_contract.names import METRICS_PORT
from llmtrain_operator.api.spec import LLMTrainJobSpec, SchedulingSpec
from llmtrain_operator.handlers.reconcile import Children, drain_background, listing_source, reconcile
from llmtrain_operator.k8s.client import PermanentApiError, TransientApiError
from llmtrain_operator.settings import OperatorSettings
from support.planning import NOW, ago, job

from .conftest import JOBS, VERBS

# The package re-exports a function named `reconcile`, which hides the submodule attribute.
reconcile_module = importlib.import_module("llmtrain_operator.handlers.reconcile")

SETTINGS = OperatorSettings(probes_enabled=False)
NS, NAME = "ml", "tiny-elastic"


def stored_job(api) -> dict[str, Any]:
    return copy.deepcopy(api.objects[JOBS, NS, NAME].raw)


def put_job(api, raw: dict[str, Any]) -> None:
    api.objects[JOBS, NS, NAME] = raw


def requests_since(api, start: int) -> list[tuple[str, str]]:
    return [(str(r.method).split(".")[-1], r.url.path) for r in list(api)[start:]]


def writes(calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [c for c in calls if c[0] != "GET"]


async def one_pass(api, k8s, now=NOW, source=None, settings=SETTINGS):
    try:
        return await reconcile(k8s, stored_job(api), source or listing_source(k8s), settings, now=now)
    finally:
        await drain_background()  # events are posted off the pass's critical path


OWNED = [{"apiVersion": "llmtrain.io/v1alpha1", "kind": "LLMTrainJob", "name": NAME, "uid": "uid-1", "controller": True}]
"""The ownerReferences of the job's children (``support.planning.job`` has uid ``uid-1``)."""


def pod(name: str, slot: int, phase: str = "Running", node: str = "node-0", ready: bool = True,
        terminated: dict[str, Any] | None = None, owners: list[dict[str, Any]] = OWNED) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "podIP": None,
                              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if terminated:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "creationTimestamp": ago(300), "ownerReferences": owners,
                     "labels": {"llmtrain.io/job": NAME, "llmtrain.io/role": "worker", "llmtrain.io/slot": str(slot),
                                "llmtrain.io/generation": "0"}},
        "spec": {"nodeName": node}, "status": status,
    }


STATUS = "/apis/llmtrain.io/v1alpha1/namespaces/ml/llmtrainjobs/tiny-elastic/status"


def node(name: str, ready: str = "True", since: float = 3600, unreachable: bool = False) -> dict[str, Any]:
    taints = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}] if unreachable else []
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": ago(since)}]}}


async def started_job(api, k8s, status_extra: dict[str, Any] | None = None, changes: dict[str, Any] | None = None) -> None:
    """A job after its first pass, with both workers running on healthy nodes."""
    put_job(api, job(changes))
    await one_pass(api, k8s, now=NOW - timedelta(seconds=60))
    for name in ("tiny-elastic-worker-0", "tiny-elastic-worker-1"):
        api.objects["v1/pods", NS, name] = pod(name, int(name[-1]), node=f"node-{name[-1]}")
    for i in range(2):
        api.objects["v1/nodes", None, f"node-{i}"] = node(f"node-{i}")
    raw = stored_job(api)
    raw["status"] = {**raw["status"], "phase": "Running", "step": 20, "lastProgressTime": ago(5), **(status_extra or {})}
    put_job(api, raw)


# ---------------------------------------------------------------- exact requests


def _token_secret(api) -> dict[str, Any]:
    """The job's token Secret, whose name ends with an HMAC of the job's uid."""
    found = [obj.raw for key, obj in api.objects.items() if key[0] == "v1/secrets"]
    assert len(found) == 1 and re.fullmatch(r"tiny-elastic-rdzv-token-[0-9a-f]{10}", found[0]["metadata"]["name"]), found
    return found[0]


async def test_a_new_job_creates_exactly_its_children_writes_status_once_and_posts_events(api, k8s):
    put_job(api, job())
    before = len(api)
    await one_pass(api, k8s)
    calls = writes(requests_since(api, before))
    # The job's token Secret first (the pods read it as they start), then every other
    # child and the one status patch in one concurrent round; Events after.
    assert calls[0] == ("POST", "/api/v1/namespaces/ml/secrets")
    assert sorted(calls[1:8]) == sorted([
        ("POST", "/api/v1/namespaces/ml/configmaps"),
        ("POST", "/api/v1/namespaces/ml/services"),
        ("POST", "/api/v1/namespaces/ml/services"),
        *[("POST", "/api/v1/namespaces/ml/pods")] * 3,
        ("PATCH", STATUS),
    ])
    assert calls[8:] and set(calls[8:]) == {("POST", "/api/v1/namespaces/ml/events")}
    secret = _token_secret(api)
    token = secret["stringData"]["token"]
    assert len(token) == 64 and secret["immutable"] is True and secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    for name in ("tiny-elastic-rdzv", "tiny-elastic-worker-0"):
        env = api.objects["v1/pods", NS, name].raw["spec"]["containers"][0]["env"]
        assert {"name": "LLMTRAIN_RDZV_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "token"}}} in env
    # Every create asks for strict field validation: a misspelt field in a podTemplate is
    # refused by name, never dropped in silence.
    creates = [r for r in list(api)[before:] if str(r.method).endswith("POST") and not r.url.path.endswith("/events")]
    assert creates and all(r.url.query.get("fieldValidation") == "Strict" for r in creates), [str(r.url) for r in creates]
    worker = api.objects["v1/pods", NS, "tiny-elastic-worker-1"].raw
    assert worker["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert worker["metadata"]["labels"]["llmtrain.io/slot"] == "1"
    assert stored_job(api)["status"]["phase"] == "Created"


async def test_a_pod_failure_keeps_the_pod_counts_a_restart_and_creates_the_next_one_after_the_backoff(api, k8s):
    await started_job(api, k8s)
    failed = pod("tiny-elastic-worker-0", 0, phase="Failed", ready=False,
                 terminated={"exitCode": 137, "reason": "Error", "finishedAt": ago(1)})
    failed["metadata"]["uid"] = "uid-w0"
    api.objects["v1/pods", NS, "tiny-elastic-worker-0"] = failed
    before = len(api)
    await one_pass(api, k8s)
    # The decision is recorded before the failed pod (its evidence) is marked kept.
    assert writes(requests_since(api, before)) == [
        ("PATCH", STATUS),
        ("PATCH", "/api/v1/namespaces/ml/pods/tiny-elastic-worker-0"),
        ("POST", "/api/v1/namespaces/ml/events"),
    ]
    keep = next(r for r in list(api)[before:] if str(r.method).endswith("PATCH") and r.url.path.endswith("/pods/tiny-elastic-worker-0"))
    assert keep.headers["Content-Type"] == "application/merge-patch+json"
    assert keep.data["metadata"]["uid"] == "uid-w0" and keep.data["metadata"]["labels"]["llmtrain.io/kept"] == "true"
    status = stored_job(api)["status"]
    assert status["restarts"] == 1 and status["lastFailure"]["reason"] == "Signal9"
    assert status["lastFailure"]["detectSeconds"] == 1.0
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=5))  # backoff (1s) over
    calls = writes(requests_since(api, before))
    assert calls.count(("POST", "/api/v1/namespaces/ml/pods")) == 1
    assert api.objects["v1/pods", NS, "tiny-elastic-worker-0-1"].raw["spec"]["hostname"] == "tiny-elastic-worker-0"
    assert api.objects["v1/pods", NS, "tiny-elastic-worker-0"].raw["status"]["phase"] == "Failed", "the failed pod is kept"
    assert stored_job(api)["status"]["keptPods"] == ["tiny-elastic-worker-0"]


async def test_a_failed_node_gets_its_pods_force_deleted(api, k8s):
    await started_job(api, k8s)
    api.objects["v1/nodes", None, "node-1"] = node("node-1", ready="Unknown", since=30, unreachable=True)
    before = len(api)
    await one_pass(api, k8s)
    calls = list(api)[before:]
    deletes = [r for r in calls if str(r.method).endswith("DELETE")]
    assert [r.url.path for r in deletes] == ["/api/v1/namespaces/ml/pods/tiny-elastic-worker-1"]
    assert deletes[0].data.get("gracePeriodSeconds") == 0
    status = stored_job(api)["status"]
    assert status["restartsByReason"] == {"NodeFailure": 1}
    assert status["quarantinedNodes"][0]["node"] == "node-1"


async def test_suspend_deletes_every_pod_and_resume_recreates_them(api, k8s):
    await started_job(api, k8s)
    api.objects["v1/pods", NS, "tiny-elastic-rdzv"] = {
        **pod("tiny-elastic-rdzv", 0), "metadata": {"name": "tiny-elastic-rdzv", "namespace": NS, "ownerReferences": OWNED,
                                                    "labels": {"llmtrain.io/job": NAME, "llmtrain.io/role": "rendezvous"}}}
    raw = stored_job(api)
    raw["spec"]["suspend"] = True
    put_job(api, raw)
    before = len(api)
    await one_pass(api, k8s)
    deleted = sorted(p for m, p in writes(requests_since(api, before)) if m == "DELETE")
    assert deleted == [f"/api/v1/namespaces/ml/pods/{n}" for n in ("tiny-elastic-rdzv", "tiny-elastic-worker-0", "tiny-elastic-worker-1")]
    assert stored_job(api)["status"]["phase"] == "Suspended"

    raw = stored_job(api)
    raw["spec"]["suspend"] = False
    put_job(api, raw)
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=10))
    created = [p for m, p in writes(requests_since(api, before)) if m == "POST" and p.endswith("/pods")]
    assert len(created) == 3
    assert stored_job(api)["status"]["restarts"] == 0


async def test_no_api_calls_at_all_when_nothing_changed(api, k8s):
    await started_job(api, k8s)
    await one_pass(api, k8s)  # settles status after the simulated start
    snapshot = await listing_source(k8s)(NS, NAME)

    async def cached(ns: str, name: str) -> Children:  # what kopf's watch-fed indexes provide
        return snapshot

    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=2), source=cached)
    assert requests_since(api, before) == []


# ---------------------------------------------------------------- what a pass reads


async def test_a_pod_with_the_jobs_label_that_the_job_does_not_own_is_neither_charged_nor_deleted(api, k8s):
    # A namesake job, deleted and created again under the same name, left a failed pod behind
    # that the garbage collector has not removed yet: the label matches, the owner does not.
    await started_job(api, k8s)
    api.objects["v1/pods", NS, "tiny-elastic-worker-0"] = pod(
        "tiny-elastic-worker-0", 0, phase="Failed", ready=False, terminated={"exitCode": 137, "reason": "Error", "finishedAt": ago(1)},
        owners=[{**OWNED[0], "uid": "uid-of-the-deleted-namesake"}])
    before = len(api)
    result = await one_pass(api, k8s)
    calls = writes(requests_since(api, before))
    assert not [c for c in calls if c[0] == "DELETE"], calls
    assert stored_job(api)["status"]["restarts"] == 0
    assert ("POST", "/api/v1/namespaces/ml/pods") in calls, "its own worker-0 is missing: created, and refused as existing"
    assert ("Pod", "tiny-elastic-worker-0") not in result.created


async def test_a_pass_parses_the_job_once_for_the_planner_and_for_what_it_reads(api, k8s, monkeypatch):
    job_module = importlib.import_module("llmtrain_operator.api.job")
    parsed, validated = [], []
    real = job_module.parse_job
    monkeypatch.setattr(job_module, "parse_job", lambda obj: parsed.append(obj) or real(obj))
    for model in (LLMTrainJobSpec, SchedulingSpec):  # what the handler once validated apart from parse_job
        plain = model.model_validate.__func__
        monkeypatch.setattr(model, "model_validate", classmethod(lambda cls, *a, _f=plain, **k: validated.append(cls) or _f(cls, *a, **k)))
    # Its dependencies (the Secret), its PodGroup and its Workload are all read from the spec.
    put_job(api, job({"spec.checkpoint.s3": {"bucket": "ckpts", "credentialsSecret": {"name": "s3-creds"}},
                      "spec.scheduling": {"gang": {"minAvailable": 2}},
                      "metadata.labels": {"llmtrain.io/job": NAME, "kueue.x-k8s.io/queue-name": "team-a"}}))
    before = len(api)
    await one_pass(api, k8s)
    calls = requests_since(api, before)
    assert ("GET", "/api/v1/namespaces/ml/secrets/s3-creds") in calls
    assert ("GET", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups/tiny-elastic") in calls
    assert ("GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/ml/workloads/llmtrainjob-tiny-elastic") in calls
    assert len(parsed) == 1 and validated == []


@pytest.mark.parametrize(("changes", "port"), [({}, METRICS_PORT), ({"spec.metrics.port": 9500}, 9500)], ids=["default", "set"])
async def test_trainers_are_scraped_on_the_port_of_the_parsed_spec(api, k8s, monkeypatch, changes, port):
    scraped = []

    async def probe_workers(pods, port, timeout):
        scraped.append(port)
        return {}

    async def probe_launchers(pods, timeout):
        return {}

    monkeypatch.setattr(reconcile_module, "probe_workers", probe_workers)
    monkeypatch.setattr(reconcile_module, "probe_launchers", probe_launchers)
    put_job(api, job(changes))
    await one_pass(api, k8s, settings=OperatorSettings(probes_enabled=True))
    assert scraped == [port]


# ---------------------------------------------------------------- API errors


async def test_409_conflict_on_create_is_taken_as_already_there(api, k8s):
    put_job(api, job())
    api["post /api/v1/namespaces/ml/pods"] << 409
    result = await one_pass(api, k8s)
    assert result.plan.status["phase"] == "Created"
    assert stored_job(api)["status"]["phase"] == "Created"
    assert not [c for c in result.created if c[0] == "Pod"], "a pod that existed already is not one this pass created"


async def test_410_gone_on_a_list_is_a_transient_error_and_nothing_is_written(api, k8s):
    put_job(api, job())
    api["get /api/v1/namespaces/ml/pods"] << 410
    before = len(api)
    with pytest.raises(TransientApiError, match="HTTP 410"):
        await one_pass(api, k8s)
    assert writes(requests_since(api, before)) == []


async def test_500_on_a_create_is_transient_the_status_is_recorded_and_the_retry_creates_only_what_is_missing(api, k8s):
    put_job(api, job())
    api["post /api/v1/namespaces/ml/configmaps"][:1] << 500  # the first request only
    with pytest.raises(TransientApiError, match="HTTP 500"):
        await one_pass(api, k8s)
    assert stored_job(api)["status"]["phase"] == "Created"
    # The other children went out in the same round; a pod waits for its ConfigMap the
    # way a kubelet does.
    created = sorted(p for m, p in writes(requests_since(api, 0)) if m == "POST" and not p.endswith("/events"))
    assert created == (["/api/v1/namespaces/ml/configmaps"] + ["/api/v1/namespaces/ml/pods"] * 3 + ["/api/v1/namespaces/ml/secrets"]
                       + ["/api/v1/namespaces/ml/services"] * 2)
    del api.objects["v1/configmaps", NS, "tiny-elastic-config"]  # the failed create left nothing behind
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=5))
    created = [p for m, p in writes(requests_since(api, before)) if m == "POST" and not p.endswith("/events")]
    assert created == ["/api/v1/namespaces/ml/configmaps"], "the retry creates only what is missing, nothing twice"
    assert api.objects["v1/configmaps", NS, "tiny-elastic-config"].raw["metadata"]["name"] == "tiny-elastic-config"


async def test_500_on_the_status_patch_touches_no_pod_and_the_next_pass_counts_the_failure_once(api, k8s):
    await started_job(api, k8s)
    api.objects["v1/pods", NS, "tiny-elastic-worker-0"] = pod(
        "tiny-elastic-worker-0", 0, phase="Failed", ready=False, terminated={"exitCode": 137, "reason": "Error"})
    unchanged = stored_job(api)
    done = len(api["patch " + STATUS])
    api["patch " + STATUS][done:done + 1] << 500  # the next patch only
    before = len(api)
    with pytest.raises(TransientApiError, match="HTTP 500"):
        await one_pass(api, k8s)
    assert writes(requests_since(api, before)) == [("PATCH", STATUS)], "no keep before the decision is recorded"
    put_job(api, unchanged)  # kmock stores a patch even when it answers 500; a real server would not
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1))
    assert writes(requests_since(api, before))[:2] == [("PATCH", STATUS), ("PATCH", "/api/v1/namespaces/ml/pods/tiny-elastic-worker-0")]
    assert stored_job(api)["status"]["restarts"] == 1


KEEP_OR_DELETE = [("PATCH", {}), ("DELETE", {"spec.faultTolerance.keepFailedPods": 0})]
"""How a failed pod leaves its slot: kept for its log (the default), or deleted."""


@pytest.mark.parametrize(("verb", "changes"), KEEP_OR_DELETE, ids=["keep", "delete"])
async def test_a_failed_keep_or_delete_is_retried_without_counting_the_failure_twice(api, k8s, verb, changes):
    await started_job(api, k8s, changes=changes)
    failed = pod("tiny-elastic-worker-0", 0, phase="Failed", ready=False, terminated={"exitCode": 137, "reason": "Error"})
    api.objects["v1/pods", NS, "tiny-elastic-worker-0"] = failed
    api[f"{verb.lower()} /api/v1/namespaces/ml/pods/tiny-elastic-worker-0"][:1] << 500
    with pytest.raises(TransientApiError, match="HTTP 500"):
        await one_pass(api, k8s)
    assert stored_job(api)["status"]["restarts"] == 1
    api.objects["v1/pods", NS, "tiny-elastic-worker-0"] = failed  # kmock applies a request even when it answers 500
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1))
    assert (verb, "/api/v1/namespaces/ml/pods/tiny-elastic-worker-0") in writes(requests_since(api, before))
    assert stored_job(api)["status"]["restarts"] == 1


async def test_a_status_patch_for_a_job_deleted_meanwhile_is_not_an_error(api, k8s):
    # E.g. its TTL expired and the delete went out in the same pass: nothing left to record.
    put_job(api, job())
    api["patch " + STATUS] << 404
    result = await one_pass(api, k8s)
    assert result.written is not None and result.plan.status["phase"] == "Created"


async def test_a_hanging_api_server_times_out_as_a_transient_error(api, k8s):
    put_job(api, job())
    api["get /api/v1/nodes"] << (lambda: asyncio.sleep(4))
    with pytest.raises(TransientApiError, match="Timeout|timed out"):
        await one_pass(api, k8s)


QUOTA = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
         "message": 'pods "tiny-elastic-worker-0" is forbidden: exceeded quota: gpu-quota, requested: nvidia.com/gpu=1, '
                    "used: nvidia.com/gpu=8, limited: nvidia.com/gpu=8"}


def _events(api, since: int) -> list[dict[str, Any]]:
    return [r.data for r in list(api)[since:] if str(r.method).endswith("POST") and r.url.path.endswith("/events")]


def _drop_pods(api) -> None:
    """kmock stores a created object even when a reaction answers an error: a refused
    create must leave nothing behind."""
    for key in [k for k in list(api.objects) if k[0] == "v1/pods" or str(k[0]).endswith("/pods")]:
        del api.objects[key]


def _pod_posts(api, since: int) -> int:
    return requests_since(api, since).count(("POST", "/api/v1/namespaces/ml/pods"))


async def test_a_refused_create_is_a_condition_and_an_event_with_the_servers_words_retried_with_backoff(api, k8s):
    # A ResourceQuota (or an admission webhook, Pod Security, RBAC) refuses the pods: the
    # pass does not crash, the rest of its work stands, and the job says why.
    put_job(api, job())
    api["post /api/v1/namespaces/ml/pods"][:6] << 403 << QUOTA  # two passes: the store and two workers each
    first = await one_pass(api, k8s)
    _drop_pods(api)
    assert ("Pod", "tiny-elastic-worker-0") not in first.created
    # What was refused is remembered as the refused actions themselves, not re-read from their words.
    refused = reconcile_module._REFUSALS[NS, NAME].refused
    assert {(r.action.kind, r.action.name) for r in refused} == {
        ("Pod", "tiny-elastic-rdzv"), ("Pod", "tiny-elastic-worker-0"), ("Pod", "tiny-elastic-worker-1")}
    assert ("Service", "tiny-elastic-workers") in first.created, "what was accepted stands"
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1))
    assert _pod_posts(api, before) == 0, "held back for 2 s after the first refusal"
    failure = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "ReplicaFailure")
    assert failure["status"] == "True" and failure["reason"] == "FailedCreate"
    assert "create Pod tiny-elastic-worker-0: " in failure["message"] and "exceeded quota: gpu-quota" in failure["message"]
    warned = [e for e in _events(api, before) if e["reason"] == "FailedCreate"]
    assert len(warned) == 1 and warned[0]["type"] == "Warning" and "exceeded quota" in warned[0]["message"]
    second = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=2))
    _drop_pods(api)
    assert _pod_posts(api, second) == 3, "retried once the backoff ran out"
    held = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=5))
    assert _pod_posts(api, held) == 0, "then held back for 4 s"
    assert not [e for e in _events(api, before) if e["reason"] == "FailedCreate"][1:], "one Event while it lasts"
    # The quota frees up: the pods are created at the next try, the condition clears with an Event.
    again = await one_pass(api, k8s, now=NOW + timedelta(seconds=6))
    assert ("Pod", "tiny-elastic-worker-0") in again.created
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=7))
    failure = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "ReplicaFailure")
    assert failure["status"] == "False" and failure["reason"] == "CreatesAccepted"
    assert [e["reason"] for e in _events(api, before)].count("CreatesAccepted") == 1


async def test_a_refused_token_secret_holds_back_the_pods_that_would_wait_for_it_and_says_why(api, k8s):
    """RBAC without ``create secrets`` (an older chart's Role): the pods are not created to
    hang in CreateContainerConfigError; the job says what was refused, and the pods come
    once the Secret is accepted."""
    put_job(api, job())
    api["post /api/v1/namespaces/ml/secrets"][:1] << 403 << {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'secrets is forbidden: User "system:serviceaccount:llmtrain:llmtrain" cannot create resource "secrets"'}
    before = len(api)
    first = await one_pass(api, k8s)
    name = _token_secret(api)["metadata"]["name"]
    del api.objects["v1/secrets", NS, name]  # kmock keeps what it refused
    assert _pod_posts(api, before) == 0, "no pod without its token"
    assert ("Service", "tiny-elastic-workers") in first.created, "the rest of the pass stands"
    refused = reconcile_module._REFUSALS[NS, NAME].refused
    assert [(r.action.kind, r.action.name) for r in refused] == [("Secret", name)]
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1))  # the refusal is reported by the next pass
    failure = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "ReplicaFailure")
    assert f"create Secret {name}: " in failure["message"] and 'cannot create resource "secrets"' in failure["message"]
    later = len(api)
    again = await one_pass(api, k8s, now=NOW + timedelta(seconds=3))
    assert _pod_posts(api, later) == 3 and ("Pod", "tiny-elastic-worker-0") in again.created


async def test_a_token_secret_that_exists_is_taken_as_the_jobs_and_the_token_is_the_same_every_time(api, k8s):
    """The operator may create Secrets, not read them: a 409 is the job's own Secret, and
    the token it would write is the same in every pass (drawn from the job's uid), so a
    Secret deleted by hand comes back with the token the running pods hold."""
    put_job(api, job())
    await one_pass(api, k8s)
    secret = _token_secret(api)
    name = secret["metadata"]["name"]
    del api.objects["v1/pods", NS, "tiny-elastic-worker-1"]
    del api.objects["v1/secrets", NS, name]
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1))
    calls = writes(requests_since(api, before))
    assert calls.index(("POST", "/api/v1/namespaces/ml/secrets")) < calls.index(("POST", "/api/v1/namespaces/ml/pods"))
    assert _token_secret(api) == secret, "the same name and token"
    del api.objects["v1/pods", NS, "tiny-elastic-worker-1"]
    again = await one_pass(api, k8s, now=NOW + timedelta(seconds=2))  # the Secret is there: 409, taken as the job's
    assert ("Pod", "tiny-elastic-worker-1") in again.created
    assert not reconcile_module._REFUSALS.get((NS, NAME)) or not reconcile_module._REFUSALS[NS, NAME].refused


async def test_an_object_of_the_jobs_name_that_it_does_not_own_is_refused_by_name_never_adopted(api, k8s):
    """Someone pre-created the job's rendezvous pod (to take its rendezvous over, or a copy
    by ``kubectl debug --copy-to``): the 409 on create is read, its owner checked, and the
    job says so; the pod is left alone, and the job's own children are created."""
    planted = pod("tiny-elastic-rdzv", 0, owners=[])
    planted["metadata"]["labels"] = {"llmtrain.io/job": NAME, "llmtrain.io/role": "rendezvous"}
    api.objects["v1/pods", NS, "tiny-elastic-rdzv"] = planted
    put_job(api, job())
    first = await one_pass(api, k8s)
    refused = reconcile_module._REFUSALS[NS, NAME].refused
    assert [(r.action.kind, r.action.name) for r in refused] == [("Pod", "tiny-elastic-rdzv")]
    assert "exists and is not this job's (its owners' uids: none)" in refused[0].message
    assert ("Pod", "tiny-elastic-worker-0") in first.created
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1))
    failure = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "ReplicaFailure")
    assert failure["status"] == "True" and "create Pod tiny-elastic-rdzv: Pod tiny-elastic-rdzv exists and is not this job's" \
        in failure["message"], failure
    assert [e["reason"] for e in _events(api, before)].count("FailedCreate") == 1
    assert not [c for c in writes(requests_since(api, before)) if c[0] == "DELETE"], "nothing of someone else's is deleted"
    assert api.objects["v1/pods", NS, "tiny-elastic-rdzv"].raw["metadata"].get("ownerReferences") in (None, [])


async def test_a_namesakes_pod_on_its_way_out_is_waited_for_not_reported(api, k8s):
    """The job was deleted and created again under its name: the old job's store pod is
    still terminating. Its create is answered 409 by an object being deleted: no refusal,
    the next passes create it once it is gone."""
    leftover = pod("tiny-elastic-rdzv", 0, owners=[{**OWNED[0], "uid": "uid-of-the-deleted-namesake"}])
    leftover["metadata"]["deletionTimestamp"] = ago(1)
    api.objects["v1/pods", NS, "tiny-elastic-rdzv"] = leftover
    put_job(api, job())
    await one_pass(api, k8s)
    assert not reconcile_module._REFUSALS.get((NS, NAME)) or not reconcile_module._REFUSALS[NS, NAME].refused


async def test_a_refusal_that_lasts_backs_off_to_five_minutes():
    from llmtrain_operator.handlers.reconcile import Refusal

    assert [Refusal(n, (), NOW).retry_after for n in (1, 2, 3, 8, 9, 50)] == [2.0, 4.0, 8.0, 256.0, 300.0, 300.0]


@pytest.mark.parametrize(("verb", "changes"), KEEP_OR_DELETE, ids=["keep", "delete"])
async def test_403_on_a_keep_or_delete_stays_a_permanent_error(api, k8s, verb, changes):
    await started_job(api, k8s, changes=changes)
    api.objects["v1/pods", NS, "tiny-elastic-worker-0"] = pod(
        "tiny-elastic-worker-0", 0, phase="Failed", ready=False, terminated={"exitCode": 137, "reason": "Error", "finishedAt": ago(1)})
    api[f"{verb.lower()} /api/v1/namespaces/ml/pods/tiny-elastic-worker-0"] << 403
    with pytest.raises(PermanentApiError, match="HTTP 403"):
        await one_pass(api, k8s)


async def test_an_invalid_object_is_reported_not_crashed_on(api, k8s):
    raw = job({"spec.replicas": {"min": 3, "max": 2}, "spec.faultTolerance.restartPolicy": "Sometimes"})
    put_job(api, raw)
    before = len(api)
    await one_pass(api, k8s)
    assert writes(requests_since(api, before)) == [
        ("PATCH", "/apis/llmtrain.io/v1alpha1/namespaces/ml/llmtrainjobs/tiny-elastic/status"),
        ("POST", "/api/v1/namespaces/ml/events"),
    ]
    invalid = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "Invalid")
    assert "spec.replicas.min" in invalid["message"] and "spec.faultTolerance.restartPolicy" in invalid["message"]


async def test_a_missing_secret_is_read_once_and_reported(api, k8s):
    raw = job({"spec.checkpoint.s3": {"bucket": "ckpts", "credentialsSecret": {"name": "s3-creds"}}})
    put_job(api, raw)
    before = len(api)
    await one_pass(api, k8s)
    calls = requests_since(api, before)
    assert ("GET", "/api/v1/namespaces/ml/secrets/s3-creds") in calls
    assert not [c for c in calls if c[0] == "POST" and c[1].endswith("/pods")]
    assert "Secret s3-creds" in next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "Invalid")["message"]


async def test_a_job_on_an_older_live_jobs_s3_prefix_is_refused_naming_it_and_starts_once_it_is_gone(api, k8s):
    s3 = {"bucket": "ckpts", "prefix": "team/run", "credentialsSecret": {"name": "s3-creds"}}
    api.objects["v1/secrets", NS, "s3-creds"] = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"}}
    put_job(api, job({"spec.checkpoint.s3": s3}))
    older = job({"spec.checkpoint.s3": s3})
    older["metadata"].update(name="first", namespace="other-team", uid="uid-first", creationTimestamp=ago(3600))
    listing = listing_source(k8s)

    def watched(jobs):
        async def source(namespace: str, name: str) -> Children:
            children = await listing(namespace, name)
            return replace(children, jobs=[*jobs, stored_job(api)])
        return source

    before = len(api)
    await one_pass(api, k8s, source=watched([older]))
    calls = requests_since(api, before)
    assert not [c for c in writes(calls) if c[0] == "POST" and not c[1].endswith("/events")], writes(calls)
    status = stored_job(api)["status"]
    invalid = next(c for c in status["conditions"] if c["type"] == "Invalid")
    assert status["phase"] == "Invalid" and invalid["reason"] == "TierConflict"
    assert "s3://ckpts/team/run is also used by job other-team/first" in invalid["message"]
    events = [e for e in api.objects if e[0] == "v1/events"]
    assert any(api.objects[e].raw.get("reason") == "TierConflict" for e in events)
    # The older job finished: the tier is free, and this one starts.
    before = len(api)
    await one_pass(api, k8s, source=watched([{**older, "status": {"phase": "Succeeded"}}]))
    assert ("POST", "/api/v1/namespaces/ml/pods") in writes(requests_since(api, before)), stored_job(api)["status"]


async def test_without_secret_checks_no_secret_is_read_and_the_pods_are_created(api, k8s):
    # Cluster-wide, the chart grants no Secret reads: the pods are created, and a missing
    # Secret is reported from their wait (tests/operator/planner/test_planner.py).
    raw = job({"spec.checkpoint.s3": {"bucket": "ckpts", "credentialsSecret": {"name": "s3-creds"}}})
    put_job(api, raw)
    before = len(api)
    await one_pass(api, k8s, settings=OperatorSettings(probes_enabled=False, check_secrets=False))
    calls = requests_since(api, before)
    assert not [c for c in calls if "/secrets" in c[1] and c[0] != "POST"], "none read"
    assert [c for c in calls if c[0] == "POST" and c[1].endswith("/secrets/s3-creds") or c[1].endswith("/secrets")] == [
        ("POST", "/api/v1/namespaces/ml/secrets")], "only the job's token is created"
    assert [c for c in calls if c[0] == "POST" and c[1].endswith("/pods")]


# ---------------------------------------------------------------- gang scheduling

PODGROUP = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups/tiny-elastic"
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
             "message": 'podgroups.scheduling.x-k8s.io "tiny-elastic" not found',
             "details": {"name": "tiny-elastic", "group": "scheduling.x-k8s.io", "kind": "podgroups"}}


def _gang_job() -> dict[str, Any]:
    return job({"spec.scheduling": {"gang": {"minAvailable": 2}}})


async def test_a_gang_job_creates_its_pod_group_through_the_custom_objects_api_and_then_its_workers(api, k8s):
    api.resources["scheduling.x-k8s.io/v1alpha1/podgroups"] = {
        "namespaced": True, "kind": "PodGroup", "singular": "podgroup", "verbs": VERBS, "shortnames": [], "categories": [],
        "subresources": ["status"]}
    # What the API server answers for a missing object of a served resource (kmock's own
    # 404 does not name the object).
    api[f"get {PODGROUP}"][:1] << 404 << NOT_FOUND
    put_job(api, _gang_job())
    before = len(api)
    first = await one_pass(api, k8s)
    calls = requests_since(api, before)
    assert ("GET", PODGROUP) in calls and ("POST", PODGROUP.rsplit("/", 1)[0]) in calls
    assert ("POST", "/api/v1/namespaces/ml/pods") in calls, "the store does not wait"
    assert ("Pod", "tiny-elastic-worker-0") not in first.created, "the workers wait for the PodGroup"
    group = api.objects["scheduling.x-k8s.io/v1alpha1/podgroups", NS, NAME].raw
    assert group["spec"]["minMember"] == 2 and group["metadata"]["ownerReferences"][0]["kind"] == "LLMTrainJob"
    second = await one_pass(api, k8s, now=NOW + timedelta(seconds=1))
    assert ("Pod", "tiny-elastic-worker-0") in second.created and ("Pod", "tiny-elastic-worker-1") in second.created
    ready = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "PodGroupReady")
    assert ready["status"] == "True"


async def test_a_cluster_without_the_pod_group_api_is_told_apart_from_a_missing_pod_group(api, k8s):
    # The API server answers an unknown resource with a bare "404 page not found", a missing
    # object with a Status naming it: only the first means "not installed".
    api[f"get {PODGROUP}"] << 404 << b"404 page not found\n"
    put_job(api, _gang_job())
    result = await one_pass(api, k8s)
    assert ("Pod", "tiny-elastic-worker-0") in result.created, "the pods are created without a PodGroup"
    missing = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "PodGroupReady")
    assert missing["status"] == "False" and missing["reason"] == "PodGroupAPIMissing"
    assert [e for e in _events(api, 0) if e["reason"] == "PodGroupAPIMissing" and e["type"] == "Warning"]


async def test_a_forbidden_pod_group_read_is_in_the_status_not_a_crash(api, k8s):
    api[f"get {PODGROUP}"] << 403 << {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
                                      "message": 'podgroups.scheduling.x-k8s.io "tiny-elastic" is forbidden: User "op" cannot get'}
    put_job(api, _gang_job())
    result = await one_pass(api, k8s)
    assert ("Pod", "tiny-elastic-worker-0") not in result.created, "the workers wait"
    refused = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "PodGroupReady")
    assert refused["reason"] == "ReadRefused" and 'User "op" cannot get' in refused["message"]


ISOLATED = OperatorSettings(probes_enabled=False, network_policy=True,
                            network_policy_operator_pods="app.kubernetes.io/name=llmtrain-operator")
POLICIES = "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies"


async def test_with_isolation_the_policy_is_created_first_and_the_pods_in_the_pass_that_sees_it(api, k8s, monkeypatch):
    monkeypatch.setenv("POD_NAMESPACE", "llmtrain-system")
    put_job(api, job())
    before = len(api)
    first = await one_pass(api, k8s, settings=ISOLATED)
    calls = writes(requests_since(api, before))
    assert ("POST", POLICIES) in calls and not [c for c in calls if c[1].endswith("/pods")], calls
    policy = api.objects["networking.k8s.io/v1/networkpolicies", NS, "tiny-elastic-isolation"].raw
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert policy["spec"]["ingress"][1]["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "llmtrain-system"}}
    assert first.plan.requeue_after is not None
    creates = [r for r in list(api)[before:] if r.url.path == POLICIES and str(r.method).endswith("POST")]
    assert creates and all(r.url.query.get("fieldValidation") == "Strict" for r in creates)
    before = len(api)
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1), settings=ISOLATED)
    calls = writes(requests_since(api, before))
    assert calls.count(("POST", "/api/v1/namespaces/ml/pods")) == 3, calls
    assert ("POST", POLICIES) not in calls, "a seen policy is not created again"


async def test_a_planted_policy_of_the_jobs_name_is_refused_and_no_pod_starts_open(api, k8s, monkeypatch):
    """A NetworkPolicy of the job's name that the job does not own (one that lets everyone
    in, say) is never taken for the job's: the create is refused by name and the job's pods
    wait for their own policy."""
    monkeypatch.setenv("POD_NAMESPACE", "llmtrain-system")
    api.objects["networking.k8s.io/v1/networkpolicies", NS, "tiny-elastic-isolation"] = {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "tiny-elastic-isolation", "namespace": NS, "labels": {"llmtrain.io/job": NAME}},
        "spec": {"podSelector": {}, "ingress": [{}]}}
    put_job(api, job())
    await one_pass(api, k8s, settings=ISOLATED)
    refused = reconcile_module._REFUSALS[NS, NAME].refused
    assert [(r.action.kind, r.action.name) for r in refused] == [("NetworkPolicy", "tiny-elastic-isolation")]
    await one_pass(api, k8s, now=NOW + timedelta(seconds=1), settings=ISOLATED)
    assert not [k for k in api.objects if k[0] == "v1/pods"], "no pod of the job was created"
    failure = next(c for c in stored_job(api)["status"]["conditions"] if c["type"] == "ReplicaFailure")
    assert "NetworkPolicy tiny-elastic-isolation exists and is not this job's" in failure["message"], failure


def test_a_bad_isolation_setting_is_an_error_naming_it_and_off_is_none():
    from llmtrain_operator.handlers.reconcile import isolation_of
    from llmtrain_operator.planner.isolation import IsolationError

    assert isolation_of(SETTINGS, {}) is None
    with pytest.raises(IsolationError, match="is not a namespace name"):
        isolation_of(ISOLATED, {})  # no POD_NAMESPACE
    with pytest.raises(IsolationError, match="'nope' is not a label key=value"):
        isolation_of(OperatorSettings(network_policy=True, network_policy_operator_pods="nope"), {"POD_NAMESPACE": "ops"})
    made = isolation_of(ISOLATED, {"POD_NAMESPACE": "ops"})
    assert made is not None and made.operator_namespace == "ops"
