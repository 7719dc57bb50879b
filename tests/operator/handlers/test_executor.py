"""The executor (handlers/executor.py): one applier per planner action type, each in the
round it belongs to; an action without one writes nothing at all, least of all a delete
of the job."""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import get_args

import pytest
from llmtrain_operator.handlers.executor import APPLIERS, Round, UnknownAction, describe, write
from llmtrain_operator.planner import (Action, CreateObject, DeleteJob, DeleteObject, DeletePod, KeepPod, PatchStatus, Plan, ReplaceObject,
                                       SetSuspend, UpdateSpec)
from support.planning import job

from .test_contract import NAME, NS, one_pass, put_job, requests_since, stored_job, writes

# The package re-exports a function named `reconcile`, which hides the submodule attribute.
reconcile_module = importlib.import_module("llmtrain_operator.handlers.reconcile")

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tiny-elastic-worker-0", "namespace": NS}}
GROUP = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": NAME}, "spec": {"minMember": 2}}
CONFIG = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tiny-elastic-config", "namespace": NS}}


@dataclass(frozen=True)
class Reshard:
    """An action type the planner might grow, which the executor does not know."""

    pod: str


def test_the_map_has_exactly_one_applier_for_every_member_of_the_action_union():
    assert set(APPLIERS) == set(get_args(Action))


# Each action type, how it reads in the log, and its round: creates and the writes that need
# no order go with the status patch; deletes and the job's own spec.suspend only after it.
TABLE = [
    (CreateObject(POD), "create Pod tiny-elastic-worker-0", Round.WITH_STATUS),
    (ReplaceObject(CONFIG), "replace ConfigMap tiny-elastic-config", Round.WITH_STATUS),
    (UpdateSpec(GROUP), "update PodGroup tiny-elastic", Round.WITH_STATUS),
    (PatchStatus("kueue.x-k8s.io/v1beta1", "Workload", "llmtrainjob-tiny-elastic", {"admission": None}, "42"),
     "patch the status of Workload llmtrainjob-tiny-elastic", Round.WITH_STATUS),
    (SetSuspend(True), "set spec.suspend=true", Round.AFTER_STATUS),
    (DeletePod("tiny-elastic-worker-1"), "delete Pod tiny-elastic-worker-1", Round.AFTER_STATUS),
    (DeletePod("tiny-elastic-worker-1", grace_seconds=0, force=True), "force-delete Pod tiny-elastic-worker-1", Round.AFTER_STATUS),
    (KeepPod("tiny-elastic-worker-1", "uid-1"), "keep Pod tiny-elastic-worker-1 for its log", Round.AFTER_STATUS),
    (DeleteObject("scheduling.x-k8s.io/v1alpha1", "PodGroup", NAME), "delete PodGroup tiny-elastic", Round.AFTER_STATUS),
    (DeleteJob("ttlSecondsAfterFinished"), "delete the job (ttlSecondsAfterFinished)", Round.AFTER_STATUS),
]


def test_the_table_covers_every_action_type():
    assert {type(action) for action, _, _ in TABLE} == set(get_args(Action))


@pytest.mark.parametrize(("action", "words", "round_"), TABLE, ids=[type(a).__name__ for a, _, _ in TABLE])
def test_each_action_type_is_described_and_goes_out_in_its_round(action, words, round_):
    assert describe(action) == words
    assert APPLIERS[type(action)].round is round_


def test_an_unknown_action_is_an_error_that_names_its_type():
    with pytest.raises(UnknownAction, match=r"test_executor\.Reshard") as raised:
        describe(Reshard("tiny-elastic-worker-0"))
    assert raised.value.action_type is Reshard


async def test_an_unknown_action_raises_before_any_request_and_nothing_at_all_is_sent(api, k8s):
    put_job(api, job())
    body, before = stored_job(api), len(api)
    actions = [CreateObject(copy.deepcopy(POD)), Reshard("tiny-elastic-worker-0"), DeletePod("tiny-elastic-worker-1"),
               DeleteJob("ttlSecondsAfterFinished")]
    with pytest.raises(UnknownAction, match="Reshard"):
        await write(k8s, body, actions, {"phase": "Running"})
    assert requests_since(api, before) == [], "not the create, not the status patch, not a delete"
    assert stored_job(api)["metadata"]["name"] == NAME, "the job is still there"


async def test_a_pass_whose_plan_holds_an_unknown_action_writes_nothing_and_never_deletes_the_job(api, k8s, monkeypatch):
    put_job(api, job())
    real = reconcile_module.plan_received

    def with_an_unknown_action(*args, **kwargs) -> Plan:
        planned = real(*args, **kwargs)  # a new job's: its children are created in this pass
        planned.actions.insert(1, Reshard("tiny-elastic-worker-0"))
        planned.actions.append(DeleteJob("ttlSecondsAfterFinished"))
        return planned

    monkeypatch.setattr(reconcile_module, "plan_received", with_an_unknown_action)
    before = len(api)
    with pytest.raises(UnknownAction, match="Reshard"):
        await one_pass(api, k8s)
    assert writes(requests_since(api, before)) == [], "no create, no status patch, no Event, no delete"
    assert stored_job(api).get("status") is None
