"""Two live jobs on one checkpoint tier: the younger is Invalid (``TierConflict``) naming
the older, and nothing of it is created until the older is gone or one of them moves."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from llmtrain_operator.api.observed import format_time
from llmtrain_operator.planner import plan
from llmtrain_operator.planner.tierclaims import conflicts, locations
from support.planning import NOW, job, observed, summary

S3 = {"bucket": "team-ckpt", "prefix": "runs/shared", "credentialsSecret": {"name": "creds"}}
SHARED = {"claimName": "lustre", "subPath": "runs/shared"}


def _job(name: str, ns: str = "ml", minutes_ago: float = 10, phase: str | None = None, **ckpt: object) -> dict:
    raw = {"apiVersion": "llmtrain.io/v1alpha1", "kind": "LLMTrainJob",
           "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                        "creationTimestamp": format_time(NOW - timedelta(minutes=minutes_ago))},
           "spec": {"checkpoint": copy.deepcopy(ckpt)}}
    if phase is not None:
        raw["status"] = {"phase": phase}
    return raw


def test_the_locations_are_normalised_and_default_to_the_jobs_own_paths():
    assert list(locations(_job("a", s3={**S3, "prefix": "/runs//shared/./"})).values()) == ["s3://team-ckpt/runs/shared"]
    assert list(locations(_job("a", s3={**S3, "prefix": None, "endpoint": "http://minio:9000/"})).values()) == [
        "s3://team-ckpt/llmtrain/ml/a at http://minio:9000"]
    assert list(locations(_job("a", shared={"claimName": "lustre"})).values()) == [
        "PersistentVolumeClaim ml/lustre subPath ml/a"]
    assert locations(_job("a", enabled=False, s3=S3)) == {}


@pytest.mark.parametrize("body", [{}, {"metadata": []}, {"metadata": {"name": "a"}, "spec": "x"},
                                  {"metadata": {"name": "a"}, "spec": {"checkpoint": {"s3": ["x"], "shared": 3}}},
                                  {"metadata": {"name": 7}, "spec": {"checkpoint": {"s3": S3}}}])
def test_a_body_that_is_no_valid_job_claims_nothing_and_raises_nothing(body):
    assert locations(body) == {}
    assert conflicts(body, [body, _job("b", s3=S3)]) == ()


def test_the_younger_of_two_live_jobs_on_one_prefix_is_told_the_older_and_the_older_runs():
    older, younger = _job("first", s3=S3, minutes_ago=30), _job("second", ns="other", s3=S3, minutes_ago=1)
    everyone = [older, younger]
    assert conflicts(younger, everyone) == (
        "checkpoint tier s3://team-ckpt/runs/shared is also used by job ml/first, which is older and still live",)
    assert conflicts(older, everyone) == ()


def test_what_does_not_collide_is_not_refused():
    me = _job("me", s3=S3, shared=SHARED, minutes_ago=1)
    for other in (_job("finished", s3=S3, shared=SHARED, phase="Succeeded"),
                  _job("failed", s3=S3, shared=SHARED, phase="Failed"),
                  _job("elsewhere", s3={**S3, "endpoint": "http://minio:9000"}),  # another S3 server
                  _job("other-bucket", s3={**S3, "bucket": "other"}),
                  _job("deeper", s3={**S3, "prefix": "runs/shared/deeper"}),  # a prefix below holds its own steps
                  _job("other-ns", ns="team-b", shared=SHARED)):  # a PVC is its namespace's
        assert conflicts(me, [me, other]) == (), other["metadata"]["name"]


def test_a_shared_subpath_in_one_namespace_collides_even_with_another_jobs_default():
    older = _job("a", shared={"claimName": "lustre"}, minutes_ago=5)
    younger = _job("b", shared={"claimName": "lustre", "subPath": "ml/a/"}, minutes_ago=1)
    assert conflicts(younger, [older, younger]) == (
        "checkpoint tier PersistentVolumeClaim ml/lustre subPath ml/a is also used by job ml/a, which is older and still live",)


def test_a_refused_job_is_invalid_creates_nothing_and_comes_back_once_the_conflict_is_gone():
    raw = job({"spec.checkpoint.s3": S3})
    empty = dict(with_store=False, services=frozenset(), configmaps={})
    why = "checkpoint tier s3://team-ckpt/runs/shared is also used by job ml/first, which is older and still live"
    refused = plan(raw, observed(raw, [], **empty, tier_conflicts=(why,)), NOW)
    invalid = next(c for c in refused.status["conditions"] if c["type"] == "Invalid")
    assert refused.status["phase"] == "Invalid" and invalid["reason"] == "TierConflict"
    assert invalid["message"].startswith(why) and "spec.checkpoint.s3.prefix" in invalid["message"]
    assert not [a for a in summary(refused.actions) if a.startswith("create ")], summary(refused.actions)
    assert refused.requeue_after is not None, "looked at again without a watch event"
    cleared = plan({**raw, "status": refused.status}, observed(raw, [], **empty), NOW)
    assert next(c for c in cleared.status["conditions"] if c["type"] == "Invalid")["status"] == "False"
    assert "create Pod/tiny-elastic-worker-0" in summary(cleared.actions)
