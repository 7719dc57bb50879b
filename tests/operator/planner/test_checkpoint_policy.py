"""The planner's checkpoint policy: tier health into a condition and Events (the cause
named, once per change), the interval in force, and the failure history an adaptive
interval is chosen from, shared with the trainers through the job's ConfigMap."""

from __future__ import annotations

import json
from datetime import timedelta

from llmtrain_contract.cadence import CADENCE_FILE
from llmtrain_operator.api.observed import ConfigMapView, TrainerProbe
from llmtrain_operator.planner import ReplaceObject, plan
from support.planning import NOW, job, observed, running_status, worker

W0, W1 = "tiny-elastic-worker-0", "tiny-elastic-worker-1"
S3 = {"spec.checkpoint.s3": {"bucket": "ckpt", "credentialsSecret": {"name": "s3"}}}


def condition(status, kind="CheckpointsDegraded"):
    return next((c for c in status["conditions"] if c["type"] == kind), None)


def test_a_degraded_tier_becomes_a_condition_naming_tier_and_cause_with_one_event_per_change():
    raw = job(S3, status=running_status())
    probes = {W0: TrainerProbe(step=20, tier_degraded={"s3": "CredentialsRefused"}, last_checkpoint={"local": 20}),
              W1: TrainerProbe(step=20, tier_degraded={"s3": "CredentialsRefused"})}
    first = plan(raw, observed(raw, [worker(0), worker(1)], probes=probes), NOW)
    cond = condition(first.status)
    assert (cond["status"], cond["reason"]) == ("True", "S3CredentialsRefused")
    assert "s3 tier: the credentials were refused (check the credentials Secret)" in cond["message"]
    assert [e.reason for e in first.events if e.reason.startswith("CheckpointTier")] == ["CheckpointTierDegraded"]
    tiers = {t["name"]: t for t in first.status["checkpointTiers"]}
    assert tiers["s3"]["pods"] == [W0, W1] and tiers["local"] == {"name": "local", "healthy": True, "pods": [], "lastStep": 20}

    again = plan({**raw, "status": first.status}, observed(raw, [worker(0), worker(1)], probes=probes), NOW + timedelta(seconds=5))
    assert not [e for e in again.events if e.reason.startswith("CheckpointTier")], "no repeat while nothing changes"
    assert condition(again.status)["lastTransitionTime"] == cond["lastTransitionTime"]

    healthy = {W0: TrainerProbe(step=30, last_checkpoint={"local": 30, "s3": 30}), W1: TrainerProbe(step=30)}
    fixed = plan({**raw, "status": again.status}, observed(raw, [worker(0), worker(1)], probes=healthy), NOW + timedelta(seconds=10))
    assert (condition(fixed.status)["status"], condition(fixed.status)["reason"]) == ("False", "TiersHealthy")
    recovered = [e for e in fixed.events if e.reason == "CheckpointTierRecovered"]
    assert len(recovered) == 1 and "s3 tier works again; newest step there 30" in recovered[0].message


def test_a_node_local_tier_degraded_on_one_node_names_that_pod():
    raw = job(status=running_status())
    probes = {W0: TrainerProbe(step=20), W1: TrainerProbe(step=20, tier_degraded={"local": "NoSpace"})}
    result = plan(raw, observed(raw, [worker(0), worker(1)], probes=probes), NOW)
    cond = condition(result.status)
    assert cond["reason"] == "LocalNoSpace" and f"(reported by {W1})" in cond["message"]


def test_without_reports_the_last_known_health_is_kept():
    raw = job(S3, status=running_status())
    probes = {W0: TrainerProbe(step=20, tier_degraded={"s3": "Unreachable"})}
    first = plan(raw, observed(raw, [worker(0), worker(1)], probes=probes), NOW)
    quiet = plan({**raw, "status": first.status}, observed(raw, [worker(0), worker(1)], probes={}), NOW + timedelta(seconds=5))
    assert condition(quiet.status)["reason"] == "S3Unreachable"


AUTO = {"spec.checkpoint.intervalSteps": "auto", "spec.checkpoint.auto": {"initialSteps": 10, "mtbfPriorSeconds": 600}}


def _configmap_replaced(result):
    replaced = [a.manifest for a in result.actions if isinstance(a, ReplaceObject) and a.manifest["kind"] == "ConfigMap"]
    return replaced[0] if replaced else None


def test_auto_cadence_shares_the_failure_history_through_the_configmap_only_when_it_changes():
    raw = job(AUTO, status=running_status(activeSeconds=300.0))
    probes = {W0: TrainerProbe(step=20, interval_steps=10), W1: TrainerProbe(step=20, interval_steps=10)}
    first = plan(raw, observed(raw, [worker(0), worker(1)], probes=probes), NOW)
    cm = _configmap_replaced(first)
    assert cm is not None and cm["metadata"]["annotations"]["llmtrain.io/cadence-failures"] == "0"
    history = json.loads(cm["data"][CADENCE_FILE])
    assert history["failures"] == 0 and history["time"] == NOW.timestamp()
    assert history["activeSeconds"] == first.status["activeSeconds"], "active time as of this pass"
    assert first.status["checkpointCadence"]["mode"] == "auto"

    shared = ConfigMapView(cm["metadata"]["annotations"]["llmtrain.io/config-hash"], "0")
    obs = observed(raw, [worker(0), worker(1)], probes=probes, configmaps={cm["metadata"]["name"]: shared})
    again = plan({**raw, "status": first.status}, obs, NOW + timedelta(seconds=30))
    assert _configmap_replaced(again) is None, "the same count: nothing to share"

    failed = {**again.status, "restarts": 1, "disruptions": 1}
    after = plan({**raw, "status": failed}, obs, NOW + timedelta(seconds=60))
    cm = _configmap_replaced(after)
    assert cm is not None and json.loads(cm["data"][CADENCE_FILE])["failures"] == 2
    assert not [e for e in after.events if e.reason == "ConfigUpdated"], "a history update is not a config change"


def test_an_interval_chosen_anew_is_an_event_with_its_inputs():
    raw = job(AUTO, status=running_status())
    before = {W0: TrainerProbe(step=20, interval_steps=40, cost_seconds=0.5, mtbf_seconds=900.0)}
    first = plan(raw, observed(raw, [worker(0)], probes=before), NOW)
    after = {W0: TrainerProbe(step=40, interval_steps=20, cost_seconds=0.5, latency_seconds=1.25, mtbf_seconds=300.0,
                              step_seconds=0.87)}
    second = plan({**raw, "status": first.status}, observed(raw, [worker(0)], probes=after), NOW + timedelta(seconds=5))
    changed = [e for e in second.events if e.reason == "CheckpointIntervalChanged"]
    assert len(changed) == 1 and changed[0].message == ("checkpoint interval 40 -> 20 steps: "
                                                        "sqrt(2 x cost 0.5s x MTBF 300s) at 0.87s a step, a write taking 1.25s")
    cadence = second.status["checkpointCadence"]
    assert (cadence["intervalSteps"], cadence["costSeconds"], cadence["mtbfSeconds"], cadence["stepSeconds"]) == (20, 0.5, 300.0, 0.87)
    assert cadence["latencySeconds"] == 1.25


def test_the_interval_shown_is_the_one_its_inputs_chose_not_a_restarted_pods_initial_one():
    # A pod whose trainer just restarted reports the initial interval until the next step's
    # agreement; the status pairs the inputs with the interval rank 0 chose from them.
    raw = job(AUTO, status=running_status())
    probes = {W0: TrainerProbe(step=40, interval_steps=6, cost_seconds=0.2, mtbf_seconds=180.0, step_seconds=1.4),
              W1: TrainerProbe(step=40, interval_steps=10)}
    cadence = plan(raw, observed(raw, [worker(0), worker(1)], probes=probes), NOW).status["checkpointCadence"]
    assert (cadence["intervalSteps"], cadence["costSeconds"], cadence["mtbfSeconds"], cadence["stepSeconds"]) == (6, 0.2, 180.0, 1.4)
    # A cost under a millisecond keeps its digits.
    probes = {W0: TrainerProbe(step=40, interval_steps=6, cost_seconds=0.000123456, mtbf_seconds=180.0, step_seconds=1.4)}
    cadence = plan(raw, observed(raw, [worker(0)], probes=probes), NOW).status["checkpointCadence"]
    assert cadence["costSeconds"] == 0.0001235
    # Before rank 0 has chosen, the largest reported (a lagging pod reports less).
    probes = {W0: TrainerProbe(step=4, interval_steps=10), W1: TrainerProbe(step=4, interval_steps=8)}
    cadence = plan(raw, observed(raw, [worker(0), worker(1)], probes=probes), NOW).status["checkpointCadence"]
    assert cadence["intervalSteps"] == 10 and "costSeconds" not in cadence


def test_a_fixed_interval_has_no_history_and_no_cadence_file():
    raw = job(status=running_status())
    result = plan(raw, observed(raw, [worker(0), worker(1)], probes={W0: TrainerProbe(step=20, interval_steps=10)}), NOW)
    cadence = result.status["checkpointCadence"]
    assert cadence == {"mode": "fixed", "intervalSteps": 10}
    assert _configmap_replaced(result) is None


def test_the_final_checkpoint_reported_in_the_termination_messages_reaches_the_status_of_a_finished_job():
    raw = job(S3, status=running_status())
    before = plan(raw, observed(raw, [worker(0), worker(1)], probes={W0: TrainerProbe(step=30, last_checkpoint={"local": 30, "s3": 30})}),
                  NOW)
    done = [worker(i, phase="Succeeded", exit_code=0, termination={"code": 0, "reason": "Completed", "checkpoints": c})
            for i, c in enumerate([{"local": 40, "s3": 40}, {"local": 40}])]
    finished = plan({**raw, "status": before.status}, observed(raw, done, probes={}), NOW + timedelta(seconds=5))
    assert finished.status["phase"] == "Succeeded"
    assert {t["name"]: t["lastStep"] for t in finished.status["checkpointTiers"]} == {"local": 40, "s3": 40}
