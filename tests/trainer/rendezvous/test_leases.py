"""Rendezvous leases (``llmtrain_trainer.rendezvous.leases``) against a real c10d TCPStore and
torchrun's own rendezvous state: a lease that ends takes its agent out of the state as
torchrun's dead-node check would, a lease that is held does not, and nothing else in the
state is touched."""

from __future__ import annotations

import base64
import datetime
import json
import os
import pickle
import socket
import subprocess
import sys
import time

from pathlib import Path

import pytest
from llmtrain_contract.command import torchrun_args
from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET
from llmtrain_trainer.pod import rdzvstate
from llmtrain_trainer.rendezvous import leases
from support.rdzvstates import rendezvous_state
from support.waiting import wait_for

from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

HOST = socket.gethostname()
RUN = "job-uid"



def _said_until(capsys, line: str, timeout: float = 10) -> None:
    """Wait until ``line`` was printed (a server thread prints after its store write, so
    the write may be seen first); fails naming the line if it never is."""
    out: list[str] = []
    wait_for(lambda: (out.append(capsys.readouterr().out) or line in "".join(out)), timeout, 0.05, f"the line {line!r}")

_state = rendezvous_state


A = _NodeDesc(f"{HOST}.pods.example.svc.cluster.local", 101, 0)
B = _NodeDesc(f"{HOST}.pods.example.svc.cluster.local", 202, 0)
C = _NodeDesc("other-pod.pods.example.svc.cluster.local", 202, 0)


def test_a_gone_participant_leaves_a_finished_round_which_moves_on_when_empty():
    state = _state(True, A, B)
    assert leases.drop_node(state, HOST, 202, min_nodes=1)
    assert list(state.participants) == [A] and B not in state.last_heartbeats
    assert (state.complete, state.round) == (True, 3), "the others keep the finished round"
    assert leases.drop_node(state, HOST, 101, min_nodes=1)
    assert (state.participants, state.complete, state.round) == ({}, False, 4), "no one left: the next round opens"


def test_an_alias_names_the_agent_when_torchrun_took_another_name_from_dns():
    state = _state(True, _NodeDesc("localhost", 7, 0), A)
    assert not leases.drop_node(state, "vm", 7, min_nodes=1)
    assert leases.drop_node(state, ["vm", "localhost"], 7, min_nodes=1)
    assert list(state.participants) == [A]


def test_only_the_named_agent_goes_and_a_forming_round_below_its_minimum_loses_its_deadline():
    state = _state(False, A, C, waiting=(B,))
    assert leases.drop_node(state, "other-pod", 202, min_nodes=2)  # C: same pid as B, another host
    assert set(state.participants) == {A} and state.wait_list == {B}
    assert state.deadline is None, "one participant left of the two needed"
    assert leases.drop_node(state, HOST, 202, min_nodes=2)  # B, from the wait list
    assert state.wait_list == set() and set(state.last_heartbeats) == {A}
    assert not leases.drop_node(state, HOST, 999, min_nodes=2), "an agent not in the state changes nothing"


def test_the_host_name_matches_whatever_fqdn_torchrun_got_and_an_address_only_itself():
    assert leases.same_host("w-0.workers.ns.svc.cluster.local", "w-0")
    assert leases.same_host("w-0", "w-0")
    assert not leases.same_host("w-01.workers.ns.svc.cluster.local", "w-0")
    assert leases.same_host("10.244.0.5", "10.244.0.5")
    assert not leases.same_host("10.244.0.6", "10.244.0.5"), "not by the first label of an address"
    assert not leases.same_host("10.host", "10.244.0.5")


def test_the_launcher_finds_the_lease_in_torchruns_flags_and_only_for_an_external_c10d_store():
    flags = torchrun_args(nnodes_min=2, nnodes_max=4, nproc_per_node=1, rdzv_endpoint="job-rdzv.ns.svc:29400", rdzv_id=RUN,
                          max_restarts=3)
    address, hello = leases.lease_for(["python", "-m", "torch.distributed.run", *flags, "-m", "x"], 42)
    assert address == ("job-rdzv.ns.svc", 29400 + RDZV_LEASE_PORT_OFFSET)
    assert hello == {"run_id": RUN, "addr": HOST, "pid": 42, "min_nodes": 2, "aliases": None}, "the FQDN: resolved by the lease"
    spaced = ["torchrun", "--rdzv_backend", "c10d", "--rdzv_endpoint", "[::1]:7000", "--rdzv_id", "r", "--rdzv_conf", "is_host=false"]
    assert leases.lease_for(spaced, 1)[0] == ("::1", 7001)
    with_addr = [*flags[:-1], "--local-addr=10.244.0.7", flags[-1]]
    assert leases.lease_for(["torchrun", *with_addr, "train.py"], 7)[1] == \
        {"run_id": RUN, "addr": "10.244.0.7", "pid": 7, "min_nodes": 2}, "a pod's agent is its IP, no alias"
    assert leases.lease_for(["torchrun", "--standalone", "train.py"], 1) is None
    assert leases.lease_for(["torchrun", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--rdzv-id=r", "x.py"], 1) is None, \
        "an agent that hosts the store itself has nobody to hold a lease with"


@pytest.mark.parametrize("line", [b"not json\n", b"[1]\n", b'{"run_id": "r", "addr": "h", "pid": true, "min_nodes": 1}\n',
                                  b'{"run_id": "r", "addr": "h", "pid": 1}\n',
                                  b'{"run_id": "r", "addr": "h", "pid": 1, "min_nodes": 1, "aliases": "h2"}\n'])
def test_a_bad_hello_is_refused_naming_what_is_wrong(line):
    with pytest.raises(ValueError):
        leases.parse_hello(line)


def _write(store, state: _RendezvousState) -> None:
    backend = C10dRendezvousBackend(store, RUN)
    current = backend.get_state()
    assert backend.set_state(pickle.dumps(state), current[1] if current else None)[2]


def _read(store) -> _RendezvousState:
    return pickle.loads(C10dRendezvousBackend(store, RUN).get_state()[0])


def test_release_edits_the_state_in_the_store_and_retries_after_another_writer(store):
    me = _NodeDesc(HOST, os.getpid(), 0)
    _write(store, _state(True, A, me))
    assert leases.release(store, RUN, HOST, os.getpid(), 1)
    assert list(_read(store).participants) == [A]
    assert not leases.release(store, RUN, HOST, os.getpid(), 1), "already gone"
    assert not leases.release(store, "another-run", HOST, 101, 1), "no state for that run"


class _Forged:
    """What anyone who reaches the store could write as the state: unpickled by plain
    pickle, it would run a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_forged_state_in_the_store_is_refused_naming_it_and_runs_nothing(store, tmp_path):
    marker = tmp_path / "ran"
    backend = C10dRendezvousBackend(store, RUN)
    current = backend.get_state()
    assert backend.set_state(pickle.dumps(_Forged(marker)), current[1] if current else None)[2]
    with pytest.raises(rdzvstate.ForgedState, match="names posix.system"):
        leases.release(store, RUN, HOST, os.getpid(), 1)
    with pytest.raises(rdzvstate.ForgedState, match="does not decode"):
        rdzvstate.load_state(b"not a pickle")
    assert not marker.exists(), "the forged state ran its command"


def test_torchruns_real_state_loads_whole_through_the_restricted_reader(store):
    me = _NodeDesc(HOST, os.getpid(), 0)
    state = _state(True, A, me)
    state.last_heartbeats[me] = datetime.datetime.now()
    loaded = rdzvstate.load_state(pickle.dumps(state))
    assert loaded.participants == state.participants and loaded.last_heartbeats == state.last_heartbeats
    assert loaded.complete == state.complete and loaded.round == state.round


def test_a_lease_resolves_the_fqdn_torchrun_took_and_the_store_matches_it(store):
    server = leases.serve("127.0.0.1", store.port, store)
    try:
        fqdn_node = _NodeDesc(socket.getfqdn(), 303, 0)
        _write(store, _state(True, A, fqdn_node))
        flags = torchrun_args(nnodes_min=1, nnodes_max=2, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{store.port}", rdzv_id=RUN,
                              max_restarts=1)
        lease = leases.hold(["torchrun", *flags, "x.py"], 303)
        wait_for(lambda: lease.conn is not None, 10, 0.05, "the lease connected")
        lease.close()
        wait_for(lambda: set(_read(store).participants) == {A}, 10, 0.05, "the agent named by torchrun's FQDN released")
    finally:
        server.close()


def test_a_lease_that_ends_releases_its_agent_and_one_that_is_held_does_not(store, capsys):
    server = leases.serve("127.0.0.1", store.port, store)
    assert server is not None and server.port == store.port + RDZV_LEASE_PORT_OFFSET
    try:
        _write(store, _state(True, A, B))
        held = leases.Lease(("127.0.0.1", server.port), {"run_id": RUN, "addr": HOST, "pid": 101, "min_nodes": 1})
        ending = leases.Lease(("127.0.0.1", server.port), {"run_id": RUN, "addr": HOST, "pid": 202, "min_nodes": 1})
        wait_for(lambda: held.conn is not None and ending.conn is not None, 10, 0.05, "both leases connected")
        time.sleep(0.3)
        assert set(_read(store).participants) == {A, B}, "held leases release nobody"
        ending.close()
        wait_for(lambda: set(_read(store).participants) == {A}, 10, 0.05, "B released when its lease ended")
        # The server says so after its store write, from its own thread: read until it has.
        _said_until(capsys, f"the agent {HOST} pid 202 is gone: removed from rendezvous '{RUN}'")
        time.sleep(0.3)
        assert set(_read(store).participants) == {A}, "A's lease is still held"

        # A client that dies without a word (its socket closed by the kernel) ends its lease too.
        raw = socket.create_connection(("127.0.0.1", server.port))
        raw.sendall((json.dumps({"run_id": RUN, "addr": HOST, "pid": 101, "min_nodes": 1}) + "\n").encode())
        time.sleep(0.2)
        raw.close()
        wait_for(lambda: _read(store).participants == {}, 10, 0.05, "A released")
        assert _read(store).round == 4
        held.close()
    finally:
        server.close()


def test_a_bad_hello_is_dropped_and_the_server_serves_on(store, capsys):
    server = leases.serve("127.0.0.1", store.port, store)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as bad:
            bad.sendall(b"hello?\n")
            assert bad.recv(1) == b"", "the server hangs up"
        assert "no valid hello" in capsys.readouterr().err
        _write(store, _state(True, A))
        with socket.create_connection(("127.0.0.1", server.port)) as good:
            good.sendall((json.dumps({"run_id": RUN, "addr": HOST, "pid": 101, "min_nodes": 1}) + "\n").encode())
        wait_for(lambda: _read(store).participants == {}, 10, 0.05, "released after the bad client")
    finally:
        server.close()


def test_a_lease_port_in_use_leaves_leases_off_with_a_note(store, capsys):
    taken = socket.create_server(("127.0.0.1", store.port + RDZV_LEASE_PORT_OFFSET))
    try:
        assert leases.serve("127.0.0.1", store.port, store) is None
        assert f"rendezvous leases: off, port {store.port + RDZV_LEASE_PORT_OFFSET}" in capsys.readouterr().err
    finally:
        taken.close()


def _hello(addr: str, pid: int, min_nodes: int = 1) -> dict:
    return {"run_id": RUN, "addr": addr, "pid": pid, "min_nodes": min_nodes, "aliases": []}


def test_a_forming_round_completes_once_every_lease_holder_joined_and_not_before():
    state = _state(False, B, waiting=())
    holders = [_hello(HOST, 101), _hello(HOST, 202)]
    assert not leases.complete_if_all_joined(state, holders), "A holds a lease and has not joined"
    assert not state.complete and state.deadline is not None
    state.participants[A] = 0
    assert leases.complete_if_all_joined(state, holders)
    assert (state.complete, state.deadline, state.round) == (True, None, 3)
    assert state.participants == {node: rank for rank, node in enumerate(sorted([A, B]))}, "ranks as torchrun assigns them"

    # Below min_nodes, with no lease at all, or once complete or closed: left to torchrun.
    assert not leases.complete_if_all_joined(_state(False, A), [_hello(HOST, 101, min_nodes=2)])
    assert not leases.complete_if_all_joined(_state(False, A), [])
    assert not leases.complete_if_all_joined(_state(True, A), [_hello(HOST, 101)])
    closed = _state(False, A)
    closed.closed = True
    assert not leases.complete_if_all_joined(closed, [_hello(HOST, 101)])
    # A participant the store holds no lease for (its launcher could not connect) does not
    # stop the others' round; an agent neither joined nor known joins the next one.
    assert leases.complete_if_all_joined(_state(False, A, C), [_hello(HOST, 101)])


def test_the_store_completes_a_round_when_the_last_lease_holder_joins(store, capsys):
    server = leases.LeaseServer("127.0.0.1", store.port + RDZV_LEASE_PORT_OFFSET, store, round_poll_seconds=0.02)
    held = [leases.Lease(("127.0.0.1", server.port), {"run_id": RUN, "addr": HOST, "pid": pid, "min_nodes": 1})
              for pid in (101, 202)]
    try:
        wait_for(lambda: len(server.held) == 2, 10, 0.02, "both leases held")
        forming = _state(False, A)
        forming.deadline += datetime.timedelta(seconds=60)  # no last call ends during the test
        _write(store, forming)
        time.sleep(0.3)
        assert not _read(store).complete, "B holds a lease and has not joined"
        joined = _read(store)
        joined.participants[B] = 0
        _write(store, joined)
        wait_for(lambda: _read(store).complete, 5, 0.02, "the round completed by the store")
        assert _read(store).participants == {A: 0, B: 1}
        _said_until(capsys, f"round 3 of rendezvous '{RUN}' complete: all 2 lease holders joined (2 nodes)")
    finally:
        for lease in held:
            lease.close()
        server.close()


def test_the_agent_shim_polls_a_rendezvous_four_times_a_second_and_keeps_its_cache_otherwise():
    # In a child process: the patch changes torch's module for the process that applies it.
    probe = r"""
import time
from datetime import timedelta
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from llmtrain_trainer.launch import torchrun_agent

assert torchrun_agent.poll_faster()
began = time.monotonic(); dr._delay(seconds=1); slept = time.monotonic() - began
assert 0.2 <= slept < 0.6, slept
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
settings = dr.RendezvousSettings("run", 1, 2, dr.RendezvousTimeout(), timedelta(seconds=1), 3)
holder = dr._BackendRendezvousStateHolder(C10dRendezvousBackend(store, "run"), settings)
node = dr._NodeDesc("host", 1, 0)
executor = dr._DistributedRendezvousOpExecutor(node, holder, settings)
seen = []
def op(ctx, deadline):
    seen.append(holder._cache_duration)
    return dr._Action.FINISH
executor.run(op, time.monotonic() + 5)
class Beat(dr._RendezvousKeepAliveOp):
    def __call__(self, ctx, deadline):
        seen.append(holder._cache_duration)
        return dr._Action.FINISH
executor.run(Beat(), time.monotonic() + 5)
print(seen, holder._cache_duration)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[0,", "1]", "1"], out.stdout


def test_a_held_lease_probes_its_peer_so_that_a_powered_off_node_ends_it(store):
    server = leases.serve("127.0.0.1", store.port, store)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall((json.dumps({"run_id": RUN, "addr": HOST, "pid": 101, "min_nodes": 1}) + "\n").encode())
            wait_for(lambda: len(server.held) == 1, 10, 0.02, "the lease held")
            # The server's end of the connection in /proc/net/tcp: its timer is the
            # keep-alive timer (kind 2) while the connection is idle.
            local, remote = f"{server.port:04X}", f"{client.getsockname()[1]:04X}"
            rows = [line.split() for line in open("/proc/net/tcp").read().splitlines()[1:]]
            ends = [r for r in rows if r[1].endswith(":" + local) and r[2].endswith(":" + remote)]
            assert len(ends) == 1, ends
            assert ends[0][5].startswith("02:"), f"timer {ends[0][5]} (02: keep-alive)"
    finally:
        server.close()


def test_a_hello_must_come_from_the_agent_it_names():
    """A lease's end removes its agent: a hello naming another pod's agent, sent from
    elsewhere, would let anyone drop a live agent from the rendezvous."""
    hello = {**_hello("10.244.1.7", 101)}
    assert leases.impostor(hello, "10.244.1.7") is None
    assert leases.impostor(hello, "::ffff:10.244.1.7") is None, "an IPv4 peer on a dual-stack socket"
    assert "names the agent at 10.244.1.7 but comes from 10.244.2.9" in leases.impostor(hello, "10.244.2.9")
    named = _hello("worker-0.pods", 101)
    assert leases.impostor(named, "127.0.0.1") is None, "a local run: no --local-addr, from this host"
    resolves = lambda name, port, type: [(2, 1, 6, "", ("10.244.1.7", 0))] if name == "worker-0.pods" else []  # noqa: E731
    assert leases.impostor(named, "10.244.1.7", resolve=resolves) is None
    assert "does not resolve to 10.244.2.9" in leases.impostor(named, "10.244.2.9", resolve=resolves)
    # Its own address, and another agent's as an alias: the lease would release both.
    assert "aliases" in leases.impostor({**_hello("10.244.2.9", 7), "aliases": ["10.244.1.7"]}, "10.244.2.9")
    both = {**_hello("worker-0.pods", 7), "aliases": ["worker-1.pods"]}
    assert "'worker-1.pods', which does not resolve to 10.244.1.7" in leases.impostor(both, "10.244.1.7", resolve=resolves)


def test_a_forged_or_foreign_hello_removes_nobody_and_the_store_serves_on(store, capsys):
    server = leases.LeaseServer("127.0.0.1", store.port + RDZV_LEASE_PORT_OFFSET, store, run_id=RUN)
    try:
        agent = _NodeDesc("10.244.1.7", 101, 0)
        _write(store, _state(True, agent, A))
        for hello in ({**_hello("10.244.1.7", 101)},          # another pod's agent, from here
                      {**_hello(HOST, 101), "run_id": "some-other-job"}):  # a rendezvous this store does not hold
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as forged:  # a regression fails, not hangs
                forged.sendall((json.dumps(hello) + "\n").encode())
                assert forged.recv(1) == b"", "the server hangs up"
        err = capsys.readouterr().err
        assert "names the agent at 10.244.1.7 but comes from 127.0.0.1" in err
        assert "rendezvous 'some-other-job' is not this store's" in err
        time.sleep(0.3)
        assert set(_read(store).participants) == {agent, A}, "nobody was removed"
        with socket.create_connection(("127.0.0.1", server.port)) as good:  # its own agent, from its own host
            good.sendall((json.dumps(_hello(HOST, 101)) + "\n").encode())
        wait_for(lambda: set(_read(store).participants) == {agent}, 10, 0.05, "A released by its own lease")
    finally:
        server.close()


def test_connections_beyond_the_cap_are_closed_and_the_accept_loop_lives(store):
    server = leases.LeaseServer("127.0.0.1", store.port + RDZV_LEASE_PORT_OFFSET, store, max_connections=4)
    flood = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
    try:
        wait_for(lambda: server.connections == 4, 10, 0.05, "four held")
        time.sleep(0.3)
        assert server.connections == 4
        assert sum(1 for c in flood if _closed(c)) >= 30, "the rest were closed at once"
    finally:
        for c in flood:
            c.close()
    wait_for(lambda: server.connections == 0, 10, 0.05, "all gone")
    _write(store, _state(True, A))
    with socket.create_connection(("127.0.0.1", server.port)) as good:
        good.sendall((json.dumps(_hello(HOST, 101)) + "\n").encode())
    wait_for(lambda: _read(store).participants == {}, 10, 0.05, "a lease still works")
    server.close()


def _closed(conn: socket.socket) -> bool:
    conn.settimeout(0.5)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


AGENT = Path(leases.__file__).resolve().parents[1] / "launch" / "torchrun_agent.py"


@pytest.mark.parametrize("patched", [True, False], ids=["our-agent", "plain-torchrun"])
def test_a_torchrun_agent_refuses_a_forged_state_in_the_store_and_runs_nothing(store, tmp_path, patched):
    """The attack of a pod that reaches the store: a forged state that names os.system.
    Plain torchrun runs it as it joins (the control: the test can fail); the project's
    agent refuses it as a corrupt state and runs nothing."""
    marker = tmp_path / "ran"
    backend = C10dRendezvousBackend(store, RUN)
    current = backend.get_state()
    assert backend.set_state(pickle.dumps(_Forged(marker)), current[1] if current else None)[2]
    program = [str(AGENT)] if patched else ["-m", "torch.distributed.run"]
    agent = subprocess.run([sys.executable, *program, "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                            f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={RUN}",
                            "--rdzv-conf=is_host=false,join_timeout=15", "--max-restarts=0", "-m", "json.tool", os.devnull],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    if patched:
        assert not marker.exists(), "the forged state ran its command in the agent"
        assert agent.returncode != 0 and "names posix.system" in agent.stderr, agent.stderr[-2000:]
    else:
        assert marker.exists(), "plain torchrun no longer unpickles the state: this test's control is gone"


def test_the_guard_puts_back_the_last_good_state_over_a_forged_one_and_says_so(store, tmp_path, capsys):
    """A forged state (naming os.system, or bytes that do not decode) is replaced by the
    last good one, byte for byte (so an agent's compare-and-set token taken before the
    forgery is valid again), without running it; with no good state seen, it is reported
    and left; later forgeries within the report interval are counted, not each logged."""
    marker = tmp_path / "ran"
    clock = [0.0]
    guard = leases.StateGuard(clock=lambda: clock[0])
    key = leases.STATE_KEY_PREFIX + RUN
    C10dRendezvousBackend(store, RUN)  # writes the "no state" sentinel, as torchrun's backend does
    assert guard.check(store, RUN), "no state yet is nothing to refuse"
    forged = base64.b64encode(pickle.dumps(_Forged(marker)))
    store.set(key, forged)
    assert not guard.check(store, RUN)
    assert store.get(key) == forged, "nothing good to put back: left as it is"
    assert "no good state seen yet" in capsys.readouterr().err
    _write_raw(store, key, _state(True, A, B))
    good = store.get(key)
    assert guard.check(store, RUN)
    clock[0] += leases.FORGERY_REPORT_SECONDS
    for bad in (forged, b"%%% not base64 %%%", base64.b64encode(b"\x80\x05 truncated")):
        clock[0] += 1
        store.set(key, bad)
        assert not guard.check(store, RUN)
        assert store.get(key) == good, bad
    assert not marker.exists(), "the forged state ran its command in the store's process"
    err = capsys.readouterr().err
    assert err.count("refused a forged rendezvous state") == 1 and "names posix.system" in err and "put back" in err, err
    clock[0] += leases.FORGERY_REPORT_SECONDS
    store.set(key, forged)
    assert not guard.check(store, RUN)
    assert "(2 more since the last report)" in capsys.readouterr().err
    assert rdzvstate.load_state(base64.b64decode(store.get(key))).participants == {A: 0, B: 1}


def _write_raw(store, key: str, state: _RendezvousState) -> None:
    store.set(key, base64.b64encode(pickle.dumps(state)))


@pytest.mark.parametrize("guarded", [True, False], ids=["store-guarded", "unguarded"])
def test_an_agent_trains_through_a_forged_state_its_store_puts_back(store, tmp_path, guarded):
    """A running torchrun agent (ours) and a forgery written into its store while its
    worker runs. Once the agent has read the forgery (it says so), the store's guard puts
    back the good state and the agent's worker ends well; with no guard, the agent fails
    once its wait is over (the control: without the guard the forgery would fail the job).
    Neither runs the forgery."""
    marker, log = tmp_path / "ran", tmp_path / "agent.err"
    guard = leases.StateGuard()
    key = leases.STATE_KEY_PREFIX + RUN
    with log.open("w") as err:
        agent = subprocess.Popen([sys.executable, str(AGENT), "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                                  f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={RUN}",
                                  "--rdzv-conf=is_host=false,join_timeout=15", "--max-restarts=0",
                                  "--monitor-interval=0.1", "--no-python", "sleep", "12"],
                                 stdout=subprocess.DEVNULL, stderr=err, cwd=tmp_path)
    try:
        wait_for(lambda: store.check([key]) and guard.check(store, RUN) and store.get(key) != leases.NO_STATE
                 and rdzvstate.load_state(base64.b64decode(store.get(key))).complete, 60, 0.1, "the agent's round complete")
        store.set(key, base64.b64encode(pickle.dumps(_Forged(marker))))
        wait_for(lambda: "refused the rendezvous state in the store" in log.read_text(), 10, 0.05, "the agent reading the forgery")
        if guarded:
            assert not guard.check(store, RUN), "the guard refuses the forgery"
        agent.wait(timeout=120)
    finally:
        agent.kill()
    said = log.read_text()
    assert not marker.exists(), "the forged state ran its command"
    assert "names posix.system" in said, said[-3000:]
    if guarded:
        assert agent.returncode == 0, said[-3000:]
    else:
        assert agent.returncode != 0, "the agent failed on no forgery: this test's control is gone"


@pytest.mark.parametrize(("argv", "poll"), [
    (["--nnodes=2", "x.py"], 0.25), (["--nnodes", "1:16"], 0.25), (["--nnodes=8:32"], 0.5),
    (["--nnodes=64"], 1.0), (["--nnodes=512:1024"], 1.0), (["--nnodes=lots"], 0.25), ([], 0.25),
])
def test_the_agents_pace_slows_with_the_jobs_nodes_to_torchs_own(argv, poll):
    """Every read is of the whole state and every node reads it: four reads a second
    starved 64 agents' keep-alive beats here (``bench/rendezvous_scale.py``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("torchrun_agent_pace", AGENT)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    assert agent.join_poll_seconds(argv) == poll
