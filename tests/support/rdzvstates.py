"""torchrun's rendezvous states built for the rendezvous tests."""

from __future__ import annotations

import datetime

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState


def rendezvous_state(complete: bool, *nodes: _NodeDesc, waiting: tuple[_NodeDesc, ...] = ()) -> _RendezvousState:
    """Round 3 with ``nodes`` as participants (ranks in order) and ``waiting`` on the wait
    list, every one just heard; a round not complete has a last call a second away."""
    state = _RendezvousState()
    state.round, state.complete = 3, complete
    now = datetime.datetime.now(datetime.UTC)
    for rank, node in enumerate(nodes):
        state.participants[node] = rank
        state.last_heartbeats[node] = now
    for node in waiting:
        state.wait_list.add(node)
        state.last_heartbeats[node] = now
    state.deadline = None if complete else now + datetime.timedelta(seconds=1)
    return state
