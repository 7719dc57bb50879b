"""In-process healing's membership rounds (``train/healround.py``) against a real c10d
TCPStore: a round forms once every rank announced itself; a restarted rank breaks the
round its predecessor was in; a survivor waits only for a rank that an agent restarts;
the donor is the lowest rank holding the newest step; a rank asked to stop while it
waits breaks its round, so that none forms with it; a forged announcement is an error
naming its key."""

from __future__ import annotations

import datetime
import json
import re
import threading
import time

import pytest
import torch.distributed as dist
from llmtrain_trainer.train.healround import (
    OPEN,
    RESTARTING,
    SEAT,
    TAKEN,
    WITHDRAWN,
    HealError,
    HealImpossible,
    HealStopped,
    Member,
    Round,
    Rounds,
    Seat,
)


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))
    return dist.PrefixStore("llmtrain/heal/test/", server)


def _join_all(rounds: list[Rounds], members: list[Member], timeout: float = 10) -> list[Round]:
    out: list[Round | BaseException] = [RuntimeError("did not return")] * len(members)

    def one(i: int) -> None:
        try:
            out[i] = rounds[i].join(members[i], rounds[i].clock() + timeout)
        except BaseException as err:  # noqa: BLE001 - the test reads it
            out[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(members))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    for value in out:
        if isinstance(value, BaseException):
            raise value
    return out  # type: ignore[return-value]


def test_a_round_forms_with_every_rank_and_all_agree_on_it(store):
    rounds = [Rounds(store, 3) for _ in range(3)]
    formed = _join_all(rounds, [Member(r, f"p{r}", fresh=True) for r in range(3)])
    assert {f.index for f in formed} == {0}
    assert all(f.members == formed[0].members for f in formed)
    assert not formed[0].heals  # every member fresh: the usual restore from checkpoints


def test_a_restarted_rank_breaks_its_predecessors_round_and_survivors_wait_for_it(store):
    first = _join_all([Rounds(store, 2) for _ in range(2)], [Member(0, "a", fresh=True), Member(1, "b", fresh=True)])
    assert first[0].index == 0
    survivor = Rounds(store, 2)
    survivor.restarts = {0: 0, 1: 0}
    store.add(f"{RESTARTING}1", 1)  # rank 1's agent restarts it in place
    replacement = Rounds(store, 2)
    # The survivor breaks the round whose collective failed (as Healing.reform does); the
    # replacement, whichever comes first, finds "b" in round 0 and breaks it too. Both
    # join round 1, the survivor with its state.
    survivor.break_round(0)
    formed = _join_all([replacement, survivor], [Member(1, "b2", fresh=True), Member(0, "a", fresh=False, step=6)])
    assert [f.index for f in formed] == [1, 1]
    assert formed[0].heals and formed[0].donor == 0 and formed[0].step == 6


def test_the_donor_is_the_lowest_rank_holding_the_newest_step():
    members = (Member(0, "a", fresh=False, step=6), Member(1, "b", fresh=True), Member(2, "c", fresh=False, step=7),
               Member(3, "d", fresh=False, step=7))
    assert Round(4, members).donor == 2 and Round(4, members).step == 7
    with pytest.raises(HealError, match="no member holds a state"):
        Round(5, (Member(0, "a", fresh=True),)).donor  # noqa: B018 - the property raises


def test_a_survivor_gives_up_on_a_rank_no_agent_restarts(store):
    clock = [0.0]
    survivor = Rounds(store, 2, clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                      announce_seconds=3.0)
    survivor.restarts = {0: 0, 1: 0}
    with pytest.raises(HealImpossible, match=r"rank\(s\) \[1\] are restarted by no agent"):
        survivor.join(Member(0, "a", fresh=False, step=4), deadline=60.0)
    assert 3.0 <= clock[0] < 3.5  # after the announcement's wait, well before the deadline


def test_a_forged_announcement_is_an_error_naming_its_key(store):
    store.set("r0/rank1", '{"rank": 1, "incarnation": "x", "fresh": "yes", "step": 0}')
    with pytest.raises(HealError, match=r"'r0/rank1' is not a rank's announcement \(a field of the wrong type\)"):
        Rounds(store, 2).join(Member(1, "y", fresh=True), deadline=1e12)
    store.set("r1/rank0", "x" * 5000)
    store.compare_set("round", "0", "1")
    with pytest.raises(HealError, match="more than 4096"):
        Rounds(store, 2).join(Member(0, "z", fresh=True), deadline=1e12)


def test_a_replacement_that_comes_before_its_survivor_noticed_breaks_the_round_itself(store):
    _join_all([Rounds(store, 2) for _ in range(2)], [Member(0, "a", fresh=True), Member(1, "b", fresh=True)])
    replacement = Rounds(store, 2)
    result: list[Round] = []
    thread = threading.Thread(target=lambda: result.append(replacement.join(Member(1, "b2", fresh=True), 1e12)))
    thread.start()
    deadline = time.monotonic() + 10
    while replacement.current() != 1:  # the replacement moved on by itself
        assert time.monotonic() < deadline
        time.sleep(0.01)
    survivor = Rounds(store, 2)
    survivor.restarts = {0: 0, 1: 0}
    survivor.break_round(0)  # a no-op now: round 0 is already broken
    formed = survivor.join(Member(0, "a", fresh=False, step=3), time.monotonic() + 10)
    thread.join(10)
    assert formed.index == 1 and result and result[0].index == 1 and formed.donor == 0


def test_a_rank_asked_to_stop_breaks_its_round_and_the_others_form_the_next_without_it(store):
    # Two nodes of two ranks: rank 3 died, its agent counted ranks 2 and 3 as restarting
    # and stopped rank 2 (SIGTERM), which was already waiting in round 1 with its state.
    _join_all([Rounds(store, 4) for _ in range(4)], [Member(r, f"p{r}", fresh=True) for r in range(4)])
    store.add(f"{RESTARTING}2", 1)
    store.add(f"{RESTARTING}3", 1)
    stop = threading.Event()
    stopped: list[BaseException] = []

    def rank2() -> None:
        try:
            Rounds(store, 4).join(Member(2, "p2", fresh=False, step=6), time.monotonic() + 10, stopping=stop.is_set)
        except BaseException as err:  # noqa: BLE001 - the test reads it
            stopped.append(err)

    survivors = [Rounds(store, 4) for _ in range(2)]
    for survivor in survivors:
        survivor.restarts = {0: 0, 1: 0, 2: 0, 3: 0}
    survivors[0].break_round(0)
    waiting = threading.Thread(target=rank2)
    waiting.start()
    deadline = time.monotonic() + 10
    while not store.check(["r1/rank2"]):  # rank 2 announced itself in round 1
        assert time.monotonic() < deadline
        time.sleep(0.01)
    stop.set()
    waiting.join(10)
    assert len(stopped) == 1 and isinstance(stopped[0], HealStopped), stopped
    assert "round 1: this rank's agent restarts it and stopped it (SIGTERM) first" in str(stopped[0])
    assert store.check(["r1/broken"]) and Rounds(store, 4).current() == 2  # broken by the stopped rank itself
    # Round 1 cannot form with the stopped rank: the survivors and the restarted ranks
    # meet in round 2, where the survivors' state is sent.
    members = [Member(0, "p0", fresh=False, step=6), Member(1, "p1", fresh=False, step=6),
               Member(2, "p2-new", fresh=True), Member(3, "p3-new", fresh=True)]
    formed = _join_all([*survivors, Rounds(store, 4), Rounds(store, 4)], members)
    assert {f.index for f in formed} == {2} and formed[0].donor == 0
    assert [m.incarnation for m in formed[0].members] == ["p0", "p1", "p2-new", "p3-new"]


def test_a_rank_stopped_with_its_restart_counted_announces_nothing(store):
    store.add(f"{RESTARTING}1", 1)
    with pytest.raises(HealStopped):
        Rounds(store, 2).join(Member(1, "b", fresh=False, step=3), time.monotonic() + 10, stopping=lambda: True)
    assert not store.check(["r0/rank1"]) and Rounds(store, 2).current() == 0


def test_a_sigterm_without_its_restart_counted_leaves_the_rank_in_its_round(store):
    # The pod shutting down, not its agent restarting it: the rank stays in the round,
    # which forms as without the SIGTERM (the ranks then stop together at a step).
    peer = threading.Thread(target=lambda: time.sleep(0.2) or store.set("r0/rank1", Member(1, "b", fresh=False, step=3).encode()))
    peer.start()
    formed = Rounds(store, 2).join(Member(0, "a", fresh=False, step=3), time.monotonic() + 10, stopping=lambda: True)
    peer.join(10)
    assert formed.index == 0 and [m.incarnation for m in formed.members] == ["a", "b"]


def _seat(store, group: int, ranks: list[int], groups: int = 2, min_groups: int = 2, holder: str = "") -> Seat:
    seat = {"group": group, "holder": holder or f"node{group}/1/1", "ranks": ranks, "groups": groups, "min_groups": min_groups}
    store.set(f"{SEAT}{group}", json.dumps(seat))
    return Seat.decode(store.get(f"{SEAT}{group}"), "seat")


def _survivor(store, world: int = 2, local: int = 1, **kwargs) -> tuple[Rounds, list[float], list[str]]:
    clock, notes = [0.0], []
    survivor = Rounds(store, world, clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                      announce_seconds=3.0, local_world_size=local, note=notes.append, **kwargs)
    survivor.restarts = {r: 0 for r in range(world)}
    return survivor, clock, notes


def test_a_lost_nodes_seat_is_offered_at_once_and_a_replacement_that_takes_it_joins_the_round(store):
    # Rank 1's node is lost in a job that needs both nodes (--nnodes 2:2).
    seat = _seat(store, 1, [1])
    survivor, clock, notes = _survivor(store)
    result: list[Round | BaseException] = []
    offered = threading.Event()

    def sleep(seconds: float) -> None:
        clock[0] += seconds
        if store.check([seat.claim]) and not offered.is_set():
            assert clock[0] < 0.5  # offered within OFFER_SECONDS, not after the announcement's 3 s
            offered.set()
            time.sleep(0.5)  # the replacement takes it meanwhile (below)
        elif offered.is_set():
            time.sleep(0.001)

    survivor.sleep = sleep
    thread = threading.Thread(target=lambda: result.append(_try(lambda: survivor.join(Member(0, "a", fresh=False, step=4),
                                                                                     deadline=60.0))))
    thread.start()
    assert offered.wait(10) and store.get(seat.claim) == OPEN.encode()
    # The replacement's agent takes the seat and counts the restart; its rank joins fresh.
    assert store.compare_set(seat.claim, OPEN, TAKEN + "node-c/9/9") == (TAKEN + "node-c/9/9").encode()
    store.add(f"{RESTARTING}1", 1)
    replacement = Rounds(store, 2)
    formed = replacement.join(Member(1, "b2", fresh=True), time.monotonic() + 10)
    thread.join(10)
    assert isinstance(result[0], Round) and result[0].index == formed.index and formed.donor == 0, result
    assert [m.restarts for m in formed.members] == [0, 1]
    # The next loss of that seat is another offer: the baseline took the new rank's count.
    assert survivor.restarts == {0: 0, 1: 1}
    assert notes == []  # taken before the survivor held the node for lost


def _try(fn):
    try:
        return fn()
    except BaseException as err:  # noqa: BLE001 - the test reads it
        return err


def test_a_survivor_says_once_that_it_waits_for_a_replacement_then_withdraws_its_offer_at_the_deadline(store):
    seat = _seat(store, 1, [2, 3])  # two nodes of two ranks, ranks 2 and 3 lost
    survivor, clock, notes = _survivor(store, world=4, local=2)
    for rank in (0, 1):
        store.set(f"r0/rank{rank}", Member(rank, f"p{rank}", fresh=False, step=4).encode())
    with pytest.raises(HealError, match=r"rank\(s\) \[2, 3\] did not join in time$"):
        survivor.join(Member(0, "p0", fresh=False, step=4), deadline=20.0)
    assert 20.0 <= clock[0] < 20.5
    assert store.get(seat.claim) == WITHDRAWN.encode()
    assert len(notes) == 1 and re.search(r"rank\(s\) \[2, 3\] are restarted by no agent 3\.\d+s after the failure: their node "
                                         r"\(group rank 1, agent node1/1/1\) is taken for lost; its seat is offered", notes[0])


def test_a_seat_taken_by_a_replacement_that_never_joins_is_named_at_the_deadline(store):
    seat = _seat(store, 1, [1])
    survivor, clock, _ = _survivor(store)
    tick = survivor.sleep

    def sleep(seconds: float) -> None:  # a replacement's agent takes the offer as soon as it is made
        tick(seconds)
        if store.compare_set(seat.claim, OPEN, TAKEN + "node-c/9/9") == (TAKEN + "node-c/9/9").encode():
            store.add(f"{RESTARTING}1", 1)

    survivor.sleep = sleep
    with pytest.raises(HealError, match=r"a replacement took the seat\(s\) of group rank\(s\) \[1\] but did not join"):
        survivor.join(Member(0, "a", fresh=False, step=4), deadline=10.0)


def test_an_elastic_job_offers_no_seat_and_gives_up_so_that_torchrun_re_forms_it_smaller(store):
    seat = _seat(store, 1, [1], min_groups=1)  # --nnodes 1:2
    survivor, clock, notes = _survivor(store)
    with pytest.raises(HealImpossible, match=r"1 node\(s\) can go on without them, the job's minimum is 1"):
        survivor.join(Member(0, "a", fresh=False, step=4), deadline=60.0)
    assert 3.0 <= clock[0] < 3.5 and not store.check([seat.claim]) and notes == []


def test_a_peer_that_withdrew_the_offer_makes_the_others_give_up_too_withdrawing_theirs(store):
    # Two nodes lost of four: a peer gave up on group rank 2's seat; this survivor, which
    # had offered group rank 3's too, withdraws it as it gives up.
    lost = [_seat(store, g, [g], groups=4, min_groups=4) for g in (2, 3)]
    store.set(lost[0].claim, WITHDRAWN)
    store.set("r0/rank1", Member(1, "b", fresh=False, step=4).encode())  # the other survivor
    survivor, clock, _ = _survivor(store, world=4)
    with pytest.raises(HealImpossible, match=r"a peer gave up waiting for a replacement of group rank 2"):
        survivor.join(Member(0, "a", fresh=False, step=4), deadline=60.0)
    assert 3.0 <= clock[0] < 3.5
    assert store.get(lost[1].claim) == WITHDRAWN.encode()


def test_without_a_seat_recorded_the_survivor_gives_up_as_before(store):
    survivor, clock, _ = _survivor(store)
    with pytest.raises(HealImpossible, match=r"no agent recorded a seat"):
        survivor.join(Member(0, "a", fresh=False, step=4), deadline=60.0)


@pytest.mark.parametrize("raw, why", [
    ('{"group": 1, "holder": "h", "ranks": [], "groups": 2, "min_groups": 2}', "out of range"),
    ('{"group": 5, "holder": "h", "ranks": [1], "groups": 2, "min_groups": 2}', "out of range"),
    ('{"group": 1, "holder": 3, "ranks": [1], "groups": 2, "min_groups": 2}', "wrong type"),
    ('{"group": 1, "ranks": [1], "groups": 2, "min_groups": 2}', "'holder'"),
    ("x" * 70000, "more than 65536"),
])
def test_a_forged_seat_is_an_error_naming_its_key(store, raw, why):
    store.set(f"{SEAT}1", raw)
    survivor, _, _ = _survivor(store)
    with pytest.raises(HealError, match=rf"'seat/1' is not a node's seat \(.*{re.escape(why)}"):
        survivor.join(Member(0, "a", fresh=False, step=4), deadline=60.0)
