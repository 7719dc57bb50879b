"""The operator's metrics come from the planner's typed decisions, one count per
decision: nothing is inferred by diffing statuses."""

from __future__ import annotations

from llmtrain_operator import metrics
from llmtrain_operator.planner import plan
from llmtrain_operator.planner.decisions import FailureRecorded, RestartCharged
from support.planning import NOW, job, observed, running_status, worker


def value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_two_failures_decided_in_one_pass_are_counted_as_two():
    raw = job({"spec.replicas": {"min": 1, "max": 3}, "spec.trainer.builtin.globalBatchSize": 24}, status=running_status())
    pods = [worker(0, phase="Failed", exit_code=137), worker(1, phase="Failed", exit_code=137), worker(2)]
    result = plan(raw, observed(raw, pods), NOW)
    assert sum(isinstance(d, RestartCharged) for d in result.decisions) == 2
    assert sum(isinstance(d, FailureRecorded) for d in result.decisions) == 2
    before = (value("llmtrain_operator_restarts_total", namespace="ml", reason="Signal9"),
              value("llmtrain_operator_failures_detected_total", kind="ProcessCrash"),
              value("llmtrain_operator_jobs_restarted_total", namespace="ml"))
    metrics.record_pass("ml", "tiny-elastic", result.decisions, result.status, 0.01)
    after = (value("llmtrain_operator_restarts_total", namespace="ml", reason="Signal9"),
             value("llmtrain_operator_failures_detected_total", kind="ProcessCrash"),
             value("llmtrain_operator_jobs_restarted_total", namespace="ml"))
    assert [a - b for a, b in zip(after, before)] == [2, 2, 2]
    assert result.status["restarts"] == 2  # and the status agrees


def test_a_job_counts_as_created_once_and_as_finished_once():
    raw = job()
    first = plan(raw, observed(raw, [], with_store=False, services=frozenset(), configmaps={}), NOW)
    created = value("llmtrain_operator_jobs_created_total", namespace="ml")
    metrics.record_pass("ml", "tiny-elastic", first.decisions, first.status, 0.01)
    assert value("llmtrain_operator_jobs_created_total", namespace="ml") == created + 1
    again = plan({**raw, "status": first.status}, observed(raw, []), NOW)
    metrics.record_pass("ml", "tiny-elastic", again.decisions, again.status, 0.01)
    assert value("llmtrain_operator_jobs_created_total", namespace="ml") == created + 1
    done = plan(job(status=running_status()), observed(raw, [worker(0, phase="Succeeded", exit_code=0),
                                                            worker(1, phase="Succeeded", exit_code=0)]), NOW)
    succeeded = value("llmtrain_operator_jobs_successful_total", namespace="ml")
    metrics.record_pass("ml", "tiny-elastic", done.decisions, done.status, 0.01)
    assert value("llmtrain_operator_jobs_successful_total", namespace="ml") == succeeded + 1
    assert value("llmtrain_operator_jobs", phase="Succeeded") >= 1


def test_a_jobs_failed_series_is_born_at_zero_so_its_failure_is_an_increase_and_goes_with_the_job():
    # An alert on increase() sees nothing of a series that first appears at 1.
    raw = job(status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1)]), NOW)
    metrics.record_pass("ml", "born-at-zero", result.decisions, result.status, 0.01)
    assert metrics.REGISTRY.get_sample_value("llmtrain_operator_jobs_failed_total",
                                             {"namespace": "ml", "llmtrain_job": "born-at-zero"}) == 0.0
    metrics.forget("ml", "born-at-zero")
    assert metrics.REGISTRY.get_sample_value("llmtrain_operator_jobs_failed_total",
                                             {"namespace": "ml", "llmtrain_job": "born-at-zero"}) is None
