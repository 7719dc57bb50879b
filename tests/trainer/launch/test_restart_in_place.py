"""The agent's side of in-process healing (``torchrun_agent.restart_in_place``), with
torch's classes patched as the agent patches them and a real TCPStore: a rank's own
failure is counted in the store for every rank of the node's group as soon as the poll
sees it, before torch stops the group's other ranks; the group then restarts in place,
counted once, even when a stopped rank ended as a victim. No count for a restart the
agent will not make (no budget left, a permanent exit) or for a group whose first failure
was a victim's, which restarts through a rendezvous."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from llmtrain_contract.exitcodes import ExitCode
from llmtrain_trainer.launch import torchrun_agent
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SubprocessContext

VICTIM = int(ExitCode.COLLECTIVE_TIMEOUT)
PERMANENT = int(ExitCode.STORAGE_FULL)


class Patched:
    """torch's agent with the patch on stubs: the monitor polls a fake process context,
    as torch's does (``wait(0)`` calls ``_poll``), and reports ``result``."""

    def __init__(self, monkeypatch, store_port: int):
        self.polled: list[str] = []
        self.rendezvous: list[object] = []
        self.result: object = None
        for cls, name in ((LocalElasticAgent, "_monitor_workers"), (SimpleElasticAgent, "_restart_workers"),
                          (SubprocessContext, "_poll")):
            monkeypatch.setattr(cls, name, getattr(cls, name))  # undone after the test: the patch replaces them
        monkeypatch.setattr(SubprocessContext, "_poll", lambda ctx: self.polled.append("torch") or None)
        monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda agent, group: SubprocessContext._poll(agent.pcontext)
                            or self.result)
        monkeypatch.setattr(SimpleElasticAgent, "_restart_workers", lambda agent, group: self.rendezvous.append(group))
        assert torchrun_agent.restart_in_place(f"127.0.0.1:{store_port}/run", frozenset({VICTIM}), frozenset({PERMANENT}))

    def monitor(self, agent, group, codes: list[int | None], result) -> None:
        agent.pcontext = SimpleNamespace(
            subprocess_handlers={i: SimpleNamespace(proc=SimpleNamespace(poll=lambda c=c: c)) for i, c in enumerate(codes)},
            _running_local_ranks=set(range(len(codes))))
        self.result = result
        LocalElasticAgent._monitor_workers(agent, group)


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))


def _group():
    workers = [SimpleNamespace(global_rank=r, world_size=4, id=None) for r in (2, 3)]
    return SimpleNamespace(workers=workers, master_addr="10.0.0.1", master_port=29500, state=None)


def _agent(budget: int = 3):
    started = []
    agent = SimpleNamespace(_remaining_restarts=budget, started=started)
    agent._stop_workers = lambda group: started.append("stopped")
    agent._start_workers = lambda group: started.append("started") or {i: 100 + i for i in range(len(group.workers))}
    return agent


def _count(store, rank: int) -> int:
    return int(store.add(f"llmtrain/heal/run/10.0.0.1:29500/4/restarting/{rank}", 0))


def _failed(*codes: int):
    return SimpleNamespace(state=WorkerState.FAILED, failures={i: SimpleNamespace(exitcode=c) for i, c in enumerate(codes)})


def test_a_ranks_own_failure_is_counted_for_the_whole_group_before_torch_stops_it(monkeypatch, store):
    patched, agent, group = Patched(monkeypatch, store.port), _agent(), _group()
    patched.monitor(agent, group, [None, -9], result=None)  # rank 3 killed, rank 2 still running
    assert (_count(store, 2), _count(store, 3)) == (1, 1) and patched.polled == ["torch"]
    # torch's poll then stopped rank 2, which gave up its round and ended as a victim: the
    # group's failure is still its own, restarted in place and counted once.
    patched.monitor(agent, group, [None, None], result=_failed(VICTIM, -9))
    SimpleElasticAgent._restart_workers(agent, group)
    assert agent.started == ["stopped", "started"] and group.state == WorkerState.HEALTHY and patched.rendezvous == []
    assert (_count(store, 2), _count(store, 3)) == (1, 1)


@pytest.mark.parametrize(("budget", "codes"), [(0, [None, -9]), (3, [None, PERMANENT]), (3, [VICTIM, None])])
def test_no_count_for_a_restart_the_agent_will_not_make_in_place(monkeypatch, store, budget, codes):
    patched, agent, group = Patched(monkeypatch, store.port), _agent(budget), _group()
    patched.monitor(agent, group, codes, result=None)
    assert (_count(store, 2), _count(store, 3)) == (0, 0)
    if codes[0] == VICTIM:  # a victim first: restarted as torch does, through a rendezvous
        patched.monitor(agent, group, [None, None], result=_failed(VICTIM))
        SimpleElasticAgent._restart_workers(agent, group)
        assert patched.rendezvous == [group] and agent.started == [] and _count(store, 2) == 0


def test_a_single_ranks_crash_is_counted_once(monkeypatch, store):
    patched, agent = Patched(monkeypatch, store.port), _agent()
    group = SimpleNamespace(workers=[SimpleNamespace(global_rank=1, world_size=4, id=None)], master_addr="10.0.0.1",
                            master_port=29500, state=None)
    patched.monitor(agent, group, [-9], result=_failed(-9))
    SimpleElasticAgent._restart_workers(agent, group)
    assert _count(store, 1) == 1 and agent.started == ["stopped", "started"]
