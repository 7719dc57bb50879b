"""Rendezvous leases: a worker pod that is gone leaves the rendezvous at once.

torchrun's c10d rendezvous drops a node only when its keep-alive beats have stopped for
``keep_alive_interval × keep_alive_max_attempt`` (3 s here). When a whole worker pod dies
(SIGKILL of its processes, the OOM killer, a deleted pod), the survivors' agents re-join
at once, find the dead agent still listed as a participant of the finished round, wait in
the next round's wait list until its beats lapse, then poll the state once a second:
seconds of a recovery spent waiting for a node that everybody could know is gone.

Each worker pod's launcher holds a *lease*: one TCP connection to the store's process
(the rendezvous port + 1) that names its torchrun agent as torchrun's node descriptor
does (its ``--local-addr``, a pod's IP, or the host's names, and the agent's pid). The
connection ends when the pod's processes die (the kernel closes their sockets) or the
launcher exits; the store then removes that agent from the rendezvous state itself, with the same compare-and-set and the same
epilogue as torchrun's own dead-node check. A frozen or partitioned pod keeps its
connection open, so for those the keep-alive still decides, as before.

The leases also end a round's *last call* early. torchrun completes a round once
``min_nodes`` agents joined and the last call (1 s) has passed, in case more join. The
store knows every pod that holds a lease: once each of them has joined the forming round,
no other agent it knows of could, so it completes the round at once, as torchrun would
(ranks by sorted node). A survivor re-forming its group after a crash gains the last call;
an agent the store does not know (no lease yet) joins the next round, as one that came
after the last call does.

The same port echoes bytes for a launcher's pre-flight check (``launch/preflight.py``): a
first line ``{"echo": N}`` (N at most ``ECHO_LIMIT``) gets its next N bytes sent back as
they come, ``ECHO_SLOTS`` such connections at once; the rate the launcher measures is the
rate of its node's path to the store.

The store's process also guards the rendezvous state (``StateGuard``): the state lives
pickled in the store, which any pod that reaches the store's port can write. Ten times a
second it reads the state of the store's run (and of every run with a lease held) with the
restricted unpickler the agents use (``pod/rdzvstate.py``); a state it refuses (a forgery
naming a callable, bytes that do not decode, and with the job's token one not signed with
it) is replaced by the last good one it read, with compare-and-set, and logged. The agents
read a refused state again for a few seconds before failing (``launch/torchrun_agent.py``),
so the job trains on.

The job's token (``rdzvstate.TOKEN_ENV``, from the Secret the operator makes for the job,
in the store's pod and the workers'): the store then signs the states it writes as the
agents do, and takes a lease or an echo only from a line that carries an HMAC of itself
under the token (``mac``): a pod without the token can neither forge a state (not even
one made of torchrun's own types) nor end a live agent's lease. Without a token (a store
started by hand) everything is accepted unsigned, as torchrun's own store does.

Everything here is best effort: a store that cannot serve leases, a launcher that cannot
reach it, a state that cannot be edited, each leaves the rendezvous to the keep-alive and
the last call.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import socket
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

from llmtrain_contract.command import torchrun_flag
from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET as PORT_OFFSET

from llmtrain_trainer.pod.rdzvstate import StateCodec, purpose_key

HELLO_LIMIT = 4096
HELLO_TIMEOUT_SECONDS = 10
"""A connection that sends no hello line in this long is dropped."""
MAX_CONNECTIONS = 1024
"""Connections held at once (a lease per worker pod, each a thread): more are closed."""
ROUND_POLL_SECONDS = 0.1
"""How often the store looks for a forming round that every lease holder has joined."""
KEEPALIVE = (10, 5, 3)
"""TCP keep-alive of a held lease: the first probe after 10 s idle, then one every 5 s;
3 unanswered end it (about 25 s)."""
RECONNECT_SECONDS = (0.5, 5.0)
"""First and longest wait before the launcher connects again."""
ECHO_LIMIT = 16 << 20
"""Bytes one pre-flight echo may ask for."""
ECHO_SLOTS = 4
"""Echoes served at once; a launcher that finds none free is told so at once (``busy``)
and skips its check: many pods joining together (a restart of every worker) must not
queue behind one another's checks."""
ECHO_CHUNK = 256 << 10
ECHO_TIMEOUT_SECONDS = 10.0
"""A pre-flight connection that sends nothing for this long is dropped."""


# --- the store's side -----------------------------------------------------------------

def same_host(node_addr: str, addr: str) -> bool:
    """Whether torchrun's node address names the agent's host ``addr``: equal, or, for a
    host name, the first labels match. Without ``--local-addr`` torchrun takes
    ``socket.getfqdn()``, which depends on DNS at the moment it asked (a pod's record may
    not exist yet); the host name does not, and a pod's is its name, unique in the job."""
    if node_addr == addr:
        return True
    try:
        ipaddress.ip_address(addr.strip("[]"))
        return False  # an address (``--local-addr``) must match exactly
    except ValueError:
        return node_addr.split(".")[0] == addr.split(".")[0]


def is_agent(node: Any, names: list[str], pid: int) -> bool:
    """Whether torchrun's node descriptor ``node`` is the agent ``pid`` on the host called
    any of ``names``."""
    return node.pid == pid and any(same_host(node.addr, name) for name in names)


def drop_node(state: Any, addr: str | list[str], pid: int, min_nodes: int) -> bool:
    """Remove the agent ``(addr, pid)`` (``addr``: its name, or a list of its names) from
    torchrun's rendezvous ``state`` in place, as torchrun's dead-node check does: from the
    participants, the wait and redundancy lists and the heartbeats; a finished round left
    without participants moves to the next one, an unfinished one below ``min_nodes``
    loses its deadline. True if anything changed."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _remove_participant_epilogue  # noqa: PLC0415

    lists = [state.wait_list, getattr(state, "redundancy_list", set())]
    known = set(state.participants) | set(state.last_heartbeats) | set().union(*lists)
    names = [addr] if isinstance(addr, str) else addr
    gone = [node for node in known if is_agent(node, names, pid)]
    if not gone:
        return False
    removed = False
    for node in gone:
        state.last_heartbeats.pop(node, None)
        for members in lists:
            members.discard(node)
        if node in state.participants:
            del state.participants[node]
            removed = True
    if removed:
        # torch's private epilogue reads ``settings.min_nodes`` alone; the rest of a real
        # RendezvousSettings (timeouts, keep-alives, run id) means nothing here.
        _remove_participant_epilogue(state, SimpleNamespace(min_nodes=min_nodes))  # type: ignore[arg-type]  # duck-typed on purpose
    return True


def _holds(node: Any, hello: dict[str, Any]) -> bool:
    """Whether torchrun's node descriptor ``node`` is the agent of lease ``hello``."""
    return is_agent(node, [hello["addr"], *hello["aliases"]], hello["pid"])


def complete_if_all_joined(state: Any, hellos: list[dict[str, Any]]) -> bool:
    """Complete torchrun's forming round in ``state`` in place, as its last participant
    would after the last call, when the agent of every lease in ``hellos`` (those held for
    this run) has joined it and it has ``min_nodes`` participants. True if completed."""
    if not hellos or state.closed or state.complete or state.deadline is None:
        return False
    if len(state.participants) < max(h["min_nodes"] for h in hellos):
        return False
    if not all(any(_holds(node, hello) for node in state.participants) for hello in hellos):
        return False
    state.complete, state.deadline = True, None
    for rank, node in enumerate(sorted(state.participants)):
        state.participants[node] = rank
    return True


STATE_KEY_PREFIX = "torch.rendezvous."
"""torchrun's c10d backend keeps run ``R``'s state under ``torch.rendezvous.R``, base64 of
its pickle (or the backend's sentinel while there is none)."""
NO_STATE = b"Y2FuaW1hZGFt"
"""The c10d backend's sentinel for "no state yet"."""
FORGERY_REPORT_SECONDS = 10.0
"""A run's forgeries after its first are logged at most this often, with their count."""


class StateGuard:
    """The last good rendezvous state of each run, put back over one the agents would
    refuse. ``check`` is called with the store's lock held."""

    def __init__(self, codec: StateCodec | None = None, clock: Any = time.monotonic):
        self.codec = codec or StateCodec(None)
        self.good: dict[str, bytes] = {}
        self.read: tuple[Any, bytes] | None = None
        """The last ``check``'s good state, decoded, and its raw value (the backend's token):
        the round check that follows edits it without reading and decoding it again."""
        self.refused: dict[str, tuple[int, float]] = {}  # run -> forgeries since the last report, when reported
        self._clock = clock

    def check(self, store: Any, run_id: str) -> bool:
        """True when run ``run_id``'s state in ``store`` reads as torchrun's own, signed with
        the job's token where there is one (or there is none yet); False after a refused
        one, put back if a good one was seen."""
        key = STATE_KEY_PREFIX + run_id
        raw = store.get(key)
        self.read = None
        if raw == NO_STATE:
            return True
        try:
            state = self.codec.loads(base64.b64decode(raw))
        except Exception as err:  # noqa: BLE001 - ForgedState, or base64 that does not decode: both refused
            good = self.good.get(run_id)
            if good is None:
                self._report(run_id, f"{err}; no good state seen yet to put back")
                return False
            now = store.compare_set(key, raw, good)
            self._report(run_id, f"{err}; " + ("the last good state put back" if now == good
                                                else "it changed again meanwhile: checked again at the next poll"))
            return False
        self.good[run_id] = raw
        self.read = (state, raw)
        return True

    def _report(self, run_id: str, what: str) -> None:
        count, last = self.refused.get(run_id, (0, float("-inf")))
        now = self._clock()
        if now - last < FORGERY_REPORT_SECONDS:
            self.refused[run_id] = (count + 1, last)
            return
        more = f" ({count} more since the last report)" if count else ""
        print(f"rendezvous leases: refused a forged rendezvous state of rendezvous {run_id!r}{more}: {what[:400]}",
              file=sys.stderr, flush=True)
        self.refused[run_id] = (0, now)


def backend_for(store: Any, run_id: str) -> Any:
    """torchrun's own view of run ``run_id``'s rendezvous state in ``store`` (its c10d
    backend: made once per run, it writes the key's initial value)."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend  # noqa: PLC0415

    return C10dRendezvousBackend(store, run_id)


def _edit(backend: Any, change: Any, codec: StateCodec, attempts: int = 20, first: tuple[Any, bytes] | None = None) -> Any:
    """Apply ``change(state) -> bool`` to the rendezvous state of ``backend`` with
    compare-and-set, again when another node wrote it in between; the state written, or
    None when ``change`` changed nothing (or no state exists). ``codec`` reads and writes
    it as the agents do (signed with the job's token). ``first``: the state just read
    (decoded, and its token), for the first attempt."""
    for attempt in range(attempts):
        if attempt == 0 and first is not None:
            state, token = first
        else:
            current = backend.get_state()
            if current is None:
                return None
            bits, token = current
            state = codec.loads(bits)
        if not change(state):
            return None
        written = backend.set_state(codec.dumps(state), token)
        if written is not None and written[2]:
            return state
    return None


def release(store: Any, run_id: str, addr: str | list[str], pid: int, min_nodes: int, attempts: int = 20,
            codec: StateCodec | None = None) -> bool:
    """Take the agent out of run ``run_id``'s rendezvous held in ``store`` (a c10d
    Store); retries when another node wrote the state in between. True if removed."""
    return _edit(backend_for(store, run_id), lambda state: drop_node(state, addr, pid, min_nodes), codec or StateCodec(None),
                 attempts) is not None


def line_mac(key: bytes, fields: dict[str, Any]) -> str:
    """The HMAC (hex) of a lease's hello or an echo request, every field but ``mac`` in
    canonical JSON, under the token's key for leases."""
    body = json.dumps({k: v for k, v in fields.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def check_mac(key: bytes | None, fields: dict[str, Any]) -> None:
    """ValueError unless ``fields`` carry the HMAC of themselves under ``key`` (None: the
    store has no token, nothing to check)."""
    if key is None:
        return
    mac = fields.get("mac")
    if not isinstance(mac, str):
        raise ValueError("it carries no MAC of the job's token (a pod of another job, or an older launcher)")
    if not hmac.compare_digest(mac.encode(), line_mac(key, fields).encode()):
        raise ValueError("its MAC does not match the job's token")


def parse_hello(line: bytes, key: bytes | None = None) -> dict[str, Any]:
    """A launcher's first line: ``{"run_id", "addr", "pid", "min_nodes"}``, optional
    ``"aliases"`` (other names of the host) and ``"mac"`` (``line_mac``, checked under
    ``key``, the store's token's, over the fields as sent); ValueError names what is
    wrong."""
    hello = json.loads(line)
    if not isinstance(hello, dict):
        raise ValueError("not a JSON object")
    for field, kind in (("run_id", str), ("addr", str), ("pid", int), ("min_nodes", int)):
        if not isinstance(hello.get(field), kind) or isinstance(hello.get(field), bool):
            raise ValueError(f"{field!r} missing or not {kind.__name__}")
    check_mac(key, hello)
    aliases = hello.setdefault("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ValueError("'aliases' not a list of names")
    return hello


def parse_echo(line: bytes, key: bytes | None = None) -> int | None:
    """The byte count of a pre-flight echo request ``{"echo": N}`` (and its ``mac`` under
    ``key``, the store's token's); None for any other line (a lease's hello). ValueError
    names a request out of bounds or without the token's MAC."""
    try:
        request = json.loads(line)
    except ValueError:
        return None
    if not isinstance(request, dict) or "echo" not in request or not set(request) <= {"echo", "mac"}:
        return None
    n = request["echo"]
    if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= ECHO_LIMIT:
        raise ValueError(f"an echo of {str(n)[:20]} bytes (1..{ECHO_LIMIT})")
    check_mac(key, request)
    return n


def echo(conn: socket.socket, n: int) -> None:
    """Send back the next ``n`` bytes of ``conn`` as they come, a chunk at a time (memory
    bounded by the chunk, whatever ``n``)."""
    conn.settimeout(ECHO_TIMEOUT_SECONDS)
    left = n
    while left:
        chunk = conn.recv(min(ECHO_CHUNK, left))
        if not chunk:
            return
        conn.sendall(chunk)
        left -= len(chunk)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)  # an IPv4 peer on a dual-stack socket
    return mapped or ip


def impostor(hello: dict[str, Any], peer: str, resolve: Any = socket.getaddrinfo) -> str | None:
    """Why a hello cannot be the agent it names, or None. A lease names its agent by
    address and pid, and its end removes that agent from the rendezvous: a forged hello
    naming a live agent, then closed, would drop it. An address must be the connection's
    own (a pod cannot send from another pod's IP); a host name (no ``--local-addr``, a
    local run) must come from this host or resolve to the connection's address."""
    source = _ip(peer)
    if source is None:
        return f"the connection's address {peer!r} is not an IP address"
    if _ip(hello["addr"]) is not None and hello["aliases"]:
        # A launcher with --local-addr sends no aliases; the lease releases every name it
        # lists, so an alias would let a hello from here name an agent elsewhere.
        return f"it names the agent at {hello['addr']} and aliases {hello['aliases'][:3]}"
    for name in [hello["addr"], *hello["aliases"]]:
        claimed = _ip(name)
        if claimed is not None:
            if claimed != source:
                return f"it names the agent at {name} but comes from {peer}"
            continue
        if source.is_loopback:
            continue  # a host name from this host: a local run, every agent is here
        try:
            if not any(_ip(info[4][0]) == source for info in resolve(name, None, type=socket.SOCK_STREAM)):
                return f"it names the host {name!r}, which does not resolve to {peer}"
        except (OSError, UnicodeError):
            return f"it names the host {name!r}, which does not resolve"
    return None


def _keep_alive(conn: socket.socket) -> None:
    """TCP keep-alive probes on a held lease: a pod whose node lost power sends no FIN,
    and its lease would stay held for good (the store would then never again complete a
    round early, waiting for it to join). The probes end it in about 25 s (``KEEPALIVE``)."""
    idle, interval, count = KEEPALIVE
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, option):  # Linux; elsewhere the system's defaults
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class LeaseServer:
    """Accepts leases on ``port`` beside ``store`` (the c10d store holding the rendezvous
    states), releases each agent whose lease ends, and completes a forming round once
    every lease holder of its run has joined it."""

    def __init__(self, host: str, port: int, store: Any, round_poll_seconds: float = ROUND_POLL_SECONDS,
                 run_id: str | None = None, max_connections: int = MAX_CONNECTIONS, token: str | None = None):
        # run_id: the only rendezvous whose leases this store accepts (its job's); None: any.
        # token: the job's; leases and echoes must carry its MAC, states are signed with it.
        self.run_id, self.max_connections = run_id, max_connections
        self.key = purpose_key(token, "lease") if token else None
        self.codec = StateCodec(token)
        self.connections = 0
        self.sock = socket.create_server((host, port))
        self.port = self.sock.getsockname()[1]
        self.store: Any = store
        self.lock = threading.Lock()  # one client connection to the store, one edit at a time
        self.held: dict[int, dict[str, Any]] = {}  # open leases by connection
        self.held_lock = threading.Lock()
        self.stopped = threading.Event()
        self.reported: set[str] = set()
        self.backends: dict[str, Any] = {}  # run -> its backend, for the round checks ten times a second
        self.guard = StateGuard(self.codec)
        self.echo_slots = threading.BoundedSemaphore(ECHO_SLOTS)
        threading.Thread(target=self._accept, name="rdzv-leases", daemon=True).start()
        threading.Thread(target=self._complete_rounds, args=(round_poll_seconds,), name="rdzv-rounds", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                if self.stopped.is_set():
                    return  # closed
                self.stopped.wait(0.1)  # out of file descriptors for a moment: not a busy loop
                continue
            with self.held_lock:
                full = self.connections >= self.max_connections
                if not full:
                    self.connections += 1
            if full:
                conn.close()  # a lease per worker pod: this many is a flood, not a job
                continue
            try:
                threading.Thread(target=self._hold, args=(conn, peer[0]), name="rdzv-lease", daemon=True).start()
            except RuntimeError:  # no thread to be had: this connection goes, the loop stays
                conn.close()
                with self.held_lock:
                    self.connections -= 1

    def _hold(self, conn: socket.socket, peer: str) -> None:
        try:
            self._serve_lease(conn, peer)
        finally:
            with self.held_lock:
                self.connections -= 1

    def _serve_lease(self, conn: socket.socket, peer: str) -> None:
        with conn:
            try:
                conn.settimeout(HELLO_TIMEOUT_SECONDS)
                line = _first_line(conn)
                if (n := parse_echo(line, self.key)) is not None:
                    try:
                        self._echo(conn, n)
                    except OSError:
                        pass  # the launcher ended its round (its deadline), or went: nothing to keep
                    return
                hello = parse_hello(line, self.key)
                if self.run_id is not None and hello["run_id"] != self.run_id:
                    raise ValueError(f"rendezvous {hello['run_id'][:80]!r} is not this store's")
                why = impostor(hello, peer)
                if why is not None:
                    raise ValueError(why)
            except (OSError, ValueError) as err:
                print(f"rendezvous leases: no valid hello from {peer}, connection dropped: {err}", file=sys.stderr, flush=True)
                return
            conn.settimeout(None)
            _keep_alive(conn)
            with self.held_lock:
                self.held[id(conn)] = hello
            try:
                while conn.recv(1024):
                    pass  # a launcher sends nothing more: only the end of the connection matters
            except OSError:
                pass  # reset: ended as well
            finally:
                with self.held_lock:
                    del self.held[id(conn)]
        self.release(hello)

    def _echo(self, conn: socket.socket, n: int) -> None:
        if not self.echo_slots.acquire(blocking=False):
            conn.sendall(b"busy\n")
            return
        try:
            conn.sendall(b"ok\n")
            echo(conn, n)
        finally:
            self.echo_slots.release()

    def _complete_rounds(self, poll: float) -> None:
        """Every ``poll`` seconds, for the store's run and each run with leases held: put
        back a forged state (``StateGuard``), then complete its forming round if every
        lease holder has joined (``complete_if_all_joined``)."""
        while not self.stopped.wait(poll):
            with self.held_lock:
                runs: dict[str, list[dict[str, Any]]] = {self.run_id: []} if self.run_id is not None else {}
                for hello in self.held.values():
                    runs.setdefault(hello["run_id"], []).append(hello)
            for run_id, hellos in runs.items():
                with self.lock:
                    if self.store is None:
                        return  # closing
                    try:
                        if run_id not in self.backends:
                            self.backends[run_id] = backend_for(self.store, run_id)
                        if not self.guard.check(self.store, run_id) or not hellos:
                            continue
                        state = _edit(self.backends[run_id], lambda st, hs=hellos: complete_if_all_joined(st, hs),
                                      self.codec, first=self.guard.read)
                    except Exception as err:  # noqa: BLE001 - best effort: the last call still completes it
                        said = f"rendezvous leases: could not check rendezvous {run_id!r}: {type(err).__name__}: {err}"
                        if said not in self.reported:  # once, not ten times a second
                            self.reported.add(said)
                            print(said, file=sys.stderr, flush=True)
                        continue
                if state is not None:
                    print(f"rendezvous leases: round {state.round} of rendezvous {run_id!r} complete: all {len(hellos)} "
                          f"lease holders joined ({len(state.participants)} nodes)", flush=True)

    def release(self, hello: dict[str, Any]) -> None:
        who = f"{hello['addr']} pid {hello['pid']}"
        with self.lock:
            if self.store is None:
                return  # closing
            try:
                removed = release(self.store, hello["run_id"], [hello["addr"], *hello["aliases"]], hello["pid"], hello["min_nodes"],
                                  codec=self.codec)
            except Exception as err:  # noqa: BLE001 - best effort: the keep-alive still drops the node
                print(f"rendezvous leases: could not release {who}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
                return
        outcome = "removed from" if removed else "no longer in"
        print(f"rendezvous leases: the agent {who} is gone: {outcome} rendezvous {hello['run_id']!r}", flush=True)

    def close(self) -> None:
        """Stop accepting and drop the store, so that its owner can destroy it."""
        self.stopped.set()
        self.sock.close()
        with self.lock:
            self.store = None


def _first_line(conn: socket.socket) -> bytes:
    """The connection's first line (at most ``HELLO_LIMIT`` bytes, within
    ``HELLO_TIMEOUT_SECONDS`` in all: a byte now and then does not hold the thread), read a
    byte at a time so that nothing after it is taken from the socket (an echo's payload
    follows at once)."""
    line = bytearray()
    deadline = time.monotonic() + HELLO_TIMEOUT_SECONDS
    while len(line) < HELLO_LIMIT:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole line within {HELLO_TIMEOUT_SECONDS}s")
        conn.settimeout(left)
        byte = conn.recv(1)
        if not byte:
            break
        line += byte
        if byte == b"\n":
            break
    return bytes(line)


def serve(host: str, store_port: int, store: Any, run_id: str | None = None, token: str | None = None) -> LeaseServer | None:
    """Serve leases beside ``store`` (the c10d store on ``store_port``) on the next port,
    for rendezvous ``run_id`` only when given, to lines signed with the job's ``token``
    when given; None (and a note) if it cannot be bound, which leaves dead nodes to the
    keep-alive."""
    try:
        return LeaseServer(host, store_port + PORT_OFFSET, store, run_id=run_id, token=token)
    except OSError as err:
        print(f"rendezvous leases: off, port {store_port + PORT_OFFSET}: {err}", file=sys.stderr, flush=True)
        return None


# --- the launcher's side --------------------------------------------------------------

def lease_port(command: list[str]) -> tuple[str, int] | None:
    """The lease port (leases, and the pre-flight echo) of the c10d store torchrun
    ``command`` rendezvouses on; None when it names none."""
    endpoint = torchrun_flag(command, "--rdzv-endpoint")
    if torchrun_flag(command, "--rdzv-backend") != "c10d" or not endpoint:
        return None
    host, _, port = endpoint.rpartition(":")
    try:
        return host.strip("[]"), int(port) + PORT_OFFSET
    except ValueError:
        return None


def lease_for(command: list[str], agent_pid: int) -> tuple[tuple[str, int], dict[str, Any]] | None:
    """Where to hold the lease of the torchrun ``command`` and its hello (its ``mac`` added
    as it is sent, ``Lease``); None when it uses no external c10d store (no lease to
    hold)."""
    if "is_host=false" not in (torchrun_flag(command, "--rdzv-conf") or ""):
        return None
    address, run_id = lease_port(command), torchrun_flag(command, "--rdzv-id")
    if address is None or not run_id:
        return None
    try:
        min_nodes = int((torchrun_flag(command, "--nnodes") or "1").split(":")[0])
    except ValueError:
        return None
    # torchrun's node address: ``--local-addr`` (a pod's IP), else ``socket.getfqdn()``,
    # which asks DNS: the lease's thread adds what it answers there as an alias, beside the
    # host name (``same_host``), since DNS may answer differently a moment later (a pod's
    # record not there yet) or with another name altogether ("localhost").
    local = torchrun_flag(command, "--local-addr")
    hello = {"run_id": run_id, "addr": local or socket.gethostname(), "pid": agent_pid, "min_nodes": min_nodes}
    return address, hello if local else {**hello, "aliases": None}


class Lease:
    """The launcher's lease for its torchrun agent, held open by a daemon thread; a store
    that restarts or cannot be reached is tried again, with backoff, quietly."""

    def __init__(self, address: tuple[str, int], hello: dict[str, Any], token: str | None = None):
        self.address, self.hello = address, dict(hello)
        self.key = purpose_key(token, "lease") if token else None
        self.stopped = threading.Event()
        self.conn: socket.socket | None = None
        threading.Thread(target=self._hold, name="rdzv-lease", daemon=True).start()

    def _hold(self) -> None:
        if self.hello.get("aliases", []) is None:
            self.hello["aliases"] = [socket.getfqdn()]  # here, not in the launcher's main thread: DNS may take seconds
        if self.key is not None:
            self.hello["mac"] = line_mac(self.key, self.hello)
        line = (json.dumps(self.hello) + "\n").encode()
        delay = RECONNECT_SECONDS[0]
        while not self.stopped.is_set():
            try:
                with socket.create_connection(self.address, timeout=5) as conn:
                    conn.sendall(line)
                    conn.settimeout(None)
                    self.conn = conn
                    if self.stopped.is_set():
                        return
                    delay = RECONNECT_SECONDS[0]
                    while conn.recv(1):
                        pass  # returns b"" (or raises) when the store goes away or close() shuts it
            except OSError:
                pass
            self.conn = None
            self.stopped.wait(delay)
            delay = min(delay * 2, RECONNECT_SECONDS[1])

    def close(self) -> None:
        """End the lease now: the store releases the agent at once."""
        self.stopped.set()
        conn = self.conn
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def hold(command: list[str], agent_pid: int, token: str | None = None) -> Lease | None:
    """A lease for the torchrun agent ``agent_pid`` running ``command`` (its hello signed
    with the job's ``token`` when given), or None when it uses no external c10d store."""
    lease = lease_for(command, agent_pid)
    return Lease(*lease, token=token) if lease is not None else None


def echo_request(size: int, token: str | None = None) -> bytes:
    """A pre-flight echo's first line, with its MAC under the job's ``token`` when given."""
    request: dict[str, Any] = {"echo": size}
    if token:
        request["mac"] = line_mac(purpose_key(token, "lease"), request)
    return (json.dumps(request) + "\n").encode()
