"""torchrun never restarts a worker group in place for a permanent exit
(``torchrun_agent.stop_on_permanent_exit``): the patched monitor stops the agent's restarts."""

from __future__ import annotations

from types import SimpleNamespace

from llmtrain_contract.exitcodes import ExitCode, FailureClass, classify_exit
from llmtrain_contract.names import Env
from llmtrain_trainer.launch import torchrun_agent
from torch.distributed.elastic.agent.server.api import WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent


def test_the_agent_spells_the_variable_as_the_contract_does():
    assert torchrun_agent.PERMANENT_EXIT_CODES == Env.PERMANENT_EXIT_CODES
    assert torchrun_agent.permanent_codes("64, 65,x,86") == frozenset({64, 65, 86})


def test_a_permanent_exit_leaves_no_restart_and_a_retryable_one_keeps_them(monkeypatch):
    results = {}

    def monitor(self, group):
        return results["next"]

    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", monitor)
    permanent = frozenset(int(c) for c in ExitCode if classify_exit(c).failure_class == FailureClass.PERMANENT)
    assert ExitCode.STORAGE_FULL in permanent and ExitCode.HANG not in permanent
    assert torchrun_agent.stop_on_permanent_exit(permanent)
    agent = SimpleNamespace(_remaining_restarts=3)
    results["next"] = SimpleNamespace(state=WorkerState.FAILED, failures={0: SimpleNamespace(exitcode=int(ExitCode.HANG))})
    LocalElasticAgent._monitor_workers(agent, None)
    assert agent._remaining_restarts == 3
    results["next"] = SimpleNamespace(state=WorkerState.FAILED, failures={1: SimpleNamespace(exitcode=int(ExitCode.STORAGE_FULL))})
    LocalElasticAgent._monitor_workers(agent, None)
    assert agent._remaining_restarts == 0
