"""torchrun, except that an agent that fails leaves the job's rendezvous open, and that
an agent in a rendezvous reads its state four times a second, not once.

torchrun's ``launch_agent`` shuts the rendezvous handler down whenever its agent ends for
any reason but a signal, and for the c10d rendezvous that marks the run's state *closed*
for good: every agent that joins later, a survivor re-forming its group or a replacement
pod, fails at once with ``RendezvousClosedError``. One agent that dies of an exception (a
store read that times out on a loaded machine, a rendezvous error) would so turn every
later replacement into a crash until the job's restart budget is spent. The job's pods
are the operator's to end, so here the rendezvous is closed only as torchrun closes it
after its workers *succeeded* (then all ranks are done and a node still waiting should
stop); an agent that failed leaves it open, and the launcher's lease takes the agent out
of it at once (``rdzv_leases.py``).

Between two passes of its monitor the agent sleeps ``--monitor-interval`` (0.25 s); here a
worker process's exit (SIGCHLD) ends that sleep (``wake_on_worker_exit``), so a rank's
failure is acted on at once, not up to a quarter of a second later.

While it joins or leaves a round, torchrun's agent re-reads the rendezvous state once a
second (a 1 s sleep between reads, and a 1 s cache of the state). A round that the store
completes early (``rdzv_leases.py``), or a last call that ends, was so seen up to a second
late, by every agent re-forming its group after a failure. Here the agent sleeps
``JOIN_POLL_SECONDS`` between reads and reads fresh while it joins or leaves a round. Its
keep-alive beats and its check for waiting nodes (every ``--monitor-interval``) keep the
cache, so the load on the store grows only while a group re-forms. Every read carries the
whole state, whose size grows with the nodes, and every node reads it: the pace slows
with the job's ``--nnodes`` maximum (``join_poll_seconds``), and from 64 nodes torch's
own join loop runs unpatched (``bench/rendezvous_scale.py``: patched, 64 agents formed
no round here).

Every worker group (the first one too, and every one re-formed after a failure) admits a
node that is waiting to join only once it has finished a step (``admit_after_first_step``),
for the built-in trainer, whose ranks say so in their heartbeat files. torchrun restarts a
healthy group as soon as it sees a waiting node; a replacement pod that joined while the
survivors' ranks were still starting (before they handle SIGTERM) killed them, so the
re-formed group did no step at all and the next step came only after one more start-up and
restore (10.7 s instead of about 4 s from a pod's crash to the next step,
docs/benchmarks.md). After one step, the restart for the newcomer stops the ranks at a step
boundary (SIGTERM: an emergency checkpoint), so the step is kept. The hold lasts at most
``ADMIT_AFTER_SECONDS``, so a group stuck before its first step does not keep a node out
longer than that.

The agent reads the rendezvous state with a restricted unpickler (``read_state_safely``):
a forged state naming a callable is refused, never run; with the job's token
(``LLMTRAIN_RDZV_TOKEN``) it signs the state it writes and refuses one not signed with
it. A refused state is read again for a few seconds (``read_through_forgeries``) while the store's process puts back its last
good one (``rendezvous/leases.py``), so a forgery written by a pod that reaches the store
costs the job nothing; only a state refused for longer fails the agent, as torchrun would.

The launcher runs this file by its path in place of ``python -m torch.distributed.run``,
with the same arguments. It imports only torch, the standard library and the package's
``pod/heartbeat.py`` (by path), so it runs from a bundle in a user's image too; should that
torch lack what is patched here, torchrun runs unpatched.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import signal
import socket
import sys
import time
from types import ModuleType
from collections.abc import Callable, Iterable

if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
    # Run by path, Python put this file's folder first: its modules (bundle.py,
    # supervisor.py, ...) must not shadow top-level ones for torch.
    sys.path.pop(0)


def keep_open_on_failure() -> bool:
    """Patch torch so that the rendezvous is closed only after a successful run; False
    (nothing patched) when this torch has not the classes relied on."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent  # noqa: PLC0415 - a torch without it runs unpatched
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler  # noqa: PLC0415
    except ImportError:
        return False
    run, shutdown = getattr(SimpleElasticAgent, "run", None), getattr(DynamicRendezvousHandler, "shutdown", None)
    if run is None or shutdown is None:
        return False
    succeeded = [False]

    def run_noting_success(self, *args, **kwargs):
        result = run(self, *args, **kwargs)
        succeeded[0] = not result.is_failed()
        return result

    def shutdown_after_success(self):
        if succeeded[0]:
            return shutdown(self)
        print("llmtrain torchrun agent: the agent failed; the rendezvous stays open for the job's other and "
              "replacement nodes", file=sys.stderr, flush=True)
        return False

    SimpleElasticAgent.run = run_noting_success  # type: ignore[method-assign]  # patching torch's class is the point
    DynamicRendezvousHandler.shutdown = shutdown_after_success  # type: ignore[method-assign]  # patching torch's class is the point
    return True


def wake_on_worker_exit() -> bool:
    """Patch torch's agent loop so that its sleep between two passes of its monitor ends as
    soon as one of its processes exits (SIGCHLD), not after the whole ``--monitor-interval``
    (0.25 s: every pass also reads the rendezvous state, which a shorter interval would
    read more often on every node). A rank's failure, and the restart in place, the count
    its healing peers wait for, come up to that much sooner; an exit between a pass's poll
    and its end wakes the next sleep at once. False (nothing patched) when this torch's
    agent module does not sleep through ``time`` or this is not the main thread."""
    import select  # noqa: PLC0415

    try:
        from torch.distributed.elastic.agent.server import api  # noqa: PLC0415 - a torch without it runs unpatched
    except ImportError:
        return False
    if getattr(api, "time", None) is not time:
        return False
    # A pipe, not a threading.Event: the handler runs on the main thread, between two of its
    # bytecodes, possibly while that thread holds the event's lock in wait() or clear(),
    # and a second acquire there deadlocks (found in review). A non-blocking write never waits.
    readable, writable = os.pipe()
    os.set_blocking(readable, False)
    os.set_blocking(writable, False)

    def on_child(signum: int, frame: object) -> None:
        try:
            os.write(writable, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is pending anyway

    try:
        signal.signal(signal.SIGCHLD, on_child)
    except ValueError:  # not the main thread
        os.close(readable)
        os.close(writable)
        return False
    # SIGCHLD was ignored before: system calls in other threads must not fail with EINTR now.
    signal.siginterrupt(signal.SIGCHLD, False)

    class WakingTime:
        """``time`` for torch's agent module, whose ``sleep`` a child's exit ends."""

        def __getattr__(self, name: str) -> object:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            if select.select([readable], [], [], seconds)[0]:
                try:
                    while os.read(readable, 4096):
                        pass
                except BlockingIOError:
                    pass  # drained

    api.time = WakingTime()  # type: ignore[assignment]  # patching torch's module is the point
    return True


PERMANENT_EXIT_CODES = "LLMTRAIN_PERMANENT_EXIT_CODES"
"""Set by the launcher: the exit codes that mean retrying cannot help, comma-separated
(``llmtrain_contract.exitcodes``; spelled here, since this file imports nothing of the
project's packages)."""


def stop_on_permanent_exit(codes: frozenset[int]) -> bool:
    """Patch torch so that a worker group in which a rank exited with a permanent code is
    not restarted in place: the agent stops it and ends as failed. The launcher's
    supervisor ends torchrun for such an exit too, but torchrun's own monitor could restart
    the group first, and the new attempt then redid steps (from the newest checkpoint) for
    nothing before the supervisor's kill. False when this torch lacks what is patched."""
    try:
        from torch.distributed.elastic.agent.server.api import WorkerState  # noqa: PLC0415 - a torch without it runs unpatched
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent  # noqa: PLC0415
    except ImportError:
        return False
    monitor = getattr(LocalElasticAgent, "_monitor_workers", None)
    if monitor is None or not codes:
        return False

    def monitor_stopping_on_permanent(self, worker_group):
        result = monitor(self, worker_group)
        failures = getattr(result, "failures", None) or {}
        if result.state == WorkerState.FAILED and any(getattr(f, "exitcode", None) in codes for f in failures.values()):
            self._remaining_restarts = 0  # torch's loop then stops the group and returns the failure
        return result

    LocalElasticAgent._monitor_workers = monitor_stopping_on_permanent  # type: ignore[method-assign]  # patching torch's class is the point
    return True


def permanent_codes(text: str | None) -> frozenset[int]:
    return frozenset(int(c) for c in (text or "").split(",") if c.strip().isdigit())


JOIN_POLL_SECONDS = 0.25
"""Between two reads of the rendezvous state while joining or leaving a round, for a job of
up to ``JOIN_POLL_NODES`` nodes (torch: 1 s)."""
JOIN_POLL_NODES = 16
TORCH_POLL_SECONDS = 1.0


def join_poll_seconds(argv: list[str]) -> float:
    """The pace for torchrun's ``argv``: ``JOIN_POLL_SECONDS`` up to ``JOIN_POLL_NODES``
    nodes (``--nnodes``, its maximum), slower in proportion beyond, and never slower than
    torch's own: the state's reads, each of the whole state, grow with the square of the
    nodes."""
    nodes = 1
    for i, arg in enumerate(argv):
        if arg.startswith("--nnodes"):
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                nodes = int(value.split(":")[-1])
            except ValueError:
                pass
    return min(TORCH_POLL_SECONDS, JOIN_POLL_SECONDS * max(1.0, nodes / JOIN_POLL_NODES))


def poll_faster(poll: float = JOIN_POLL_SECONDS) -> bool:
    """Patch torch's rendezvous so that its operations re-read the state every ``poll``
    seconds (and read it fresh); False (nothing patched) when this torch has not what is
    relied on, or at torch's own pace (``poll`` of 1 s or more): there torch runs as it
    is. Measured with 64 agents on this 2-core machine (``bench/_rdzv_agents.py``): with
    this patch at a 1 s pace, 4 runs of 4 left agents out of the round (removed for late
    keep-alive beats); with only its 1 s delay, or unpatched, none of 5 did. Why is not
    known (docs/benchmarks.md, "Rendezvous at scale")."""
    if poll >= TORCH_POLL_SECONDS:
        return False
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr  # noqa: PLC0415 - a torch without it runs unpatched
    except ImportError:
        return False
    delay, executor = getattr(dr, "_delay", None), getattr(dr, "_DistributedRendezvousOpExecutor", None)
    run = getattr(executor, "run", None)
    if delay is None or executor is None or run is None:
        return False

    def shorter_delay(seconds):
        # The join loop's 1 s between reads; a (low, high) jitter range passes as it is.
        return delay(min(seconds, poll) if isinstance(seconds, (int, float)) else seconds)

    keep_alive = getattr(dr, "_RendezvousKeepAliveOp", ())

    def run_reading_fresh(self, state_handler, *args, **kwargs):
        holder = getattr(self, "_state_holder", None)
        if isinstance(state_handler, keep_alive) or holder is None or not hasattr(holder, "_cache_duration"):
            return run(self, state_handler, *args, **kwargs)
        # The keep-alive timer's thread runs operations too: restore the value from before
        # any operation, not whatever the other thread had set.
        base = holder.__dict__.setdefault("_llmtrain_cache_duration", holder._cache_duration)
        holder._cache_duration = 0  # 0: every sync reads the store
        try:
            return run(self, state_handler, *args, **kwargs)
        finally:
            holder._cache_duration = base

    dr._delay = shorter_delay
    executor.run = run_reading_fresh
    return True


ADMIT_AFTER_FIRST_STEP = "LLMTRAIN_ADMIT_AFTER_FIRST_STEP"
"""Set by the launcher to the pod's run dir when its ranks write heartbeat files (the
built-in trainer): waiting nodes are admitted after the group's first step. Unset (a
user's script, which writes none): torchrun's own rule, at once."""
ADMIT_AFTER_SECONDS = 60.0
"""The longest a waiting node is held back, from the end of the group's rendezvous."""


class FirstStepGate:
    """Whether the worker group that formed last has finished a step yet.

    ``formed`` is called when a rendezvous completes; a heartbeat whose first step ended
    after that is one of the group's ranks (the group's earlier ranks are gone by then, and
    had stamped their own first step before it)."""

    def __init__(self, read_first_steps: Callable[[], Iterable[float]], clock: Callable[[], float],
                 limit: float = ADMIT_AFTER_SECONDS):
        self._read, self._clock, self._limit = read_first_steps, clock, limit
        self._formed: float | None = None
        self.holding = False

    def formed(self) -> None:
        self._formed = self._clock()

    def holds(self) -> bool:
        """True while waiting nodes should stay out: a step of this group is still to come
        and the limit has not passed."""
        if self._formed is None or self._clock() - self._formed >= self._limit:
            return False
        return not any(stamp >= self._formed for stamp in self._read())


def _by_path(room: str, name: str) -> ModuleType:
    """The package's module ``room/name``, loaded by path: this file runs outside the package."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(package, room, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_llmtrain_agent_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a loadable module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def admit_after_first_step(run_dir: str, limit: float = ADMIT_AFTER_SECONDS) -> FirstStepGate | None:
    """Patch torch so that the agent reports no waiting node while its group has not
    finished a step (``FirstStepGate``); None (nothing patched) when this torch has not
    what is relied on."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent  # noqa: PLC0415 - a torch without it runs unpatched
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler  # noqa: PLC0415
    except ImportError:
        return None
    rendezvous = getattr(SimpleElasticAgent, "_rendezvous", None)
    waiting = getattr(DynamicRendezvousHandler, "num_nodes_waiting", None)
    if rendezvous is None or waiting is None:
        return None
    try:
        heartbeat = _by_path("pod", "heartbeat")
    except (OSError, ImportError, AttributeError, SyntaxError) as err:
        print(f"llmtrain torchrun agent: cannot read heartbeats ({err}); waiting nodes are admitted at once",
              file=sys.stderr, flush=True)
        return None
    gate = FirstStepGate(lambda: [b.first_step for b in heartbeat.read_all(run_dir)], heartbeat.clock, limit)

    def rendezvous_then_note(self, *args, **kwargs):
        result = rendezvous(self, *args, **kwargs)
        gate.formed()
        return result

    def waiting_after_first_step(self):
        count = waiting(self)
        if count > 0 and gate.holds():
            if not gate.holding:
                print(f"llmtrain torchrun agent: {count} node(s) waiting to join; admitted once this group has "
                      f"finished a step (at most {limit:.0f} s)", file=sys.stderr, flush=True)
            gate.holding = True
            return 0
        if count > 0 and gate.holding:
            print(f"llmtrain torchrun agent: admitting {count} waiting node(s)", file=sys.stderr, flush=True)
        gate.holding = False
        return count

    SimpleElasticAgent._rendezvous = rendezvous_then_note  # type: ignore[method-assign]  # patching torch's class is the point
    DynamicRendezvousHandler.num_nodes_waiting = waiting_after_first_step  # type: ignore[method-assign]  # patching torch's class is the point
    return gate


def read_state_safely() -> bool:
    """Patch torch so that its agents read the rendezvous state with the restricted
    unpickler (``pod/rdzvstate.py``): the store is reachable over the network, and a
    forged state naming a callable would otherwise run in this pod. With the job's token in
    the environment, the state is signed as it is written and its signature checked before
    it is read, so a pod without the token forges none at all. A refused state is a
    corrupt one to torchrun (``RendezvousStateError``); ``read_through_forgeries`` reads it
    again while the store puts back the last good one. False (nothing patched) when this
    torch reads its state otherwise."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: PLC0415 - a torch without it runs unpatched
        rdzvstate = _by_path("pod", "rdzvstate")
    except ImportError:
        return False
    if getattr(dynamic_rendezvous, "pickle", None) is not pickle:
        return False

    # The job's token signs what this agent writes and is checked on what it reads. It
    # leaves the environment here, before torchrun starts the ranks: a user's code has no
    # use for it.
    codec = rdzvstate.StateCodec(os.environ.pop(rdzvstate.TOKEN_ENV, None))

    class _RestrictedPickle:
        """What dynamic_rendezvous uses of the pickle module: the job's signature written
        and checked, and the restricted loads."""

        dumps = staticmethod(codec.dumps)
        loads = staticmethod(codec.loads)
        PickleError = pickle.PickleError
        UnpicklingError = pickle.UnpicklingError

    dynamic_rendezvous.pickle = _RestrictedPickle  # type: ignore[assignment]  # patching torch's module is the point
    return True


REFUSED_STATE_WAIT_SECONDS = 5.0
"""How long an agent reads a refused rendezvous state again before it fails as torchrun
would: the store's own process puts back the last good state within a poll (0.1 s,
``rendezvous/leases.py``), so a forgery costs the job nothing; a state still refused this
long after (no store of ours guards it) is corrupt to torchrun, as before."""
REFUSED_STATE_POLL_SECONDS = 0.1


def read_through_forgeries(wait: float = REFUSED_STATE_WAIT_SECONDS, poll: float = REFUSED_STATE_POLL_SECONDS) -> bool:
    """Patch torch so that an agent reading a rendezvous state it refuses (a forged one, or
    one that does not decode: ``RendezvousStateError``) reads it again for ``wait`` seconds
    instead of failing at once: every read of the state (a keep-alive beat, the check for
    waiting nodes, a join) goes through ``_BackendRendezvousStateHolder.sync``. False
    (nothing patched) when this torch has not that class."""
    import time  # noqa: PLC0415

    try:
        from torch.distributed.elastic.rendezvous.api import RendezvousStateError  # noqa: PLC0415 - a torch without it runs unpatched
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _BackendRendezvousStateHolder  # noqa: PLC0415
    except ImportError:
        return False
    sync = getattr(_BackendRendezvousStateHolder, "sync", None)
    if sync is None:
        return False

    def sync_through_forgeries(self):
        deadline = None
        while True:
            try:
                return sync(self)
            except RendezvousStateError as err:
                if deadline is None:
                    deadline = time.monotonic() + wait
                    cause = err.__cause__ if err.__cause__ is not None else err
                    print(f"llmtrain torchrun agent: refused the rendezvous state in the store ({str(cause)[:300]}); "
                          f"reading it again for up to {wait:.0f}s (the store puts back its last good state)",
                          file=sys.stderr, flush=True)
                if time.monotonic() >= deadline:
                    raise
                time.sleep(poll)

    _BackendRendezvousStateHolder.sync = sync_through_forgeries  # type: ignore[method-assign]  # patching torch's class is the point
    return True


HEAL_STORE = "LLMTRAIN_HEAL_STORE"
"""Set by the launcher for a job with in-process healing: ``host:port/run``, the job's
rendezvous store and run (``Env.HEAL_STORE``; spelled here, since this file imports
nothing of the project's packages)."""
VICTIM_EXIT_CODES = "LLMTRAIN_VICTIM_EXIT_CODES"
"""Set with it: the exit codes of a rank that ended because a peer failed."""


def restart_key(run: str, master_addr: str, master_port: int, world_size: int, rank: int) -> str:
    """The store key counting ``rank``'s in-place restarts: what the ranks read as
    ``healround.RESTARTING`` under ``train/heal.py``'s prefix."""
    return f"llmtrain/heal/{run}/{master_addr}:{master_port}/{world_size}/restarting/{rank}"


def seat_prefix(run: str, master_addr: str, master_port: int, world_size: int) -> str:
    """The store keys of one torchrun rendezvous's heal rounds (``train/heal.py``'s prefix)."""
    return f"llmtrain/heal/{run}/{master_addr}:{master_port}/{world_size}"


def current_key(run: str) -> str:
    """Which rendezvous the job's heal rounds are in now: a new agent looks there for an
    offered seat."""
    return f"llmtrain/heal/{run}/current"


OFFER_WAIT_SECONDS = 6.0
"""How long a new agent waits for the survivors' offer while torchrun's finished round has
fewer agents than it needs (a lost one dropped by its lease or its lapsed keep-alive): the
survivors offer a seat a quarter of a second into their wait (``healround.OFFER_SECONDS``),
on a loaded machine later; a replacement rarely comes sooner."""
TAKEN = "taken "
"""``healround.TAKEN``: the prefix of a claim that an agent won (spelled here, see above)."""


def _parse_endpoint(heal_store: str) -> tuple[str, int, str] | None:
    endpoint, _, run = heal_store.partition("/")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not run:
        return None
    return host, int(port), run


def _client(host: str, port: int, clients: dict[tuple[str, int], object]) -> object:
    import datetime  # noqa: PLC0415

    from torch.distributed import TCPStore  # noqa: PLC0415

    if (host, port) not in clients:
        clients[(host, port)] = TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10), use_libuv=True)
    return clients[(host, port)]


def _seat_record(raw: bytes) -> dict | None:
    """An agent's seat record (``healround.SEAT``), or None when it is not one: what the
    store holds may come from any pod that reaches it, and is checked before use."""
    try:
        if len(raw) > 1 << 16:
            return None
        seat = json.loads(raw)
        ints = [seat["group"], seat["groups"], seat["min_groups"], seat["round"], seat["master_port"]]
        workers = seat["workers"]
        ok = (all(type(x) is int and x >= 0 for x in ints) and isinstance(seat["holder"], str)
              and isinstance(seat["master_addr"], str) and isinstance(workers, list) and workers
              and all(isinstance(w, list) and len(w) == 5 and all(type(x) is int and x >= 0 for x in w) for w in workers)
              and [w[0] for w in workers] == list(range(len(workers))) and seat["ranks"] == [w[1] for w in workers]
              and len({w[3] for w in workers}) == 1)
        return seat if ok else None
    except (ValueError, KeyError, TypeError):
        return None


def take_offered_seats(heal_store: str, clients: dict[tuple[str, int], object] | None = None) -> bool:
    """Patch torch so that, with in-process healing, each agent records its *seat* after a
    rendezvous (its group rank, its ranks and torchrun's fields for them, ``healround.SEAT``)
    and a new agent takes a seat that the survivors offer (a node lost whole, in a job that
    cannot go on without it) instead of joining the rendezvous: torchrun would re-form
    every node's group for a node that joins. A seat is taken only while no agent of
    torchrun's finished round holds its group rank (the lost one was dropped: its lease
    ended, or its keep-alive lapsed). The new agent puts itself into that round in the lost
    one's place (``join_round``), takes its group rank, master address and store, counts
    its ranks' restarts (so the survivors wait for them, as for a crashed rank's) and starts
    them with the lost ranks' numbers; they get the state from a survivor. Only an agent's
    first rendezvous looks for an offer; none offered, it joins the rendezvous as torch
    does. False when this torch lacks what is relied on or
    ``heal_store`` is not ``host:port/run``."""
    try:
        import torch.distributed as dist  # noqa: PLC0415 - a torch without it runs unpatched
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, Worker  # noqa: PLC0415
    except ImportError:
        return False
    rendezvous = getattr(SimpleElasticAgent, "_rendezvous", None)
    parsed = _parse_endpoint(heal_store)
    if rendezvous is None or parsed is None:
        return False
    host, port, run = parsed
    clients = {} if clients is None else clients
    me = f"{socket.gethostname()}/{os.getpid()}/{time.time_ns()}"
    first = [True]

    def rendezvous_or_take_seat(self, worker_group):
        handler = worker_group.spec.rdzv_handler
        if first[0]:
            first[0] = False
            try:
                if take_seat(self, worker_group, handler):
                    return None
            except Exception as err:  # noqa: BLE001 - then the rendezvous, as torch does
                print(f"llmtrain torchrun agent: cannot look for an offered seat ({type(err).__name__}: {err}); joining "
                      "the rendezvous", file=sys.stderr, flush=True)
        result = rendezvous(self, worker_group)
        try:
            record_seat(worker_group, handler)
        except Exception as err:  # noqa: BLE001 - then a lost node of this rendezvous is not healed in process
            print(f"llmtrain torchrun agent: cannot record this node's seat in the store ({type(err).__name__}: {err})",
                  file=sys.stderr, flush=True)
        return result

    def record_seat(worker_group, handler) -> None:
        state = getattr(getattr(handler, "_state_holder", None), "state", None)
        settings = getattr(handler, "_settings", None)
        if state is None or settings is None:
            return
        workers = [[w.local_rank, w.global_rank, w.role_rank, w.world_size, w.role_world_size] for w in worker_group.workers]
        world = worker_group.workers[0].world_size
        prefix = seat_prefix(run, worker_group.master_addr, worker_group.master_port, world)
        seat = {"group": worker_group.group_rank, "holder": me, "ranks": [w[1] for w in workers],
                "groups": worker_group.group_world_size, "min_groups": settings.min_nodes, "round": state.round,
                "master_addr": worker_group.master_addr, "master_port": worker_group.master_port, "workers": workers}
        store = _client(host, port, clients)
        store.set(f"{prefix}/seat/{worker_group.group_rank}", json.dumps(seat))  # type: ignore[attr-defined]
        store.set(current_key(run), json.dumps({"prefix": prefix, "groups": worker_group.group_world_size,  # type: ignore[attr-defined]
                                                "min_groups": settings.min_nodes}))

    def take_seat(self, worker_group, handler) -> bool:
        store = _client(host, port, clients)
        if not store.check([current_key(run)]):  # type: ignore[attr-defined]
            return False  # the job's first rendezvous
        current = json.loads(store.get(current_key(run)))  # type: ignore[attr-defined]
        prefix, groups, min_groups = str(current["prefix"]), int(current["groups"]), int(current["min_groups"])
        if not prefix.startswith(f"llmtrain/heal/{run}/") or not 0 < min_groups <= groups <= 1 << 16:
            return False
        holder, run_id = getattr(handler, "_state_holder", None), getattr(getattr(handler, "_settings", None), "run_id", None)
        if holder is None or run_id is None or getattr(handler, "_store", None) is None:
            return False
        deadline = time.monotonic() + OFFER_WAIT_SECONDS
        while True:
            holder.sync()
            state = holder.state
            # Only while torchrun's finished round cannot go on without a replacement: the
            # survivors' rule for offering (fewer nodes left than --nnodes' minimum).
            if not state.complete or state.closed or len(state.participants) >= min_groups:
                return False
            if take_offered(self, worker_group, handler, store, prefix, groups, run_id):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def take_offered(self, worker_group, handler, store, prefix: str, groups: int, run_id: str) -> bool:
        state = handler._state_holder.state
        held = set(state.participants.values())
        for group in range(groups):
            if group in held:
                continue  # its agent is in torchrun's round: an offer is for a restart it is still counting
            key = f"{prefix}/seat/{group}"
            if not store.check([key]):
                continue
            seat = _seat_record(store.get(key))
            if (seat is None or seat["group"] != group or seat["groups"] != groups or seat["round"] != state.round
                    or len(seat["workers"]) != worker_group.spec.local_world_size
                    or seat_prefix(run, seat["master_addr"], seat["master_port"], seat["workers"][0][3]) != prefix):
                continue  # not this rendezvous's seat (forged, or from another round)
            claim = f"{prefix}/claim/{group}/{seat['holder']}"
            if not store.check([claim]) or store.get(claim) != b"open":
                continue
            mine = TAKEN + me
            if store.compare_set(claim, "open", mine) != mine.encode():
                continue  # another replacement, or a survivor's withdrawal, came first
            try:
                if not join_round(handler, group, state.round, groups):
                    store.compare_set(claim, mine, "open")  # the round moved on, or the rank is held after all
                    return False
            except BaseException:
                store.compare_set(claim, mine, "open")
                raise
            store.set(key, json.dumps({**seat, "holder": me}))
            for rank in seat["ranks"]:
                store.add(restart_key(run, seat["master_addr"], seat["master_port"], seat["workers"][0][3], rank), 1)
            agent_store = dist.PrefixStore(f"torch.rendezvous.{run_id}.{seat['round']}", handler._store)
            self._store = agent_store  # what torch's exit barrier counts the job's agents in
            worker_group.workers = [Worker(local_rank=lr, global_rank=g, role_rank=r, world_size=w, role_world_size=rw)
                                    for lr, g, r, w, rw in seat["workers"]]
            worker_group.store = agent_store
            worker_group.group_rank, worker_group.group_world_size = group, seat["groups"]
            worker_group.master_addr, worker_group.master_port = seat["master_addr"], seat["master_port"]
            print(f"llmtrain torchrun agent: took the seat of a lost node (group rank {group} of {seat['groups']}, ranks "
                  f"{seat['ranks']}, rendezvous round {seat['round']}) that its peers offered; its ranks heal from them "
                  "in process", file=sys.stderr, flush=True)
            return True
        return False

    def join_round(handler, group: int, round_: int, groups: int) -> bool:
        """Put this agent into torchrun's finished round as group rank ``group``, in the
        place of the agent that was dropped from it, and start its keep-alive: from then on
        it is a participant as any other, its seat held (no one else takes it) until its
        lease ends or its beats lapse, and a later rendezvous takes it out as any. Written
        with the state's compare-and-set, as torch's own operations are; False when the
        round moved on or the rank is held."""
        from datetime import UTC, datetime  # noqa: PLC0415

        holder = handler._state_holder
        for _ in range(20):
            state = holder.state
            if (state.round != round_ or not state.complete or state.closed or len(state.participants) >= groups
                    or group in state.participants.values()):
                return False
            state.participants[handler._this_node] = group
            state.last_heartbeats[handler._this_node] = datetime.now(UTC)
            holder.mark_dirty()
            if holder.sync():  # written; else another agent's write came first and the state was read again
                handler._start_heartbeats()
                return True
        return False

    SimpleElasticAgent._rendezvous = rendezvous_or_take_seat  # type: ignore[method-assign]  # patching torch's class is the point
    return True


def restart_in_place(heal_store: str, victim_codes: frozenset[int], permanent: frozenset[int] = frozenset()) -> bool:
    """Patch torch so that a worker group whose ranks failed on their own (a crash, not
    as the victims of a peer) is restarted *in place*: the same ranks and world size, no
    rendezvous, so that the job's other nodes keep their processes, which heal in process
    (``train/heal.py``) and wait for exactly these ranks. Each restarted rank is counted
    in the store first (``healround.RESTARTING``): a survivor waits only for a rank that
    some agent restarts. With several ranks a node, torch's poll stops the others as soon
    as one failed and waits for them to end; the count is made before that, for all of
    them, and a stopped rank gives up its round (``healround.HealStopped``), so that its
    exit as a victim still leaves the group's failure its own. Anything else (victims
    first, a waiting node, a store that cannot be reached) restarts as torch does: stop,
    rendezvous, start. False when this torch lacks what is patched or ``heal_store`` is
    not ``host:port/run``."""
    try:
        import datetime  # noqa: PLC0415

        from torch.distributed import TCPStore  # noqa: PLC0415 - a torch without it runs unpatched
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerState  # noqa: PLC0415
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent  # noqa: PLC0415
        from torch.distributed.elastic.multiprocessing.api import SubprocessContext  # noqa: PLC0415
    except ImportError:
        return False
    monitor, restart = getattr(LocalElasticAgent, "_monitor_workers", None), getattr(SimpleElasticAgent, "_restart_workers", None)
    poll = getattr(SubprocessContext, "_poll", None)
    endpoint, _, run = heal_store.partition("/")
    host, _, port = endpoint.rpartition(":")
    if monitor is None or restart is None or poll is None or not host or not port.isdigit() or not run:
        return False
    last: dict[str, object] = {}
    stores: list[object] = []

    def monitor_noting(self, worker_group):
        last["group"], last["agent"] = worker_group, self
        last["result"] = result = monitor(self, worker_group)
        return result

    def poll_announcing(self):
        # torch's poll stops the group's other ranks as soon as one has failed (SIGTERM,
        # then up to 30 s for them to exit) before the agent can restart anything. Those
        # are restarted too; their peers on other nodes must know it before, or they give
        # up on the round after ANNOUNCE_SECONDS: so a rank's own failure (not a victim's
        # exit) is counted here, for every rank of the group, before torch's poll.
        # Only a restart the agent will make: none once its budget is spent or for a
        # permanent exit (``stop_on_permanent_exit``), or the peers would wait for it until
        # their collective timeout instead of giving up after ANNOUNCE_SECONDS. (Judged on
        # the ranks ended by now: a stopped rank that then exits with a permanent code
        # still leaves them waiting that long.)
        group = last.get("group")
        budget = getattr(last.get("agent"), "_remaining_restarts", 0)
        if group is not None and "announced" not in last and budget > 0:
            try:
                codes = [h.proc.poll() for lr, h in self.subprocess_handlers.items() if lr in self._running_local_ranks]
            except (AttributeError, TypeError):  # another torch's insides: counted later, as before
                codes = []
            failed = [code for code in codes if code not in (None, 0)]
            if failed and not any(code in victim_codes or code in permanent for code in failed):
                try:
                    count_restarts(group)
                    last["announced"] = group
                except Exception as err:  # noqa: BLE001 - counted later, or restarted through a rendezvous
                    print(f"llmtrain torchrun agent: cannot count the restart in the store ({err})", file=sys.stderr, flush=True)
        return poll(self)

    def count_restarts(worker_group) -> None:
        if not stores:
            stores.append(TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=10), use_libuv=True))
        store = stores[0]
        for worker in worker_group.workers:
            key = restart_key(run, worker_group.master_addr, worker_group.master_port, worker.world_size, worker.global_rank)
            store.add(key, 1)  # type: ignore[attr-defined]

    def restart_failed_in_place(self, worker_group):
        result = last.pop("result", None)
        announced = last.pop("announced", None) is worker_group
        failures = getattr(result, "failures", None) or {}
        # Own: a rank failed on its own. The others of the group that torch stopped then
        # may have ended as victims (their round given up, exit 83): with the restart
        # announced first, that is still this group's own failure.
        own = (getattr(result, "state", None) == WorkerState.FAILED and failures
               and (announced or not any(getattr(f, "exitcode", None) in victim_codes for f in failures.values())))
        if not own:
            return restart(self, worker_group)
        try:
            if not announced:
                count_restarts(worker_group)
        except Exception as err:  # noqa: BLE001 - then the peers cannot wait for these ranks: restart as torch does
            print(f"llmtrain torchrun agent: cannot count the restart in the store ({err}); restarting through a "
                  "rendezvous", file=sys.stderr, flush=True)
            return restart(self, worker_group)
        ranks = sorted(w.global_rank for w in worker_group.workers)
        codes = sorted({getattr(f, "exitcode", None) for f in failures.values()}, key=str)
        print(f"llmtrain torchrun agent: rank(s) {ranks} failed (exit {codes}); restarting them in place, their peers "
              "heal in process", file=sys.stderr, flush=True)
        self._stop_workers(worker_group)
        worker_group.state = WorkerState.STOPPED
        for local_rank, worker_id in self._start_workers(worker_group).items():
            worker_group.workers[local_rank].id = worker_id
        worker_group.state = WorkerState.HEALTHY

    LocalElasticAgent._monitor_workers = monitor_noting  # type: ignore[method-assign]  # patching torch's class is the point
    SubprocessContext._poll = poll_announcing  # type: ignore[method-assign]  # patching torch's class is the point
    SimpleElasticAgent._restart_workers = restart_failed_in_place  # type: ignore[method-assign]  # patching torch's class is the point
    return True


def main() -> None:
    read_state_safely()
    read_through_forgeries()
    keep_open_on_failure()
    wake_on_worker_exit()
    stop_on_permanent_exit(permanent_codes(os.environ.get(PERMANENT_EXIT_CODES)))
    poll_faster(join_poll_seconds(sys.argv[1:]))
    if os.environ.get(HEAL_STORE):
        # Before the first-step gate's patch, which so wraps it: a taken seat forms a group too.
        take_offered_seats(os.environ[HEAL_STORE])
    if os.environ.get(ADMIT_AFTER_FIRST_STEP):
        admit_after_first_step(os.environ[ADMIT_AFTER_FIRST_STEP])
    if os.environ.get(HEAL_STORE):
        restart_in_place(os.environ[HEAL_STORE], permanent_codes(os.environ.get(VICTIM_EXIT_CODES)),
                         permanent_codes(os.environ.get(PERMANENT_EXIT_CODES)))
    from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: PLC0415
    from torch.distributed.run import main as torchrun  # noqa: PLC0415 - after the patch

    try:
        torchrun()
    except SignalException as err:
        # torchrun turns the signal that stops it (the pod's SIGTERM, passed on by the
        # launcher) into an exception whose 40-line traceback says nothing the launcher
        # does not: one line, and the exit code an uncaught exception gives (1), which the
        # launcher reads as it did before.
        print(f"torchrun agent: stopped by {signal.Signals(err.sigval).name}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
