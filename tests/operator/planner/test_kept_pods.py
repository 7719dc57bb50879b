"""Failed worker pods kept for their logs (``faultTolerance.keepFailedPods``): a failed pod
is labelled kept instead of deleted, its slot gets a new pod under a new name with the
same host name, nothing acts on a kept pod again, and the oldest beyond the limit go."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from llmtrain_operator.api import parse_job
from llmtrain_operator.api.observed import LABEL_INCARNATION, LABEL_KEPT, pod_view
from llmtrain_operator.planner import KeepPod, plan
from llmtrain_operator.planner.manifests import kept_pod_patch, worker_pod
from support.planning import NOW, job, observed, running_status, summary, worker

W0, W1 = "tiny-elastic-worker-0", "tiny-elastic-worker-1"


def run(raw, obs, now=NOW):
    result = plan(raw, obs, now)
    return result, result.status, summary(result.actions), [e.reason for e in result.events]


def created_pods(result) -> dict[str, dict]:
    return {a.name: a.manifest for a in result.actions if getattr(a, "kind", None) == "Pod"}


def test_a_failed_pod_is_kept_with_its_uid_as_a_precondition_and_charged_once():
    raw = job(status=running_status())
    failed = worker(0, phase="Failed", exit_code=137, uid="uid-a")
    result, status, actions, _ = run(raw, observed(raw, [failed, worker(1)]))
    assert result.actions == [KeepPod(W0, "uid-a")] and status["restarts"] == 1
    # The keep did not reach the server: the next pass repeats it and charges nothing more.
    again, status, actions, _ = run({**raw, "status": status}, observed(raw, [failed, worker(1)]), NOW + timedelta(seconds=2))
    assert actions == [f"keep {W0}"] and status["restarts"] == 1


def test_the_slot_of_a_kept_pod_gets_a_new_pod_with_the_next_name_and_the_same_host():
    raw = job(status=running_status(restarts=1, keptPods=[W0]))
    kept = worker(0, phase="Failed", exit_code=137, kept=True, finished=NOW - timedelta(seconds=30))
    result, status, actions, events = run(raw, observed(raw, [kept, worker(1)]))
    pods = created_pods(result)
    assert list(pods) == [f"{W0}-1"] and status["restarts"] == 1
    pod = pods[f"{W0}-1"]
    assert pod["spec"]["hostname"] == W0 and pod["spec"]["subdomain"] == "tiny-elastic-workers"
    assert pod["metadata"]["labels"][LABEL_INCARNATION] == "1" and LABEL_KEPT not in pod["metadata"]["labels"]
    assert status["keptPods"] == [W0]
    # The next failure of that slot: its pod is kept too, and the one after is the third name.
    second = worker(0, phase="Failed", exit_code=137, incarnation=1, kept=True, finished=NOW - timedelta(seconds=5))
    raw = job(status=running_status(restarts=2, keptPods=[W0, f"{W0}-1"]))
    result, status, _, _ = run(raw, observed(raw, [kept, second, worker(1)]))
    assert list(created_pods(result)) == [f"{W0}-2"] and status["keptPods"] == [f"{W0}-1", W0]


def test_a_kept_pod_is_never_acted_on_again_whatever_it_says():
    """Not charged, not deleted for an older generation, not counted as a worker, not
    stopped when the job is suspended: it has ended and holds nothing."""
    raw = job(status=running_status(restarts=1, restartGeneration=2, keptPods=[W0]))
    kept = worker(0, phase="Failed", exit_code=80, generation=0, kept=True, termination={"code": 80, "reason": "Hang"})
    live = [worker(0, incarnation=1, generation=2), worker(1, generation=2)]
    _, status, actions, _ = run(raw, observed(raw, [kept, *live]))
    assert actions == [] and status["restarts"] == 1 and status["workers"] == "2/2"
    suspended = job({"spec.suspend": True}, status=running_status(restarts=1, restartGeneration=2, keptPods=[W0]))
    _, _, actions, _ = run(suspended, observed(suspended, [kept, *live]))
    assert sorted(a for a in actions if a.startswith("delete tiny-elastic-worker")) == [f"delete {W0}-1", f"delete {W1}"]


def test_beyond_the_limit_the_oldest_kept_pods_are_deleted_and_the_rest_listed_newest_first():
    raw = job({"spec.faultTolerance.keepFailedPods": 2},
              status=running_status(restarts=4, keptPods=[f"{W1}-1", f"{W0}-1", W1, W0]))
    kept = [worker(slot, phase="Failed", exit_code=1, incarnation=n, kept=True, finished=NOW - timedelta(minutes=10 - minute))
            for slot, n, minute in ((0, 0, 1), (1, 0, 2), (0, 1, 3), (1, 1, 4))]
    live = [worker(0, incarnation=2), worker(1, incarnation=2)]
    _, status, actions, _ = run(raw, observed(raw, [*kept, *live]))
    assert sorted(actions) == [f"delete {W0}", f"delete {W1}"]
    assert status["keptPods"] == [f"{W1}-1", f"{W0}-1"]
    # A kept pod already being deleted is neither listed nor deleted again.
    going = [worker(0, phase="Failed", exit_code=1, kept=True, deleting=True), *kept[2:]]
    _, status, actions, _ = run(raw, observed(raw, [*going, *live]))
    assert actions == [] and status["keptPods"] == [f"{W1}-1", f"{W0}-1"]


def test_a_job_that_keeps_no_failed_pods_deletes_them_and_reuses_the_first_name():
    raw = job({"spec.faultTolerance.keepFailedPods": 0}, status=running_status())
    _, status, actions, _ = run(raw, observed(raw, [worker(0, phase="Failed", exit_code=137), worker(1)]))
    assert actions == [f"delete {W0}"] and status["restarts"] == 1 and status.get("keptPods", []) == []
    result, _, _, _ = run({**raw, "status": status}, observed(raw, [worker(1)]), NOW + timedelta(minutes=5))
    assert list(created_pods(result)) == [W0]


def test_a_restart_all_keeps_only_the_failed_pod_and_a_succeeded_one_is_never_kept():
    raw = job({"spec.faultTolerance.restartPolicy": "RestartAll"}, status=running_status())
    _, _, actions, _ = run(raw, observed(raw, [worker(0, phase="Failed", exit_code=1), worker(1, incarnation=3)]))
    assert sorted(actions) == [f"delete {W1}-3", f"keep {W0}"]
    # A finished job's pods stay as they are (for their logs), none labelled kept; with the
    # label set by hand, a succeeded pod still counts: the job completes.
    labelled = worker_pod(parse_job(raw), 1, 0)
    labelled["metadata"]["labels"][LABEL_KEPT] = "true"
    labelled["status"] = {"phase": "Succeeded", "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 0}}}]}
    done = [worker(0, phase="Succeeded", exit_code=0), pod_view(labelled)]
    assert not done[1].kept
    _, status, actions, _ = run(raw, observed(raw, done))
    assert status["phase"] == "Succeeded" and not any(a.startswith("keep") for a in actions)


def test_a_pod_labelled_kept_by_someone_else_before_its_charge_is_charged_all_the_same():
    """Neither charged nor listed in status.keptPods: not this operator's keep. Judged as
    any failed pod (charged once), listed from the next pass on, never charged again."""
    raw = job(status=running_status())
    forged = worker(0, phase="Failed", exit_code=137, kept=True, uid="uid-f")
    first = plan(raw, observed(raw, [forged, worker(1)]), NOW)
    assert first.status["restarts"] == 1 and first.status.get("keptPods", []) == []
    later = {**raw, "status": first.status}
    second = plan(later, observed(later, [forged, worker(1)]), NOW + timedelta(seconds=5))
    assert second.status["restarts"] == 1 and second.status["keptPods"] == [W0]
    third = plan({**raw, "status": second.status}, observed(raw, [forged, worker(1)]), NOW + timedelta(seconds=9))
    assert third.status["restarts"] == 1 and third.status["keptPods"] == [W0]


def test_a_new_pod_never_takes_a_name_a_pod_with_a_changed_incarnation_label_holds():
    raw = job(status=running_status(restarts=1, keptPods=[f"{W0}-1"]))
    relabelled = dataclasses.replace(worker(0, phase="Failed", exit_code=1, incarnation=1, kept=True), incarnation=0)
    result, _, _, _ = run(raw, observed(raw, [relabelled, worker(1)]))
    assert list(created_pods(result)) == [f"{W0}-2"]


def test_the_kept_label_on_a_pod_that_has_not_ended_is_refused_and_the_pod_stays_a_worker():
    """A label anyone with pod patch rights can set: a running pod cannot be hidden from
    the operator by it (its slot would get a second live pod under one host name)."""
    raw = job(status=running_status())
    manifest = worker_pod(parse_job(raw), 0, 0)
    manifest["metadata"]["labels"][LABEL_KEPT] = "true"
    manifest["status"] = {"phase": "Running"}
    view = pod_view(manifest)
    assert not view.kept and any("llmtrain.io/kept" in r and "not failed" in r for r in view.rejected)
    _, status, actions, events = run(raw, observed(raw, [view, worker(1)]))
    assert not any(a.startswith("create Pod/") for a in actions) and "UnusablePodValue" in events
    # A forged incarnation is refused too, and read as 0.
    for forged in ("-3", str(10**7)):
        manifest["metadata"]["labels"] = {**manifest["metadata"]["labels"], LABEL_INCARNATION: forged}
        view = pod_view(manifest)
        assert view.incarnation == 0 and any(LABEL_INCARNATION in r for r in view.rejected)


def test_the_keep_patch_marks_the_pod_and_takes_it_out_of_its_gang():
    raw = job({"spec.scheduling": {"gang": {"minAvailable": 2}}})
    manifest = worker_pod(parse_job(raw), 0, 0)
    gang_labels = {k for k in manifest["metadata"]["labels"] if k.startswith("scheduling.")}
    gang_annotations = {k for k in manifest["metadata"]["annotations"] if k.startswith("scheduling.")}
    patch = kept_pod_patch("uid-9")
    assert patch["metadata"]["uid"] == "uid-9" and patch["metadata"]["labels"][LABEL_KEPT] == "true"
    assert gang_labels and all(patch["metadata"]["labels"].get(k, "absent") is None for k in gang_labels)
    assert gang_annotations and all(patch["metadata"]["annotations"].get(k, "absent") is None for k in gang_annotations)
    assert "uid" not in kept_pod_patch()["metadata"]


def test_the_scale_selector_leaves_kept_pods_out():
    raw = job(status=running_status())
    _, status, _, _ = run(raw, observed(raw, [worker(0), worker(1)]))
    assert status["selector"].endswith(",!llmtrain.io/kept")
