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
from llmtrain_trainer.train.healround import OPEN, TAKEN, WITHDRAWN, Seat, claim_key
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

PREFIX = "llmtrain/heal/run/10.0.0.1:29500/2"


@pytest.fixture
def store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))


class Node:
    """An agent's process: its rendezvous handler (torch's state stubbed), its worker group."""

    def __init__(self, store, name: str, state):
        self.desc = _NodeDesc(name, 10, 0)  # torch's own node descriptor
        self.handler = SimpleNamespace(_state_holder=SimpleNamespace(state=state, sync=lambda: None),
                                       _settings=SimpleNamespace(min_nodes=2, run_id="job"), _store=store, _this_node=self.desc)
        self.group = SimpleNamespace(spec=SimpleNamespace(rdzv_handler=self.handler, local_world_size=1), workers=[],
                                     store=None, group_rank=None, group_world_size=None, master_addr=None, master_port=None)
        self.agent = SimpleNamespace()


def _torch_rendezvous(calls: list):
    """What torch's ``_rendezvous`` does, for a world of two one-rank nodes: node-a is group 0."""
    def rendezvous(agent, group):
        calls.append(group)
        rank = 0 if group.spec.rdzv_handler._this_node.addr == "node-a" else 1
        group.workers = [SimpleNamespace(local_rank=0, global_rank=rank, role_rank=rank, world_size=2, role_world_size=2)]
        group.group_rank, group.group_world_size, group.master_addr, group.master_port = rank, 2, "10.0.0.1", 29500
    return rendezvous


@pytest.fixture
def world(monkeypatch, store):
    """node-a and node-b through torch's rendezvous (each its own patched agent process)."""
    calls: list = []
    state = SimpleNamespace(complete=True, closed=False, round=3, participants={})
    nodes = {}
    for name in ("node-a", "node-b"):
        monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", _torch_rendezvous(calls))
        assert torchrun_agent.take_offered_seats(f"127.0.0.1:{store.port}/run")
        node = nodes[name] = Node(store, name, state)
        state.participants[node.desc] = len(state.participants)
        SimpleElasticAgent._rendezvous(node.agent, node.group)
    return SimpleNamespace(store=store, state=state, nodes=nodes, calls=calls, monkeypatch=monkeypatch)


def _newcomer(world, name: str = "node-c") -> Node:
    """A new agent process, started after the world formed."""
    world.monkeypatch.setattr(SimpleElasticAgent, "_rendezvous", _torch_rendezvous(world.calls))
    assert torchrun_agent.take_offered_seats(f"127.0.0.1:{world.store.port}/run")
    return Node(world.store, name, world.state)


def _lose(world, name: str) -> Seat:
    """``name``'s agent dropped from torchrun's round (its lease ended); a survivor offers its seat."""
    del world.state.participants[world.nodes[name].desc]
    seat = Seat.decode(world.store.get(f"{PREFIX}/seat/1"), "seat/1")
    world.store.compare_set(f"{PREFIX}/{claim_key(1, seat.holder)}", "", OPEN)
    return seat


def test_each_agent_records_its_seat_where_the_ranks_read_it(world):
    seats = [Seat.decode(world.store.get(f"{PREFIX}/seat/{g}"), "seat") for g in (0, 1)]
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
    # torch's exit barrier counts the agents in the lost agent's store (its round's prefix).
    group.store.set("probe", "1")
    assert world.store.get("torch.rendezvous.job.3/probe") == b"1" and node.agent._store is group.store
    # Its rank's restart is counted where the survivors read it; the offer is taken; the
    # seat is now the new agent's, so that its loss is offered afresh.
    assert int(world.store.add(f"{PREFIX}/restarting/1", 0)) == 1
    assert world.store.get(f"{PREFIX}/{lost.claim}").decode().startswith(TAKEN)
    now = Seat.decode(world.store.get(f"{PREFIX}/seat/1"), "seat/1")
    assert now.holder != lost.holder and now.ranks == (1,)
    # A second newcomer finds nothing to take and joins the rendezvous.
    other = _newcomer(world, "node-d")
    world.monkeypatch.setattr(torchrun_agent, "OFFER_WAIT_SECONDS", 0.2)
    SimpleElasticAgent._rendezvous(other.agent, other.group)
    assert len(world.calls) == 3


def test_a_seat_whose_agent_is_still_in_the_round_is_not_taken(world):
    # Offered while the agent was still counting its crashed rank's restart: not a lost node.
    seat = Seat.decode(world.store.get(f"{PREFIX}/seat/1"), "seat/1")
    world.store.compare_set(f"{PREFIX}/{seat.claim}", "", OPEN)
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
    lambda seat: {**seat, "node": ["node-b", "10"]},
    lambda seat: {**seat, "master_port": "29500"},
    lambda seat: "not a seat",
])
def test_a_forged_seat_is_not_taken(world, forge):
    lost = _lose(world, "node-b")
    seat = json.loads(world.store.get(f"{PREFIX}/seat/1"))
    world.store.set(f"{PREFIX}/seat/1", json.dumps(forge(seat)))
    world.monkeypatch.setattr(torchrun_agent, "OFFER_WAIT_SECONDS", 0.2)
    node = _newcomer(world)
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 3 and world.store.get(f"{PREFIX}/{lost.claim}") == OPEN.encode()


def test_a_newcomer_waits_for_the_offer_while_the_round_misses_an_agent(world):
    del world.state.participants[world.nodes["node-b"].desc]  # dropped; the survivor has not offered yet
    node = _newcomer(world)
    threading.Timer(0.5, lambda: _offer(world)).start()
    began = time.monotonic()
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 2 and node.group.group_rank == 1 and 0.4 < time.monotonic() - began < 3


def _offer(world) -> None:
    seat = Seat.decode(world.store.get(f"{PREFIX}/seat/1"), "seat/1")
    world.store.compare_set(f"{PREFIX}/{seat.claim}", "", OPEN)


def test_a_newcomer_to_an_elastic_job_does_not_wait_for_an_offer(world):
    # --nnodes 1:2: the survivors offer no seat (torchrun re-forms the job without the node).
    current = json.loads(world.store.get(torchrun_agent.current_key("run")))
    world.store.set(torchrun_agent.current_key("run"), json.dumps({**current, "min_groups": 1}))
    del world.state.participants[world.nodes["node-b"].desc]
    node = _newcomer(world)
    began = time.monotonic()
    SimpleElasticAgent._rendezvous(node.agent, node.group)
    assert len(world.calls) == 3 and time.monotonic() - began < 1


def test_only_the_first_rendezvous_looks_for_an_offer(world):
    node = world.nodes["node-a"]
    _lose(world, "node-b")
    SimpleElasticAgent._rendezvous(node.agent, node.group)  # node-b's patch: its second rendezvous
    assert len(world.calls) == 3 and node.group.group_rank == 0
