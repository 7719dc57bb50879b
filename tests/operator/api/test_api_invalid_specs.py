"""Every invalid spec in the table is rejected, with a message that names its field."""

from __future__ import annotations

import pytest
from llmtrain_contract.names import METRICS_PORT
from llmtrain_operator.api import SpecInvalid, parse_job, receive
from llmtrain_operator.api.spec import MetricsSpec
from support.specs import invalid_cases, load_job

CASES = invalid_cases()


def test_the_table_has_at_least_15_distinct_cases():
    assert len(CASES) >= 15
    assert len({c.name for c in CASES}) == len(CASES)
    assert len({c.field for c in CASES}) >= 15


def test_the_base_example_is_valid():
    parse_job(load_job())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_invalid_spec_is_rejected_naming_its_field(case):
    with pytest.raises(SpecInvalid) as info:
        parse_job(case.job)
    paths = [e.path for e in info.value.errors]
    assert case.field in paths, f"expected an error at {case.field}, got {info.value.errors}"
    message = next(e.message for e in info.value.errors if e.path == case.field)
    assert message and len(message) > 10, "the message should say what would be valid"


def test_non_mapping_input_is_reported_not_raised():
    with pytest.raises(SpecInvalid, match="expected a mapping"):
        parse_job(["not", "a", "job"])


def test_wrong_kind_is_named():
    job = load_job()
    job["kind"] = "PyTorchJob"
    with pytest.raises(SpecInvalid) as info:
        parse_job(job)
    assert info.value.errors[0].path == "kind"


def test_several_errors_are_all_reported():
    job = load_job()
    job["spec"]["replicas"] = {"min": 0, "max": 2}
    job["spec"]["faultTolerance"]["restartPolicy"] = "Never"
    with pytest.raises(SpecInvalid) as info:
        parse_job(job)
    paths = {e.path for e in info.value.errors}
    assert {"spec.replicas.min", "spec.faultTolerance.restartPolicy"} <= paths


def test_map_keys_with_dots_are_bracketed_in_the_path():
    job = load_job()
    job["spec"]["resources"]["limits"] = {"nvidia.com/gpu": "eight"}
    with pytest.raises(SpecInvalid) as info:
        parse_job(job)
    assert info.value.errors[0].path == "spec.resources.limits[nvidia.com/gpu]"
    assert "quantity" in info.value.errors[0].message


def test_defaults_fill_in_what_the_example_leaves_out():
    job = parse_job(load_job())
    assert job.spec.fault_tolerance.restart_policy == "ReplaceFailed"
    assert job.spec.checkpoint.local.keep == 2
    assert job.spec.metrics.port == 9400
    assert list(job.spec.world_sizes()) == [1, 2]


def test_the_default_metrics_port_is_the_contracts():
    # The operator scrapes, the pods expose and the trainer serves the same default port.
    assert MetricsSpec().port == METRICS_PORT


def test_receive_reads_a_valid_job_and_its_status_apart():
    raw = load_job()
    raw["metadata"].update(generation=3)
    raw["status"] = {"phase": "Running", "restarts": 2}
    received = receive(raw)
    assert received.job is not None and received.job.metadata.name == raw["metadata"]["name"] and received.invalid is None
    assert (received.status.phase, received.status.restarts, received.generation, received.deleting) == ("Running", 2, 3, False)


def test_receive_reports_an_invalid_spec_without_raising_and_still_reads_the_status():
    raw = load_job()
    raw["spec"]["replicas"] = {"min": 3, "max": 2}
    raw["metadata"].update(generation="garbage", deletionTimestamp="2026-11-21T12:00:00Z")
    raw["status"] = {"phase": "Running", "restarts": 4, "conditions": "not a list"}
    received = receive(raw)
    assert received.job is None and "spec.replicas.min" in {e.path for e in received.invalid.errors}
    assert received.status.restarts == 4, "an unreadable status keeps its counters"
    assert received.generation is None, "only a real integer is a generation"
    assert received.deleting


def test_receive_of_something_that_is_not_a_mapping_is_an_invalid_job():
    received = receive(["not", "a", "job"])
    assert received.job is None and "expected a mapping" in str(received.invalid)
