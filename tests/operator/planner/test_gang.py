"""Gang scheduling in the planner: the PodGroup the chosen scheduler expects, created
before the worker pods, held back while Volcano keeps it Pending, reported when the
cluster lacks its API, and given back by a suspended or finished job."""

from __future__ import annotations

import pytest
from llmtrain_operator.api import parse_job
from llmtrain_operator.api.observed import PodGroupView, pod_group_view
from llmtrain_operator.planner import CreateObject, DeleteObject, plan
from llmtrain_operator.planner.podgroup import api_for, min_resources, scale_quantity
from support.planning import NOW, ago, job, observed, running_status, summary, worker

W0, W1 = "tiny-elastic-worker-0", "tiny-elastic-worker-1"
GANG = {"spec.scheduling": {"gang": {"minAvailable": 2}}}
VOLCANO = {"spec.scheduling": {"schedulerName": "volcano", "gang": {"minAvailable": 2, "queue": "research"},
                               "priorityClassName": "high"}, "spec.resources": None}


def run(raw, obs):
    result = plan(raw, obs, NOW)
    return result, result.status, summary(result.actions), [(e.reason, e.message) for e in result.events]


def condition(status, type_="PodGroupReady"):
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def manifest(result, kind="PodGroup"):
    return next(a.manifest for a in result.actions if isinstance(a, CreateObject) and a.kind == kind)


def test_the_scheduler_is_chosen_by_the_gang_field_else_by_the_scheduler_name():
    assert api_for(parse_job(job(GANG))).api_version == "scheduling.x-k8s.io/v1alpha1"
    assert api_for(parse_job(job(VOLCANO))).api_version == "scheduling.volcano.sh/v1beta1"
    explicit = {"spec.scheduling": {"schedulerName": "volcano", "gang": {"minAvailable": 1, "scheduler": "scheduler-plugins"}}}
    assert api_for(parse_job(job(explicit))).scheduler == "scheduler-plugins"
    assert api_for(parse_job(job())) is None


def test_a_new_gang_job_creates_its_pod_group_first_and_its_workers_after_it_exists():
    raw = job({**GANG, "spec.resources": {"requests": {"cpu": "1500m", "memory": "3Gi"}, "limits": {"nvidia.com/gpu": 8}}})
    first, status, actions, events = run(raw, observed(raw, [], with_store=False, services=frozenset(), configmaps={},
                                                      pod_group=PodGroupView(served=True)))
    assert "create PodGroup/tiny-elastic" in actions and "create Pod/tiny-elastic-rdzv" in actions
    assert not [a for a in actions if a.startswith("create Pod/") and "worker" in a], "the workers wait for the PodGroup"
    group = manifest(first)
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and group["metadata"]["namespace"] == "ml"
    assert group["spec"] == {"minMember": 2, "minResources": {"cpu": "3000m", "memory": "6Gi", "nvidia.com/gpu": "16"}}
    owner = group["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "LLMTrainJob" and owner["uid"] == "uid-1" and owner["controller"] is True
    assert ("PodGroupCreated", "created PodGroup tiny-elastic (scheduling.x-k8s.io/v1alpha1) with minMember 2") in events
    assert first.requeue_after is not None and first.requeue_after <= 1.0
    raw["status"] = status
    seen = pod_group_view({"spec": group["spec"]})
    _, status, actions, _ = run(raw, observed(raw, [], pod_group=seen))
    assert f"create Pod/{W0}" in actions and f"create Pod/{W1}" in actions
    ready = condition(status)
    assert ready["status"] == "True" and "minMember 2" in ready["message"]
    # The workers name their group the way each scheduler reads it.
    pod = manifest(plan(raw, observed(raw, [], pod_group=seen), NOW), "Pod")
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "tiny-elastic"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "tiny-elastic"


def test_volcano_pods_wait_while_its_pod_group_is_pending_and_start_once_it_is_inqueue():
    raw = job(VOLCANO)
    first, _, _, _ = run(raw, observed(raw, [], pod_group=PodGroupView(served=True)))
    group = manifest(first)
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 2, "queue": "research", "priorityClassName": "high"}
    for phase in ("", "Pending"):
        result, status, actions, _ = run(raw, observed(raw, [],
                                                       pod_group=pod_group_view({"spec": group["spec"], "status": {"phase": phase}})))
        assert not [a for a in actions if a.startswith("create Pod/") and "worker" in a], phase
        held = condition(status)
        assert held["status"] == "False" and held["reason"] == "PodGroupPending" and "Volcano" in held["message"]
        assert result.requeue_after is not None and result.requeue_after <= 2.0, "the phase is polled"
    _, status, actions, _ = run(raw, observed(raw, [], pod_group=pod_group_view({"spec": group["spec"], "status": {"phase": "Inqueue"}})))
    assert f"create Pod/{W0}" in actions and condition(status)["status"] == "True"


def test_without_the_pod_group_api_the_job_says_so_once_and_runs_without_it():
    raw = job(GANG)
    _, status, actions, events = run(raw, observed(raw, [], pod_group=PodGroupView(served=False)))
    assert f"create Pod/{W0}" in actions and not any("PodGroup" in a for a in actions)
    missing = condition(status)
    assert missing["status"] == "False" and missing["reason"] == "PodGroupAPIMissing"
    assert "podgroups.scheduling.x-k8s.io/v1alpha1" in missing["message"] and "scheduler-plugins installed" in missing["message"]
    assert [r for r, _ in events].count("PodGroupAPIMissing") == 1
    raw["status"] = status
    _, _, _, events = run(raw, observed(raw, [worker(0), worker(1)], pod_group=PodGroupView(served=False)))
    assert "PodGroupAPIMissing" not in [r for r, _ in events], "one Event while it lasts"


def test_a_changed_min_available_updates_the_pod_group():
    raw = job({"spec.scheduling": {"gang": {"minAvailable": 1}}, "spec.resources": None}, status=running_status(phase="Restarting"))
    stale = pod_group_view({"spec": {"minMember": 2}})
    _, _, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], pod_group=stale))
    assert "update PodGroup/tiny-elastic" in actions
    fresh = pod_group_view({"spec": {"minMember": 1, "queue": "default"}})  # a field the scheduler defaulted stays
    _, _, actions, _ = run(raw, observed(raw, [worker(0), worker(1)], pod_group=fresh))
    assert "update PodGroup/tiny-elastic" not in actions


@pytest.mark.parametrize("status", [
    pytest.param({"phase": "Succeeded", "completionTime": ago(10)}, id="finished"),
    pytest.param(None, id="suspended"),
])
def test_a_suspended_or_finished_job_gives_its_pod_group_back(status):
    changes = {**GANG, "spec.suspend": status is None}
    raw = job(changes, status=status or running_status())
    _, new, actions, events = run(raw, observed(raw, [], with_store=False, pod_group=pod_group_view({"spec": {"minMember": 2}})))
    assert "delete PodGroup/tiny-elastic" in actions and "PodGroupDeleted" in [r for r, _ in events]
    raw["status"] = new
    _, new, actions, _ = run(raw, observed(raw, [], with_store=False, pod_group=PodGroupView(served=True)))
    assert not any("PodGroup" in a for a in actions)
    assert condition(new)["reason"] == "PodGroupDeleted"


def test_a_pass_that_did_not_read_the_pod_group_leaves_it_alone():
    raw = job(GANG, status=running_status())
    _, _, actions, _ = run(raw, observed(raw, [worker(0), worker(1)]))
    assert not any("PodGroup" in a for a in actions)


@pytest.mark.parametrize("quantity,factor,scaled", [
    ("16Gi", 2, "32Gi"), ("500m", 3, "1500m"), ("1.5", 2, "3"), ("0.25", 3, "0.75"), ("8", 4, "32"), ("1e3", 2, None),
])
def test_quantities_scale_with_their_suffix(quantity, factor, scaled):
    assert scale_quantity(quantity, factor) == scaled


def test_min_resources_prefer_requests_over_limits():
    raw = job({"spec.resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4", "memory": "1Gi"}}})
    assert min_resources(parse_job(raw), 3) == {"cpu": "6", "memory": "3Gi"}


def test_a_refused_read_holds_the_workers_and_says_why():
    raw = job(GANG)
    words = 'read PodGroup tiny-elastic: podgroups.scheduling.x-k8s.io "tiny-elastic" is forbidden: User "op" cannot get resource'
    result, status, actions, events = run(raw, observed(raw, [], pod_group=PodGroupView(served=True, refused=words)))
    assert not [a for a in actions if a.startswith("create Pod/") and "worker" in a]
    held = condition(status)
    assert held["status"] == "False" and held["reason"] == "ReadRefused" and "forbidden" in held["message"]
    assert ("ReadRefused", words) in events and result.requeue_after is not None


def test_a_pod_group_of_the_jobs_name_that_is_not_the_jobs_is_never_used_updated_or_deleted():
    theirs = {"metadata": {"name": "tiny-elastic", "uid": "pg-1", "ownerReferences": [{"kind": "LLMTrainJob", "uid": "other-job"}]},
              "spec": {"minMember": 7}}
    view = pod_group_view(theirs, owner_uid="uid-1")
    assert not view.exists and "not this job's" in view.foreign
    raw = job(GANG)
    result, status, actions, events = run(raw, observed(raw, [], pod_group=view))
    assert not any("PodGroup" in a for a in actions) and not [a for a in actions if "worker" in a]
    held = condition(status)
    assert (held["status"], held["reason"]) == ("False", "NotOwned") and ("NotOwned", view.foreign) in events
    suspended = job({**GANG, "spec.suspend": True}, status=running_status())
    _, _, actions, _ = run(suspended, observed(suspended, [], with_store=False, pod_group=view))
    assert not any("delete PodGroup" in a for a in actions)  # a suspended job gives back only its own


def test_the_pod_group_is_deleted_only_if_it_is_still_the_one_read():
    ours = {"metadata": {"name": "tiny-elastic", "uid": "pg-9", "ownerReferences": [{"kind": "LLMTrainJob", "uid": "uid-1"}]},
            "spec": {"minMember": 2}}
    raw = job({**GANG, "spec.suspend": True}, status=running_status())
    result = plan(raw, observed(raw, [], with_store=False, pod_group=pod_group_view(ours, owner_uid="uid-1")), NOW)
    delete = next(a for a in result.actions if isinstance(a, DeleteObject))
    assert delete.uid == "pg-9"
