"""The agent's side of healing a lost node (``torchrun_agent.take_offered_seats``), with
torch's rendezvous stubbed and a real TCPStore: every agent records its seat after a
rendezvous, in the keys the ranks read; a new agent takes a seat the survivors offer
(its group rank, its ranks' numbers and torchrun's fields, the lost agent's store), counts
its ranks' restarts and skips the rendezvous, but only once torchrun's round has dropped
the seat's agent; a forged seat, a withdrawn offer or none at all leave the rendezvous to
torch."""

from __future__ import annotations

import datetime
import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from llmtrain_trainer.launch import torchrun_agent
from llmtrain_trainer.train.healround import OPEN, TAKEN, WITHDRAWN, Seat
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

PREFIX = "llmtrain/heal/run/10.0.0.1:29500/2"
"""The heal rounds' keys of a world of two."""


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))


class Holder:
    """torch's state holder, for one process: ``sync`` writes a dirty state (no other agent
    writes between two syncs here) and says so, as torch's does."""

    def __init__(self, state):
        self.state, self.dirty, self.writes = state, False, 0

    def mark_dirty(self) -> None:
        self.dirty = True

    def sync(self) -> bool | None:
        if not self.dirty:
            return None
        self.dirty, self.writes = False, self.writes + 1
        return True


class Node:
    """An agent's process: its rendezvous handler (torch's state stubbed), its worker group."""

    def __init__(self, store, name: str, state, min_nodes: int):
        self.desc = _NodeDesc(name, 10, 0)  # torch's own node descriptor
        self.beating = False
        self.handler = SimpleNamespace(_state_holder=Holder(state), _settings=SimpleNamespace(min_nodes=min_nodes, run_id="job"),
                                       _store=store, _this_node=self.desc, _start_heartbeats=self._beat)
        self.group = SimpleNamespace(spec=SimpleNamespace(rdzv_handler=self.handler, local_world_size=1), workers=[],
                                     store=None, group_rank=None, group_world_size=None, master_addr=None, master_port=None)
        self.agent = SimpleNamespace()

    def _beat(self) -> None:
        self.beating = True


NAMES = ("node-a", "node-b", "node-c")


def _torch_rendezvous(calls: list, size: int):
    """What torch's ``_rendezvous`` does, for a world of ``size`` one-rank nodes, by name."""
    def rendezvous(agent, group):
        calls.append(group)
        addr = group.spec.rdzv_handler._this_node.addr
        rank = NAMES.index(addr) if addr in NAMES else 0  # a newcomer's: only the call matters here
        group.workers = [SimpleNamespace(local_rank=0, global_rank=rank, role_rank=rank, world_size=size, role_world_size=size)]
        group.group_rank, group.group_world_size, group.master_addr, group.master_port = rank, size, "10.0.0.1", 29500
    return rendezvous


def _world(monkeypatch, store, size: int = 2, min_nodes: int | None = None):
    """``size`` nodes through torch's rendezvous (each its own patched agent process)."""
    calls: list = []
    state = SimpleNamespace(complete=True, closed=False, round=3, participants={}, last_heartbeats={})
    nodes = {name: Node(store, name, state, min_nodes or size) for name in NAMES[:size]}
    for rank, node in enumerate(nodes.values()):  # torch's round completes with all of them
        state.participants[node.desc] = rank
    for node in nodes.values():
        monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", _torch_rendezvous(calls, size))
        assert torchrun_agent.take_offered_seats(f"127.0.0.1:{store.port}/run")
        SimpleElasticAgent._rendezvous(node.agent, node.group)
    return SimpleNamespace(store=store, state=state, nodes=nodes, calls=calls, monkeypatch=monkeypatch, size=size,
                           prefix=f"llmtrain/heal/run/10.0.0.1:29500/{size}", min_nodes=min_nodes or size)


@pytest.fixture
def world(monkeypatch, store):
    return _world(monkeypatch, store)


def _newcomer(world, name: str = "node-x") -> Node:
    """A new agent process, started after the world formed."""
    world.monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", _torch_rendezvous(world.calls, world.size))
    assert torchrun_agent.take_offered_seats(f"127.0.0.1:{world.store.port}/run")
    return Node(world.store, name, world.state, world.min_nodes)


def _seat(world, group: int) -> Seat:
    return Seat.decode(world.store.get(f"{world.prefix}/seat/{group}"), f"seat/{group}")


def _offer(world, group: int) -> Seat:
    seat = _seat(world, group)
    world.store.compare_set(f"{world.prefix}/{seat.claim}", "", OPEN)
    return seat


def _lose(world, name: str) -> Seat:
    """``name``'s agent dropped from torchrun's round (its lease ended); a survivor offers its seat."""
    del world.state.participants[world.nodes[name].desc]
    return _offer(world, NAMES.index(name))


def test_each_agent_records_its_seat_where_the_ranks_read_it(world):
    seats = [_seat(world, g) for g in (0, 1)]
    assert [(s.group, s.ranks, s.groups, s.min_groups) for s in seats] == [(0, (0,), 2, 2), (1, (1,), 2, 2)]
    assert seats[0].holder != seats[1].holder
    assert json.loads(world.store.get(torchrun_agent.current_key("run"))) == {"prefix": PREFIX, "groups": 2, "min_groups": 2}
    assert len(world.calls) == 2


def test_a_new_agent_takes_an_offered_seat_of_a_dropped_agent_instead_of_the_rendezvous(world):
    lost = _lose(world, "node-b")
    node = _newcomer(world)
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 2  # no rendezvous for it
    group = node.group
    assert (group.group_rank, group.group_world_size, group.master_addr, group.master_port) == (1, 2, "10.0.0.1", 29500)
    assert [(w.local_rank, w.global_rank, w.role_rank, w.world_size, w.role_world_size) for w in group.workers] == [(0, 1, 1, 2, 2)]
    # It is in torchrun's round now, in the lost agent's place, and beats as any participant.
    assert world.state.participants[node.desc] == 1 and node.desc in world.state.last_heartbeats and node.beating
    # torch's exit barrier counts the agents in the lost agent's store (its round's prefix).
    group.store.set("probe", "1")
    assert world.store.get("torch.rendezvous.job.3/probe") == b"1" and node.agent._store is group.store
    # Its rank's restart is counted where the survivors read it; the offer is taken; the
    # seat is now the new agent's, so that its loss is offered afresh.
    assert int(world.store.add(f"{PREFIX}/restarting/1", 0)) == 1
    assert world.store.get(f"{PREFIX}/{lost.claim}").decode().startswith(TAKEN)
    now = _seat(world, 1)
    assert now.holder != lost.holder and now.ranks == (1,)
    # Its seat, offered now (a late count of a crash of its rank), is not taken: it holds it.
    _offer(world, 1)
    other = _newcomer(world, "node-d")
    began = time.monotonic()
    SimpleElasticAgent._rendezvous(other.agent, other.group)
    assert len(world.calls) == 3 and time.monotonic() - began < 1  # the rendezvous at once: no agent missing


def test_a_live_agent_s_offered_seat_is_not_taken_while_another_agent_is_missing(monkeypatch, store):
    # Three nodes: node-c dropped; node-b's seat offered while its agent counted a crash.
    world = _world(monkeypatch, store, size=3)
    del world.state.participants[world.nodes["node-c"].desc]
    live = _offer(world, 1)
    monkeypatch.setattr(torchrun_agent, "OFFER_WAIT_SECONDS", 0.3)
    node = _newcomer(world)
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 4 and store.get(f"{world.prefix}/{live.claim}") == OPEN.encode()
    lost = _offer(world, 2)  # node-c's, offered: the next newcomer takes that one
    node = _newcomer(world, "node-y")
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 4 and node.group.group_rank == 2
    assert store.get(f"{world.prefix}/{lost.claim}").decode().startswith(TAKEN)


def test_a_seat_whose_agent_is_still_in_the_round_is_not_taken(world):
    # Offered while the agent was still counting its crashed rank's restart: not a lost node.
    seat = _offer(world, 1)
    node = _newcomer(world)
    began = time.monotonic()
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 3 and time.monotonic() - began < 1  # no wait: no agent is missing
    assert world.store.get(f"{PREFIX}/{seat.claim}") == OPEN.encode()


@pytest.mark.parametrize("claim", [WITHDRAWN, TAKEN + "node-x/1/1"])
def test_a_withdrawn_or_taken_offer_leaves_the_rendezvous_to_torch(world, claim):
    lost = _lose(world, "node-b")
    world.store.set(f"{PREFIX}/{lost.claim}", claim)
    world.monkeypatch.setattr(torchrun_agent, "OFFER_WAIT_SECONDS", 0.2)
    node = _newcomer(world)
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 3 and int(world.store.add(f"{PREFIX}/restarting/1", 0)) == 0


@pytest.mark.parametrize("forge", [
    lambda seat: {**seat, "workers": [[0, 1, 1, 2]]},  # a worker's fields short
    lambda seat: {**seat, "ranks": [0]},  # ranks other than its workers'
    lambda seat: {**seat, "master_port": "29500"},
    lambda seat: {**seat, "master_port": 29501},  # another rendezvous's keys: its ranks would wait alone
    lambda seat: {**seat, "round": 2},  # another round of torchrun's
    lambda seat: {**seat, "groups": 3},
    lambda seat: {**seat, "workers": [[0, 1, 1, 3, 2]], "ranks": [1]},  # a world size other than the prefix's
    lambda seat: "not a seat",
], ids=["short-worker", "ranks", "port-type", "other-port", "round", "groups", "world", "not-a-seat"])
def test_a_forged_seat_is_not_taken(world, forge):
    lost = _lose(world, "node-b")
    seat = json.loads(world.store.get(f"{PREFIX}/seat/1"))
    world.store.set(f"{PREFIX}/seat/1", json.dumps(forge(seat)))
    world.monkeypatch.setattr(torchrun_agent, "OFFER_WAIT_SECONDS", 0.2)
    node = _newcomer(world)
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 3 and world.store.get(f"{PREFIX}/{lost.claim}") == OPEN.encode()
    assert node.desc not in world.state.participants


def test_a_newcomer_waits_for_the_offer_while_the_round_misses_an_agent(world):
    del world.state.participants[world.nodes["node-b"].desc]  # dropped; the survivor has not offered yet
    node = _newcomer(world)
    threading.Timer(0.5, lambda: _offer(world, 1)).start()
    began = time.monotonic()
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 2 and node.group.group_rank == 1 and 0.4 < time.monotonic() - began < 3


def test_a_newcomer_to_a_job_that_goes_on_without_the_node_does_not_wait_for_an_offer(monkeypatch, store):
    # --nnodes 1:2: one node left is enough; the survivors offer no seat (torchrun re-forms
    # the job without the lost node).
    world = _world(monkeypatch, store, size=2, min_nodes=1)
    del world.state.participants[world.nodes["node-b"].desc]
    node = _newcomer(world)
    began = time.monotonic()
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 3 and time.monotonic() - began < 1


def test_a_seat_whose_rank_another_agent_took_meanwhile_goes_back_on_offer(world):
    # Won the claim, but torchrun's round has the rank held by the time it writes itself in.
    lost = _lose(world, "node-b")
    node = _newcomer(world)
    world.monkeypatch.setattr(torchrun_agent, "OFFER_WAIT_SECONDS", 0.2)
    sync = node.handler._state_holder.sync

    def sync_after_another(self_=None):
        world.state.participants[_NodeDesc("node-z", 1, 0)] = 1  # another agent's write came first
        return sync() and False

    node.handler._state_holder.sync = sync_after_another
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 3 and world.store.get(f"{PREFIX}/{lost.claim}") == OPEN.encode()
    assert int(world.store.add(f"{PREFIX}/restarting/1", 0)) == 0


def test_only_the_first_rendezvous_looks_for_an_offer(world):
    node = world.nodes["node-a"]
    _lose(world, "node-b")
    SimpleElasticAgent._rendezvous(node.agent, node.group)  # node-b's patch: its second rendezvous
    assert len(world.calls) == 3 and node.group.group_rank == 0
