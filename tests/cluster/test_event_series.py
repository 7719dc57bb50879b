"""Repeated Events are counted on one object against the real API server, as client-go's
recorder does: `kubectl describe` shows the count, etcd holds one Event per series, and a
series whose Event has gone (its TTL, or deleted) starts a new one."""

from __future__ import annotations

import json

import pytest
from llmtrain_operator.k8s.client import K8s

pytestmark = pytest.mark.cluster

NS = "event-series"


def _events(bed) -> list[dict]:
    out = bed.kubectl("get", "events", "-n", NS, "--field-selector", "involvedObject.name=counted", "-o", "json")
    return sorted(json.loads(out.stdout)["items"], key=lambda e: e["metadata"]["creationTimestamp"])


def test_a_repeated_event_raises_one_events_count_and_another_message_is_its_own_event(local_cluster, monkeypatch):
    bed = local_cluster
    bed.kubectl("create", "namespace", NS, check=False)
    monkeypatch.setenv("KUBECONFIG", str(bed.kubeconfig))
    k8s = K8s.from_environment()
    job = {"apiVersion": "llmtrain.io/v1alpha1", "kind": "LLMTrainJob",
           "metadata": {"name": "counted", "namespace": NS, "uid": "0b6f3a9e-series"}}

    for _ in range(3):
        k8s.post_event(job, "Warning", "PodFailed", "pod counted-worker-1 failed (exit 137, Signal9)")
    k8s.post_event(job, "Warning", "PodFailed", "pod counted-worker-0 failed (exit 137, Signal9)")
    events = _events(bed)
    assert [(e["message"][:18], e["count"]) for e in events] == [("pod counted-worker", 3), ("pod counted-worker", 1)], events
    assert "worker-1" in events[0]["message"] and "worker-0" in events[1]["message"]
    assert events[0]["firstTimestamp"] <= events[0]["lastTimestamp"]

    # The series' Event gone (as after the API server's Event TTL): the next repeat
    # creates a fresh Event instead of failing on the missing one.
    bed.kubectl("delete", "event", "-n", NS, events[0]["metadata"]["name"])
    k8s.post_event(job, "Warning", "PodFailed", "pod counted-worker-1 failed (exit 137, Signal9)")
    again = [e for e in _events(bed) if "worker-1" in e["message"]]
    assert len(again) == 1 and again[0]["count"] == 1 and again[0]["metadata"]["name"] != events[0]["metadata"]["name"], again
