"""The operator bench's API request counts: the API server's own counter parsed, and only
the requests a controller makes attributed to it (kwok's pod status writes and node
Leases, watches and other controllers' resources left out)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import operator_scale as bench  # noqa: E402

def _line(code: int, group: str, resource: str, subresource: str, verb: str, value: int) -> str:
    """One line of the API server's counter, its labels as the API server writes them."""
    return (f'apiserver_request_total{{code="{code}",component="apiserver",dry_run="",group="{group}",'
            f'resource="{resource}",scope="resource",subresource="{subresource}",verb="{verb}",version="v1"}} {value}')


METRICS = "\n".join([
    "# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, ...",
    "# TYPE apiserver_request_total counter",
    _line(200, "llmtrain.io", "llmtrainjobs", "status", "PATCH", 40),
    _line(409, "llmtrain.io", "llmtrainjobs", "status", "PATCH", 2),
    _line(201, "", "pods", "", "POST", 7),
    _line(200, "", "pods", "status", "PATCH", 900),
    _line(200, "coordination.k8s.io", "leases", "", "PUT", 500),
    _line(200, "", "pods", "", "LIST", 3),
    _line(200, "", "pods", "", "WATCH", 9),
    _line(201, "", "events", "", "POST", 5),
    _line(201, "", "services", "", "POST", 4),
    _line(201, "events.k8s.io", "events", "", "POST", 8),
    'apiserver_request_latencies_summary{verb="PATCH"} 12',
]) + "\n"


class _Server:
    def __init__(self, text: str):
        self.body = text

    def text(self, path: str) -> str:
        assert path == "/metrics"
        return self.body


def test_the_counter_is_summed_over_answers_by_verb_resource_and_subresource():
    counts = bench.api_requests(_Server(METRICS))  # type: ignore[arg-type]
    assert counts[("PATCH", "llmtrain.io", "llmtrainjobs", "status")] == 42  # 200 and 409 alike: each is a request
    assert counts[("POST", "", "pods", "")] == 7
    assert counts[("PATCH", "", "pods", "status")] == 900
    assert counts[("POST", "events.k8s.io", "events", "")] == 8, "another group's resource of the same name apart"
    assert ("PATCH", "", "", "") not in counts, "another metric's lines are not counted"


def test_only_the_controllers_own_requests_are_attributed_between_two_counts():
    before = bench.api_requests(_Server(METRICS))  # type: ignore[arg-type]
    after = dict(before)
    for key, more in {("PATCH", "llmtrain.io", "llmtrainjobs", "status"): 10, ("POST", "", "pods", ""): 3,
                      ("PATCH", "", "pods", "status"): 400, ("PUT", "coordination.k8s.io", "leases", ""): 250,
                      ("LIST", "", "pods", ""): 2, ("WATCH", "", "pods", ""): 1, ("POST", "", "services", ""): 6,
                      ("POST", "", "events", ""): 1, ("POST", "events.k8s.io", "events", ""): 30,
                      ("POST", "", "pods", "binding"): 3, ("PATCH", "", "nodes", "status"): 20, ("LIST", "", "nodes", ""): 1}.items():
        after[key] = after.get(key, 0.0) + more
    ours = bench.controller_requests(bench.OURS, after, before)
    assert ours == {"writes": {"PATCH llmtrainjobs/status": 10, "POST pods": 3, "POST services": 6},
                    "reads": {"LIST pods": 2, "LIST nodes": 1}}, \
        "kwok's pod and node status, its Leases, the scheduler's bindings, Events (the endpoints controllers' too) and watches"
    kubeflow = bench.controller_requests(bench.KUBEFLOW, after, before)
    assert kubeflow["writes"] == {"POST pods": 3, "POST services": 6}, "another kind's job status is not its"


def test_a_counter_that_did_not_move_is_left_out():
    counts = bench.api_requests(_Server(METRICS))  # type: ignore[arg-type]
    assert bench.controller_requests(bench.OURS, counts, counts) == {"writes": {}, "reads": {}}


def test_the_events_counted_are_those_about_the_controllers_jobs_repeats_included():
    class _Events:
        def request(self, method: str, path: str) -> dict:
            assert (method, path) == ("GET", f"/api/v1/namespaces/{bench.NS}/events")
            return {"items": [
                {"involvedObject": {"kind": "LLMTrainJob"}, "count": 5},  # one Event repeated 5 times
                {"involvedObject": {"kind": "LLMTrainJob"}},  # a new-style Event: no count, once
                {"involvedObject": {"kind": "Service"}, "count": 900},  # the endpoints controller's
                {"involvedObject": {"kind": "PyTorchJob"}, "count": 2},
            ]}

    assert bench.job_events(_Events(), "LLMTrainJob") == 6  # type: ignore[arg-type]
    assert bench.job_events(_Events(), "PyTorchJob") == 2  # type: ignore[arg-type]
