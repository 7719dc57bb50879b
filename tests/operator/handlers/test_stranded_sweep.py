"""The leader's sweep of a deleted job's pods stuck Terminating on a dead node
(handlers._sweep_once): only pods of an LLMTrainJob that is gone, being deleted, or was
replaced by a namesake are force-deleted, and only on a node not Ready past the grace."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from llmtrain_operator import handlers
from llmtrain_operator.planner.stranded import STRANDED_GRACE_SECONDS


def pod(name: str, owner: str | None, node: str, deleting: bool = True) -> dict:
    meta = {"name": name, "labels": {"llmtrain.io/job": "j", "llmtrain.io/role": "worker"}}
    if owner:
        meta["ownerReferences"] = [{"kind": "LLMTrainJob", "uid": owner, "name": "j", "apiVersion": "llmtrain.io/v1alpha1"}]
    if deleting:
        meta["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": "Running"}}


def node(name: str, ready: str, seconds_ago: float) -> dict:
    since = (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": since}]}}


class Loops:
    def __init__(self, bodies):
        self.bodies = bodies

    def body(self, key):
        return self.bodies.get(key)


class K8s:
    def __init__(self, jobs=None):
        self.deleted = []
        self.jobs = jobs or {}
        self.reads = []

    def read_object(self, api_version, plural, namespace, name):
        self.reads.append((namespace, name))
        return True, self.jobs.get((namespace, name))

    def delete_pod(self, namespace, name, grace_seconds=None, force=False):
        self.deleted.append((namespace, name, force))
        return True


def test_the_sweep_force_deletes_only_a_gone_jobs_pods_on_dead_nodes(monkeypatch):
    dead, alive = node("dead", "Unknown", STRANDED_GRACE_SECONDS + 5), node("alive", "True", 3600)
    live_body = {"metadata": {"name": "live", "uid": "u-live"}}
    indexes = {
        "pods_by_job": {
            ("ns", "gone"): [pod("gone-0", "u-gone", "dead"), pod("gone-1", "u-gone", "alive"),
                             pod("gone-2", "u-gone", "dead", deleting=False), pod("mine", None, "dead")],
            ("ns", "live"): [pod("live-0", "u-live", "dead"), pod("namesake-0", "u-old", "dead")],
        },
        "nodes_by_name": {"dead": [dead], "alive": [alive]},
    }
    monkeypatch.setattr(handlers, "_INDEXES", indexes)
    monkeypatch.setattr(handlers, "LOOPS", Loops({("ns", "live"): live_body}))
    k8s = K8s()
    asyncio.run(handlers._sweep_once(k8s))
    assert sorted(k8s.deleted) == [("ns", "gone-0", True), ("ns", "namesake-0", True)]


def test_a_job_being_deleted_counts_as_gone(monkeypatch):
    body = {"metadata": {"name": "j", "uid": "u", "deletionTimestamp": "2026-11-28T00:00:00Z"}}
    monkeypatch.setattr(handlers, "_INDEXES", {"pods_by_job": {("ns", "j"): [pod("p", "u", "dead")]},
                                               "nodes_by_name": {"dead": [node("dead", "False", 60)]}})
    monkeypatch.setattr(handlers, "LOOPS", Loops({("ns", "j"): body}))
    k8s = K8s({("ns", "j"): body})
    asyncio.run(handlers._sweep_once(k8s))
    assert k8s.deleted == [("ns", "p", True)]


def test_a_live_job_the_watch_has_not_delivered_yet_keeps_its_pods(monkeypatch):
    """An operator just started: its loops have not seen the job, the API server has."""
    body = {"metadata": {"name": "j", "uid": "u"}}
    monkeypatch.setattr(handlers, "_INDEXES", {"pods_by_job": {("ns", "j"): [pod("p", "u", "dead")]},
                                               "nodes_by_name": {"dead": [node("dead", "False", 60)]}})
    monkeypatch.setattr(handlers, "LOOPS", Loops({}))
    k8s = K8s({("ns", "j"): body})
    asyncio.run(handlers._sweep_once(k8s))
    assert k8s.reads == [("ns", "j")] and k8s.deleted == []


def test_indexes_are_kept_from_pod_and_node_events_too(monkeypatch):
    monkeypatch.setattr(handlers, "_INDEXES", {})
    handlers._keep_indexes({"pods_by_job": {"x": 1}, "nodes_by_name": {"y": 2}, "logger": object()})
    assert handlers._INDEXES == {"pods_by_job": {"x": 1}, "nodes_by_name": {"y": 2}}
