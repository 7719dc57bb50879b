"""Kueue in the planner: a queued job's Workload, suspension until it is admitted, the
flavors' placement on its pods, eviction (pods stopped, then the quota given back), the
Finished condition, and a cluster without Kueue."""

from __future__ import annotations

from llmtrain_operator.api.observed import WorkloadView, assigned_flavors, workload_view
from llmtrain_operator.planner import CreateObject, PatchStatus, plan
from support.planning import NOW, ago, job, observed, running_status, summary, worker

W0, W1 = "tiny-elastic-worker-0", "tiny-elastic-worker-1"
WL = "llmtrainjob-tiny-elastic"
QUEUED = {"metadata.labels": {"kueue.x-k8s.io/queue-name": "team-a"}}


def run(raw, obs):
    result = plan(raw, obs, NOW)
    return result, result.status, summary(result.actions), [(e.type, e.reason, e.message) for e in result.events]


def condition(status, type_):
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


def cond(type_, status, reason="R"):
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": ago(30)}


def admitted(flavors=(), evicted=False):
    obj = {"metadata": {"resourceVersion": "42"}, "status": {
        "admission": {"clusterQueue": "cq", "podSetAssignments": [{"name": "workers", "flavors": {"cpu": "spot"}, "count": 2},
                                                                  {"name": "rendezvous", "flavors": {"cpu": "spot"}, "count": 1}]},
        "conditions": [cond("QuotaReserved", "True"), cond("Admitted", "True")]
        + ([cond("Evicted", "True", "Preempted")] if evicted else [])}}
    return workload_view(obj, flavors=list(flavors))


SPOT = {"metadata": {"name": "spot"}, "spec": {"nodeLabels": {"instance": "spot"},
                                               "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]}}


def test_a_new_queued_job_creates_its_workload_and_stays_suspended_until_admitted():
    raw = job({**QUEUED, "spec.replicas": {"min": 1, "max": 2}})
    result, status, actions, events = run(raw, observed(raw, [], with_store=False, services=frozenset(), configmaps={},
                                                       workload=WorkloadView(served=True)))
    assert f"create Workload/{WL}" in actions and "suspend=true" in actions
    assert not [a for a in actions if a.startswith("create Pod/")], "nothing runs before Kueue admits it"
    wl = next(a.manifest for a in result.actions if isinstance(a, CreateObject) and a.kind == "Workload")
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta1" and wl["spec"]["queueName"] == "team-a"
    workers, store = wl["spec"]["podSets"]
    assert (workers["name"], workers["count"], workers["minCount"]) == ("workers", 2, 1), "partial admission down to replicas.min"
    assert (store["name"], store["count"]) == ("rendezvous", 1)
    container = workers["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}, "Kueue counts the pods' requests"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert status["phase"] == "Suspended"
    assert condition(status, "Admitted")["reason"] == "WaitingForAdmission"
    assert "waiting for Kueue to admit Workload" in condition(status, "Suspended")["message"]
    assert result.requeue_after is not None and result.requeue_after <= 5
    # Still waiting: nothing more to do (spec.suspend is already true).
    raw = job({**QUEUED, "spec.suspend": True}, status=status)
    _, _, actions, _ = run(raw, observed(raw, [], with_store=False, workload=workload_view({"status": {}})))
    assert actions == []


def test_an_admission_unsuspends_the_job_and_places_its_pods_on_the_flavors_nodes():
    raw = job({**QUEUED, "spec.suspend": True}, status={"phase": "Suspended", "conditions": [cond("Suspended", "True", "JobSuspended")]})
    result, status, actions, events = run(raw, observed(raw, [], with_store=False, workload=admitted([SPOT])))
    assert "suspend=false" in actions and f"create Pod/{W0}" in actions
    assert ("Normal", "AdmittedByKueue", f"Kueue admitted Workload {WL} to ClusterQueue cq") in events
    assert condition(status, "Admitted")["status"] == "True" and condition(status, "Suspended")["status"] == "False"
    for pod in (a.manifest for a in result.actions if isinstance(a, CreateObject) and a.kind == "Pod"):
        assert pod["spec"]["nodeSelector"]["instance"] == "spot"
        assert {"key": "spot", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_an_eviction_stops_the_pods_and_gives_the_quota_back_once_they_are_gone():
    raw = job(QUEUED, status=running_status(conditions=[cond("Admitted", "True", "AdmittedByKueue")]))
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1)], workload=admitted(evicted=True)))
    assert {f"delete {W0}", f"delete {W1}", "suspend=true"} <= set(actions)
    assert "patch-status Workload/" + WL not in actions, "the quota is held until the pods are gone"
    assert ("Warning", "EvictedByKueue") in [(t, r) for t, r, _ in events]
    assert status["phase"] == "Suspended" and condition(status, "Admitted")["reason"] == "EvictedByKueue"
    raw = job({**QUEUED, "spec.suspend": True}, status=status)
    result, _, actions, _ = run(raw, observed(raw, [], with_store=False, workload=admitted(evicted=True)))
    patch = next(a for a in result.actions if isinstance(a, PatchStatus))
    assert patch.resource_version == "42" and patch.status["admission"] is None
    reserved = next(c for c in patch.status["conditions"] if c["type"] == "QuotaReserved")
    assert reserved["status"] == "False" and reserved["reason"] == "Pending" and reserved["lastTransitionTime"] != ago(30)
    assert next(c for c in patch.status["conditions"] if c["type"] == "Evicted")["status"] == "True", "Kueue's own stays"


def test_a_finished_job_marks_its_workload_finished_once():
    raw = job(QUEUED, status={"phase": "Succeeded", "completionTime": ago(5)})
    result, _, _, _ = run(raw, observed(raw, [], with_store=False, workload=admitted()))
    patch = next(a for a in result.actions if isinstance(a, PatchStatus))
    finished = next(c for c in patch.status["conditions"] if c["type"] == "Finished")
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
    done = workload_view({"status": {"conditions": [cond("Finished", "True")]}})
    result, _, _, _ = run(raw, observed(raw, [], with_store=False, workload=done))
    assert not [a for a in result.actions if isinstance(a, PatchStatus)]


def test_without_kueue_the_label_is_reported_once_and_the_job_runs():
    raw = job(QUEUED)
    _, status, actions, events = run(raw, observed(raw, [], workload=WorkloadView(served=False)))
    assert f"create Pod/{W0}" in actions and "suspend=true" not in actions
    assert condition(status, "Admitted")["reason"] == "KueueAPIMissing"
    assert [r for _, r, _ in events].count("KueueAPIMissing") == 1
    raw["status"] = status
    _, _, _, events = run(raw, observed(raw, [worker(0), worker(1)], workload=WorkloadView(served=False)))
    assert "KueueAPIMissing" not in [r for _, r, _ in events]


def test_an_unqueued_job_ignores_workloads():
    raw = job(status=running_status())
    _, status, actions, _ = run(raw, observed(raw, [worker(0), worker(1)]))
    assert condition(status, "Admitted") is None and "suspend=true" not in actions


def test_a_workload_counts_as_admitted_only_with_its_admission_and_not_after_an_eviction():
    assert admitted().admitted and not admitted(evicted=True).admitted
    assert admitted(evicted=True).evicted == "Preempted" and admitted(evicted=True).reserved
    no_admission = workload_view({"status": {"conditions": [cond("Admitted", "True")]}})
    assert not no_admission.admitted
    assert assigned_flavors({"status": {"admission": {"podSetAssignments": [{"flavors": {"cpu": "a", "gpu": "b"}},
                                                                             {"flavors": {"cpu": "a"}}]}}}) == ["a", "b"]


def test_a_refused_read_keeps_a_queued_job_suspended_and_says_why():
    raw = job(QUEUED, status=running_status())
    words = f'read the Workload {WL} or its ResourceFlavors: workloads.kueue.x-k8s.io "{WL}" is forbidden'
    _, status, actions, events = run(raw, observed(raw, [worker(0), worker(1)], workload=WorkloadView(served=True, refused=words)))
    assert {f"delete {W0}", f"delete {W1}", "suspend=true"} <= set(actions), "the admission cannot be known"
    assert condition(status, "Admitted")["reason"] == "ReadRefused"
    assert ("Warning", "ReadRefused", words) in events


def test_a_workload_of_the_jobs_name_that_is_not_the_jobs_holds_the_job_and_says_why():
    theirs = {"metadata": {"name": WL, "ownerReferences": [{"kind": "LLMTrainJob", "uid": "someone-else"}]},
              "status": {"conditions": [{"type": "Admitted", "status": "True"}], "admission": {"clusterQueue": "cq"}}}
    view = workload_view(theirs, owner_uid="uid-1")
    assert not view.exists and not view.admitted and "not this job's" in view.foreign
    raw = job(QUEUED)
    result = plan(raw, observed(raw, [], workload=view), NOW)
    admitted_cond = condition(result.status, "Admitted")
    assert (admitted_cond["status"], admitted_cond["reason"]) == ("False", "NotOwned")
    assert not [a for a in summary(result.actions) if a.startswith("create Pod/") and "worker" in a]
    assert "NotOwned" in [e.reason for e in result.events]
