"""In-process healing, a rank's side (``faultTolerance.inProcessHealing``).

Without it, every failure restarts processes: torchrun stops every worker of every node
and starts them again, and each new process restores. Here a rank's process groups come
from the rounds in the job's rendezvous store (``healround.py``) instead of torchrun's
``env://`` group, so that when a peer dies a survivor keeps its process and its state:
it abandons its group, waits for the new round (the dead rank's torchrun agent restarts
that one rank in place, ``launch/torchrun_agent.py``), builds a new group with fresh
store keys and explicit timeouts, and the round's donor sends the state to every member
(``Trainer._transfer``). A rank restarted this way gets the state from a survivor, not
from storage.

The job's ranks and world size are torchrun's (the rendezvous that started them): a
failure healed here changes neither. A node lost whole is healed too when the job cannot
go on without it: the survivors offer its seat, and the agent of the pod that replaces it
takes the seat (its ranks get the lost ranks' numbers) instead of joining torchrun's
rendezvous (``healround.py``, ``torchrun_agent.take_offered_seats``). Whatever cannot
heal falls back to the recovery without it: a lost node that a smaller world can do
without, a replacement that does not come before the round's deadline, a round that does
not form in time, a rank whose own process failed. Then the survivor ends as a victim, as
it would have, and torchrun re-forms the job.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import torch.distributed as dist
from llmtrain_contract.names import Env

from llmtrain_trainer.train import dist as distmod
from llmtrain_trainer.train.healround import Member, Round, Rounds
from llmtrain_trainer.world import DistInfo

log = logging.getLogger("llmtrain.heal")

KEY_PREFIX = "llmtrain/heal/"


class Healing:
    """One rank's process groups, formed round by round in the job's store."""

    def __init__(self, endpoint: str, run: str, backend: str, timeout_seconds: float, env: dict[str, str] | os._Environ[str]):
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{Env.HEAL_STORE}: {endpoint!r} is not host:port")
        self.rank = int(env["RANK"])
        self.world_size = int(env["WORLD_SIZE"])
        self.backend = backend
        self.env = env
        self.timeout = datetime.timedelta(seconds=timeout_seconds)
        self.timeout_seconds = timeout_seconds
        client = dist.TCPStore(host, int(port), is_master=False, timeout=self.timeout, use_libuv=True)
        # The rounds of this torchrun rendezvous only: torchrun gives each rendezvous its
        # own master address (worker rank 0's, a fresh port), which an in-place restart
        # keeps. A job re-formed by torchrun starts its rounds over.
        master = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}/{self.world_size}"
        # No trailing "/": PrefixStore puts one between its prefix and each key, and the
        # agents count restarts under ``{KEY_PREFIX}{run}/{master}/restarting/<rank>``
        # (``torchrun_agent.restart_key``). With one here the keys had "//" and no rank
        # ever saw a count: a survivor waited 5 s and gave up whenever a replacement
        # took longer (test_healing_choice.py holds the two spellings together).
        self.store = dist.PrefixStore(f"{KEY_PREFIX}{run}/{master}", client)
        self.rounds = Rounds(self.store, self.world_size, local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1") or 1),
                             note=log.warning)
        self.round: Round | None = None
        self.stopping: Callable[[], bool] = lambda: False
        """True once this rank was asked to stop (the trainer's SIGTERM): a round it waits
        for is then given up if its agent counted its restart (``Rounds.join``)."""
        self.formed_at = 0.0
        """``time.perf_counter()`` when the last round formed, before its group started."""
        self.sockets: dict[int, str] = {}
        # This process, as its announcements name it (a restarted rank's differs): taken
        # here, not at import, which a fork server may have done for every rank it forks.
        self.incarnation = f"{socket.gethostname()}/{os.getpid()}/{time.time_ns()}"

    @classmethod
    def from_env(cls, timeout_seconds: float) -> Healing | None:
        """The launcher's ``LLMTRAIN_HEAL_STORE`` (``host:port/run``); None without it (not
        under the launcher: nobody restarts a rank in place)."""
        value = os.environ.get(Env.HEAL_STORE, "")
        endpoint, _, run = value.partition("/")
        if not endpoint or not run or "RANK" not in os.environ:
            return None
        return cls(endpoint, run, distmod.backend_name(), timeout_seconds, os.environ)

    def info(self) -> DistInfo:
        return DistInfo.of(self.rank, self.world_size, self.backend, self.env)

    def start(self) -> Round:
        """A new process's first group (fresh: it holds no state)."""
        distmod.prepare_backend(self.backend)
        return self._form(Member(self.rank, self.incarnation, fresh=True))

    def reform(self, step: int | None) -> Round:
        """After a failed collective: abandon the group, break its round, form the next
        with this rank's state (``step``; None: it holds none intact)."""
        began = time.perf_counter()
        self._abandon()
        if self.round is not None:
            self.rounds.break_round(self.round.index)
        formed = self._form(Member(self.rank, self.incarnation, fresh=step is None, step=step or 0))
        if formed.heals:
            log.warning("healed in process (pid %d kept): round %d formed in %.2fs, restarted rank(s) %s, the state from "
                        "rank %d at step %d", os.getpid(), formed.index, time.perf_counter() - began,
                        [m.rank for m in formed.members if m.fresh], formed.donor, formed.step)
        return formed

    def _form(self, me: Member) -> Round:
        formed = self.rounds.join(me, time.monotonic() + self.timeout_seconds, self.stopping)
        self.formed_at = time.perf_counter()
        store = dist.PrefixStore(f"r{formed.index}/pg/", self.store)
        before = _sockets()
        dist.init_process_group(backend=distmod.backend_spec(self.backend), store=store, rank=self.rank,
                                world_size=self.world_size, timeout=self.timeout)
        # The group's connections (gloo connects every pair while it starts): closed by
        # hand when it is abandoned (``_abandon``). A socket another thread opened in the
        # meantime (a scrape of the metrics, a checkpoint's upload) is taken for one of
        # them: it is cut then, and its owner sees a dropped connection (an upload is
        # retried by its tier).
        self.sockets = {fd: link for fd, link in _sockets().items() if before.get(fd) != link}
        self.round = formed
        return formed

    def _abandon(self) -> None:
        """Drop the default process group whose peer failed.

        Its connections are shut down first, by hand. gloo closes them only when the group
        is destroyed, and its destructor joins the group's worker threads, which wait out
        the collective timeout when a queued collective (DDP sends one per gradient bucket)
        is blocked on a peer that left: seen here, a survivor sat in that join while its
        peers gave up on it. Neither ``abort()`` nor ``shutdown()`` of a gloo group closes
        a connection (measured: a peer's pending receive failed only when the process
        exited). Shut down, every blocked receive on either side fails at once: this
        rank's queued collectives, so the join returns, and a peer still blocked on this
        rank, which then heals too. ``abort()`` stays for NCCL, whose communicators it
        aborts without waiting."""
        if not dist.is_initialized():
            return
        # The group is destroyed on a thread of its own, never on the training thread: its
        # destructor joins its worker threads, which the shut down connections below end,
        # unless a connection the group made later is not among them (once in 17 rounds
        # with a collective per parameter, a survivor sat in that join). Nor is it kept:
        # a kept group's gloo threads spun on its shut down connections (measured: two
        # threads at 70 % of a core each, and every later heal slower).
        held = [dist.distributed_c10d._get_default_group()]
        try:
            held[0].abort()
        except Exception as err:  # noqa: BLE001 - a group that fails to abort is dropped all the same
            log.warning("aborting the failed process group: %s: %s", type(err).__name__, err)
        current = _sockets()
        for fd, link in self.sockets.items():
            if current.get(fd) == link:  # still that socket, not a reused descriptor
                _shut_down(fd)
        self.sockets = {}
        try:
            dist.destroy_process_group()
        except Exception as err:  # noqa: BLE001 - see above
            log.warning("closing the failed process group: %s: %s", type(err).__name__, err)
        # ``held`` is now the group's last reference: emptied on that thread, the group is
        # destroyed there.
        threading.Thread(target=held.clear, name="heal-destroy-group", daemon=True).start()


def _sockets() -> dict[int, str]:
    """This process's socket descriptors and what each is (``socket:[inode]``); empty
    where ``/proc`` does not say."""
    out: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


def _shut_down(fd: int) -> None:
    """Shut a connected socket down both ways through a duplicate of its descriptor: the
    connection ends (and its owner's blocked calls with it), the descriptor stays its
    owner's to close. A listening socket is left alone: gloo's listener thread aborts the
    process when its ``accept`` fails (measured)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as dup:
            if dup.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                return
            dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected, or gone already
