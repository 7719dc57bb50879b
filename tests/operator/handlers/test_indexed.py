"""The watch-fed source of a pass: the job's children from the indexes, and every job
body the operator watches (to find two jobs on one checkpoint tier)."""

from __future__ import annotations

import importlib

handlers = importlib.import_module("llmtrain_operator.handlers")


class _Loops:
    def __init__(self, bodies):
        self._bodies = bodies

    def bodies(self):
        return self._bodies

    def body(self, key):
        return self._bodies.get(key)


def test_a_watch_fed_pass_sees_every_watched_job_and_its_own_children(monkeypatch):
    bodies = {("ml", "a"): {"metadata": {"name": "a"}}, ("other", "b"): {"metadata": {"name": "b"}}}
    monkeypatch.setattr(handlers, "LOOPS", _Loops(bodies))
    indexes = {"pods_by_job": {("ml", "a"): [{"metadata": {"name": "a-worker-0"}}]}, "nodes_by_name": {},
               "services_by_job": {}, "configmaps_by_job": {}, "networkpolicies_by_job": {}}
    monkeypatch.setattr(handlers, "_INDEXES", indexes)
    children = handlers._indexed(("ml", "a"))
    assert children.jobs == list(bodies.values())
    assert children.body is bodies[("ml", "a")]
    assert [p["metadata"]["name"] for p in children.pods] == ["a-worker-0"]
