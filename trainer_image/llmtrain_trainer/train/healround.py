"""In-process healing's membership rounds, kept in the job's rendezvous store.

A *round* is one process group of the job's ranks (a fixed world size: the ranks that a
torchrun rendezvous assigned). Each rank announces itself under the round's keys; the
round forms once every rank has. A survivor whose collective failed *breaks* its round
and joins the next one; a restarted rank that finds its predecessor's announcement in
the current round breaks it too (the survivors may not have noticed yet). Every member
reads every member's announcement, so all of them agree, with no further exchange, on
whether the round *heals* (some member holds a trained state: a survivor) or *starts*
(every member fresh: the usual restore from checkpoints), and on which member sends the
state (``Round.donor``).

A survivor waits for a missing rank only once that rank's torchrun agent has announced
that it restarts it in place (``RESTARTING``, counted by ``launch/torchrun_agent.py``
as soon as it sees a rank of its node fail on its own, before it restarts them; a count
since the last round formed is one for this failure). A rank whose whole node is gone is
announced by nobody. When fewer nodes than torchrun's ``--nnodes`` minimum would be left
without such ranks, the survivor offers their *seats* (their nodes' torchrun group ranks,
``SEAT``, recorded by each agent after its rendezvous) to a replacement: ``CLAIM`` set to
``OPEN``, from the first ``OFFER_SECONDS`` of the wait on, taken back when it leaves the
round. The agent of a node that starts later (the pod that replaces a lost one) takes an
open seat, but only while no agent of torchrun's round holds that group rank (the lost one
was dropped: its lease ended, or its keep-alive lapsed), so a seat offered while its agent
was still counting a crashed rank's restart is never taken from a live node. It takes it
instead of joining torchrun's rendezvous, counts its ranks' restarts and starts them with
the lost ranks' numbers: the survivors see the count and wait for them as for a crashed
rank.
After ``announce_seconds`` with a rank still unannounced, a survivor gives up
(``HealImpossible``, to recover as before: exit, re-rendezvous) when a smaller world could
form without the lost nodes (torchrun's ``--nnodes`` minimum allows it: an elastic job
goes on smaller sooner than a replacement comes), when the agents recorded no seat, or
when a peer withdrew the offer; otherwise it waits for a replacement until the round's
deadline, and then withdraws its offer (``WITHDRAWN``) unless a replacement took it first.
A rank stopped by its own agent while it waits (torchrun stops a node's other ranks when
one of them fails, then restarts them all; the agent counts their restarts first) breaks
its round (``HealStopped``): no round may form with a member about to end.

Pure logic over a store with c10d's ``Store`` methods (``add``, ``set``, ``get``,
``check``, ``compare_set``); tests give it a real ``TCPStore``. What is read from the
store is checked: a pod that reaches the store can write any bytes there, and a bad
announcement is an error naming its key, never executed (JSON, bounded).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol

ROUND = "round"
RESTARTING = "restarting/"
"""``restarting/<rank>``: how many times that rank's agent restarted it in place (counted
before it starts the new process)."""
ANNOUNCE_SECONDS = 5.0
"""How long a survivor waits for a missing rank's restart to be counted: a node's agent
sees its rank's exit at once (its monitor's sleep ends when a worker exits), so this is
for a loaded machine. It is also what a lost node costs more than without healing in a job
that can go on without it; one that cannot waits for the node's replacement instead
(``SEAT``)."""
ANNOUNCE_LIMIT = 4096
"""Bytes: an announcement is a few numbers and a host name."""
SEAT = "seat/"
"""``seat/<group rank>``: the node that holds that torchrun group rank (``Seat``), written
by its agent after each rendezvous and by the agent that takes the seat over."""
CLAIM = "claim/"
"""``claim/<group rank>/<holder>``: the offer of a lost node's seat to a replacement,
``OPEN``, then ``TAKEN`` + the new agent, or ``WITHDRAWN``; keyed by the lost holder, so
that the seat's next holder, lost in turn, is offered afresh."""
OPEN, TAKEN, WITHDRAWN = "open", "taken ", "withdrawn"
OFFER_SECONDS = 0.25
"""How often a waiting survivor offers the seats of missing, unannounced ranks: a
replacement that comes before ``ANNOUNCE_SECONDS`` need not wait for them."""
SEAT_LIMIT = 1 << 16
"""Bytes: a seat names the node's ranks (and, for its agent, their torchrun fields)."""


class HealError(RuntimeError):
    """The rounds cannot form a group: a bad announcement, or a rank that stayed away."""


class HealStopped(HealError):
    """This rank's own agent stopped it (SIGTERM, with its restart counted) while it waited
    for a round: torchrun stops a node's other ranks when one of them fails, and restarts
    them all in place."""


class HealImpossible(HealError):
    """A missing rank is restarted by nobody (its node is gone, or its agent restarts the
    whole group): healing in process cannot bring it back."""


class Store(Protocol):
    def add(self, key: str, value: int) -> int: ...
    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes: ...


def _bounded_json(raw: bytes, limit: int) -> Any:
    """What a store key holds, as JSON: any pod that reaches the store may have written it,
    so its size is checked before it is parsed (ValueError otherwise)."""
    if len(raw) > limit:
        raise ValueError(f"{len(raw)} bytes, more than {limit}")
    return json.loads(raw)


@dataclass(frozen=True)
class Member:
    rank: int
    incarnation: str
    """host/pid of the process: a restarted rank's differs from its predecessor's."""
    fresh: bool
    """No trained state in memory (a new process)."""
    step: int = 0
    """The step its state holds (a survivor's: possibly one update past the last agreed step)."""
    restarts: int = 0
    """Its agent's count of its in-place restarts as it joined (``RESTARTING``): a new
    process's count includes its own start, which the survivors may have read before."""

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes, key: str) -> Member:
        try:
            data = _bounded_json(raw, ANNOUNCE_LIMIT)
            member = cls(rank=data["rank"], incarnation=data["incarnation"], fresh=data["fresh"], step=data["step"],
                         restarts=data.get("restarts", 0))
            types_ok = (type(member.rank) is int and isinstance(member.incarnation, str) and type(member.fresh) is bool
                        and type(member.step) is int and member.step >= 0
                        and type(member.restarts) is int and member.restarts >= 0)
            if not types_ok:
                raise ValueError("a field of the wrong type")
        except (ValueError, KeyError, TypeError) as err:
            raise HealError(f"the rendezvous store's {key!r} is not a rank's announcement ({err}): "
                            f"{raw[:120]!r}") from None
        return member


@dataclass(frozen=True)
class Seat:
    """A torchrun group rank and who holds it, as its agent recorded it (``SEAT``): what a
    survivor needs to offer it. The agent's record carries more (torchrun's fields for
    the ranks), read by the agent that takes the seat."""
    group: int
    holder: str
    """The agent holding it (host/pid): a claim is for one holder's loss."""
    ranks: tuple[int, ...]
    groups: int
    """torchrun's group world size."""
    min_groups: int
    """torchrun's ``--nnodes`` minimum: fewer groups than this cannot form a world."""

    @classmethod
    def decode(cls, raw: bytes, key: str) -> Seat:
        try:
            data = _bounded_json(raw, SEAT_LIMIT)
            seat = cls(group=data["group"], holder=data["holder"], ranks=tuple(data["ranks"]), groups=data["groups"],
                       min_groups=data["min_groups"])
            ints = [seat.group, seat.groups, seat.min_groups, *seat.ranks]
            if not (all(type(x) is int and x >= 0 for x in ints) and isinstance(seat.holder, str) and seat.ranks
                    and 0 <= seat.group < seat.groups and len(seat.holder) <= 512):
                raise ValueError("a field of the wrong type or out of range")
        except (ValueError, KeyError, TypeError) as err:
            raise HealError(f"the rendezvous store's {key!r} is not a node's seat ({err}): {raw[:120]!r}") from None
        return seat

    @property
    def claim(self) -> str:
        return claim_key(self.group, self.holder)


def claim_key(group: int, holder: str) -> str:
    return f"{CLAIM}{group}/{holder}"


@dataclass(frozen=True)
class Round:
    index: int
    members: tuple[Member, ...]
    """By rank."""

    @property
    def heals(self) -> bool:
        """Some member holds a trained state: the others get it from it, not from storage."""
        return any(not m.fresh for m in self.members)

    @property
    def donor(self) -> int:
        """The rank that sends the state: of the survivors holding the newest step, the
        lowest rank (every member computes the same)."""
        holders = [m for m in self.members if not m.fresh]
        if not holders:
            raise HealError(f"round {self.index}: no member holds a state")
        newest = max(m.step for m in holders)
        return min(m.rank for m in holders if m.step == newest)

    @property
    def step(self) -> int:
        return next(m.step for m in self.members if m.rank == self.donor)


class Rounds:
    """One rank's view of the rounds of one torchrun rendezvous (the store keys are
    already prefixed with it)."""

    def __init__(self, store: Store, world_size: int, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, poll: float = 0.01, announce_seconds: float = ANNOUNCE_SECONDS,
                 local_world_size: int = 1, note: Callable[[str], None] = lambda _: None):
        self.store, self.world_size = store, world_size
        self.clock, self.sleep, self.poll, self.announce_seconds = clock, sleep, poll, announce_seconds
        self.local_world_size = max(1, local_world_size)
        """Ranks a node: torchrun gives group rank g the ranks ``g * local_world_size`` on."""
        self.note = note
        """Told, once a seat a wait, when a rank of it is restarted by no agent for
        ``announce_seconds`` and this rank waits for a replacement (the trainer logs it)."""
        self.restarts: dict[int, int] = {}
        """Each rank's in-place restarts as this rank joined the last round that formed:
        one counted since was announced for a failure in it (read before the round formed,
        so that a rank that dies while it forms is not taken for one nobody restarts; a new
        member's own reading of its count is taken when higher)."""
        self.offered: dict[int, Seat] = {}
        """The seats this rank offered while waiting for the current round."""
        self.noted: set[int] = set()

    def current(self) -> int:
        return int(self.store.add(ROUND, 0))

    def break_round(self, index: int) -> None:
        """Round ``index`` lost a member: its waiting members move on, and so does the count."""
        self.store.set(f"r{index}/broken", "1")
        self.store.compare_set(ROUND, str(index), str(index + 1))

    def join(self, me: Member, deadline: float, stopping: Callable[[], bool] = lambda: False) -> Round:
        """Announce ``me`` in the current round and wait for it to form; a round found
        broken is left for the next. ``deadline`` (``clock``) bounds the whole wait.

        Once ``stopping()`` says so (a SIGTERM) and this rank's own restart is counted
        (its agent stopped it to restart it with a failed rank of its node), it raises
        ``HealStopped``: before it announces itself, or breaking the round it waits in,
        which must not form with it. A SIGTERM without that count (the pod shutting down)
        leaves it in the round: the ranks then stop together at the next step, with the
        emergency checkpoint."""
        while True:
            index = self.current()
            key = f"r{index}/rank{me.rank}"
            if self.store.check([key]):
                earlier = Member.decode(self.store.get(key), key)
                if earlier.incarnation != me.incarnation:
                    # This rank's predecessor is in the round: it died there.
                    self.break_round(index)
                    continue
            joined_with = {rank: self._restarts(rank) for rank in range(self.world_size)}
            if stopping() and joined_with[me.rank] > self.restarts.get(me.rank, 0):
                raise HealStopped(f"round {index}: this rank's agent restarts it and stopped it (SIGTERM) first")
            me = replace(me, restarts=joined_with[me.rank])
            self.store.set(key, me.encode())
            self.offered, self.noted = {}, set()
            try:
                formed = self._wait(index, me, deadline, stopping)
            finally:
                self._retract_offers()
            if formed is not None:
                self.restarts = {m.rank: max(joined_with[m.rank], m.restarts) for m in formed.members}
                return formed

    def _wait(self, index: int, me: Member, deadline: float, stopping: Callable[[], bool]) -> Round | None:
        keys = {rank: f"r{index}/rank{rank}" for rank in range(self.world_size)}
        began = self.clock()
        offer_at = began + OFFER_SECONDS
        while True:
            if self.store.check([f"r{index}/broken"]):
                return None
            if self.store.check(list(keys.values())):  # one request a poll, whatever the world size
                members = tuple(Member.decode(self.store.get(keys[rank]), keys[rank]) for rank in range(self.world_size))
                for rank, member in enumerate(members):
                    if member.rank != rank:
                        raise HealError(f"the rendezvous store's {keys[rank]!r} announces rank {member.rank}")
                return Round(index, members)
            if stopping() and self._restarts(me.rank) > self.restarts.get(me.rank, 0):
                self.break_round(index)
                raise HealStopped(f"round {index}: this rank's agent restarts it and stopped it (SIGTERM) first")
            now = self.clock()
            # The missing ranks are looked at every OFFER_SECONDS, not at every poll: a
            # request for each rank, from every survivor, while they may wait for a minute.
            tick = not me.fresh and now >= offer_at
            if not tick and now < deadline:
                self.sleep(self.poll)
                continue
            late = not me.fresh and now - began >= self.announce_seconds
            missing = [rank for rank, key in keys.items() if not self.store.check([key])]
            if tick:
                offer_at = now + OFFER_SECONDS
                unannounced = [rank for rank in missing if self._restarts(rank) <= self.restarts.get(rank, 0)]
                if unannounced:
                    try:
                        self._offer_seats(index, unannounced, now - began, late)
                    except HealError:
                        self._withdraw_offers()  # no replacement may take a seat nobody waits in any more
                        raise
            if now >= deadline:
                taken = self._withdraw_offers()
                raise HealError(f"round {index}: rank(s) {missing} did not join in time"
                                + (f" (a replacement took the seat(s) of group rank(s) {taken} but did not join)" if taken else ""))
            self.sleep(self.poll)

    def _offer_seats(self, index: int, unannounced: list[int], waited: float, late: bool) -> None:
        """Ranks that no agent announced: offer their nodes' seats to replacements. Once
        ``late`` (restarted by no agent), raise ``HealImpossible`` when waiting for a
        replacement is not the way (see the module's words), else say it once a seat."""
        lost = f"round {index}: rank(s) {unannounced} are restarted by no agent {waited:.1f}s after the failure"
        seats: dict[int, Seat] = {}
        for rank in unannounced:
            group = rank // self.local_world_size
            if group in seats or group in self.offered:
                continue
            key = f"{SEAT}{group}"
            if not self.store.check([key]):
                if late:
                    raise HealImpossible(f"{lost} (a node lost, or a whole group restarted; no agent recorded a seat)")
                continue
            seat = Seat.decode(self.store.get(key), key)
            if rank not in seat.ranks:
                raise HealImpossible(f"{lost} (its seat {key!r} names ranks {list(seat.ranks)})")
            seats[group] = seat
        offered = {**self.offered, **seats}
        if not offered:
            return
        sample = next(iter(offered.values()))
        if sample.groups - len(offered) >= sample.min_groups:
            # An elastic job: torchrun re-forms it without them, sooner than a replacement comes.
            if late:
                raise HealImpossible(f"{lost} (a node lost, or a whole group restarted; {sample.groups - len(offered)} "
                                     f"node(s) can go on without them, the job's minimum is {sample.min_groups})")
            return
        for group, seat in seats.items():
            self.store.compare_set(seat.claim, "", OPEN)  # posted once, whoever comes first
            self.offered[group] = seat
        if not late:
            return
        for group, seat in self.offered.items():
            state = self.store.get(seat.claim).decode(errors="replace")
            if state == WITHDRAWN:
                raise HealImpossible(f"{lost}: a peer gave up waiting for a replacement of group rank {group}")
            if group not in self.noted and any(rank // self.local_world_size == group for rank in unannounced):
                self.noted.add(group)
                self.note(f"{lost}: their node (group rank {group}, agent {seat.holder}) is taken for lost; its seat is "
                          "offered to a replacement node, waited for until the round's deadline")

    def _retract_offers(self) -> None:
        """This rank leaves the round (formed, broken, given up): its open offers go back to
        none, so that no replacement takes a seat that nobody waits in; a peer still waiting
        offers it again at its next look. Best effort: the store may be what failed."""
        for seat in self.offered.values():
            try:
                self.store.compare_set(seat.claim, OPEN, "")
            except Exception:  # noqa: BLE001 - a failing store leaves the offer; its round is gone with it
                pass
        self.offered = {}

    def _withdraw_offers(self) -> list[int]:
        """At the deadline: the seats offered and still open are withdrawn (a replacement
        that comes later joins torchrun's rendezvous); those a replacement took, by group."""
        taken = []
        for group, seat in self.offered.items():
            state = self.store.compare_set(seat.claim, OPEN, WITHDRAWN).decode(errors="replace")
            if state.startswith(TAKEN):
                taken.append(group)
        return taken

    def _restarts(self, rank: int) -> int:
        return int(self.store.add(f"{RESTARTING}{rank}", 0))
