"""The job's token on the rendezvous (``pod/rdzvstate.py``, ``rendezvous/leases.py``): with
it, the agents and the store sign the state and the lease lines, so that a pod that reaches
the store without the token can forge no state, not even one made of torchrun's own types,
and can end no lease; against a real c10d TCPStore and real torchrun agents."""

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
from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET, Env
from llmtrain_trainer.launch import preflight
from llmtrain_trainer.pod import rdzvstate
from llmtrain_trainer.rendezvous import leases
from support.rdzvstates import rendezvous_state
from support.waiting import wait_for

from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

HOST = socket.gethostname()
RUN = "job-uid"
TOKEN = "a" * 64
OTHER_TOKEN = "b" * 64
KEY = leases.STATE_KEY_PREFIX + RUN
AGENT = Path(leases.__file__).resolve().parents[1] / "launch" / "torchrun_agent.py"
A = _NodeDesc(HOST, 101, 0)
B = _NodeDesc(HOST, 202, 0)


def _state(*nodes: _NodeDesc) -> _RendezvousState:
    return rendezvous_state(True, *nodes)


def _put(store, raw: bytes) -> None:
    store.set(KEY, base64.b64encode(raw))


def _get(store) -> bytes:
    return base64.b64decode(store.get(KEY))


def _unsigned_copy(raw: bytes) -> _RendezvousState:
    """What a pod without the token can do with a signed state it read from the store:
    the pickle follows the signature in clear."""
    return pickle.loads(raw[len(rdzvstate.SIGNED) + rdzvstate.MAC_BYTES:])


def test_a_signed_state_reads_back_and_any_other_is_refused_before_it_is_unpickled(tmp_path):
    codec = rdzvstate.StateCodec(TOKEN)
    state = _state(A, B)
    signed = codec.dumps(state)
    assert signed.startswith(rdzvstate.SIGNED) and codec.loads(signed).participants == {A: 0, B: 1}
    assert codec.dumps(state) == signed, "deterministic: torchrun compares what it wrote with what the store holds"

    forged = _unsigned_copy(signed)
    forged.participants.pop(B)  # torchrun's own types only: the restricted reader alone would take it
    with pytest.raises(rdzvstate.ForgedState, match="not signed with the job's token"):
        codec.loads(pickle.dumps(forged))
    with pytest.raises(rdzvstate.ForgedState, match="does not match the job's token"):
        codec.loads(rdzvstate.StateCodec(OTHER_TOKEN).dumps(forged))  # another job's token
    tampered = bytearray(signed)
    tampered[-5] ^= 1
    with pytest.raises(rdzvstate.ForgedState, match="does not match"):
        codec.loads(bytes(tampered))

    class Forged:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    bits = pickle.dumps(Forged())  # a forger's pickle, "signed" with a guessed key
    with pytest.raises(rdzvstate.ForgedState, match="does not match"):
        codec.loads(rdzvstate.SIGNED + bytes(rdzvstate.MAC_BYTES) + bits)
    assert not (tmp_path / "ran").exists()

    unsigned = rdzvstate.StateCodec(None)
    assert unsigned.dumps(forged) == pickle.dumps(forged) and unsigned.loads(pickle.dumps(forged)).participants == {A: 0}
    with pytest.raises(rdzvstate.ForgedState, match="does not decode"):
        unsigned.loads(signed)  # a store without the token never takes a signed state for torchrun's


def test_the_guard_with_the_token_puts_back_a_forgery_made_of_torchruns_own_types(store, capsys):
    codec = rdzvstate.StateCodec(TOKEN)
    guard = leases.StateGuard(codec)
    C10dRendezvousBackend(store, RUN)
    _put(store, codec.dumps(_state(A, B)))
    good = store.get(KEY)
    assert guard.check(store, RUN)
    forged = _unsigned_copy(_get(store))
    forged.participants.pop(B)
    _put(store, pickle.dumps(forged))
    assert not guard.check(store, RUN)
    assert store.get(KEY) == good, "the last good state, byte for byte"
    err = capsys.readouterr().err
    assert "refused a forged rendezvous state" in err and "not signed with the job's token" in err, err
    # The control: without the token the same forgery is torchrun's own state, and stays.
    _put(store, pickle.dumps(forged))
    assert leases.StateGuard().check(store, RUN)
    assert rdzvstate.load_state(_get(store)).participants == {A: 0}


def test_a_store_with_the_token_signs_what_it_edits_and_takes_leases_only_with_the_tokens_mac(store, capsys):
    codec = rdzvstate.StateCodec(TOKEN)
    server = leases.LeaseServer("127.0.0.1", store.port + RDZV_LEASE_PORT_OFFSET, store, run_id=RUN, token=TOKEN)
    try:
        C10dRendezvousBackend(store, RUN)
        _put(store, codec.dumps(_state(A, B)))
        hello = {"run_id": RUN, "addr": HOST, "pid": 202, "min_nodes": 1, "aliases": []}
        for line in (hello,                                                               # no MAC: another job's pod
                     {**hello, "mac": "0" * 64},                                          # a guessed one
                     {**hello, "mac": leases.line_mac(rdzvstate.purpose_key(OTHER_TOKEN, "lease"), hello)},  # another job's token
                     {**hello, "mac": leases.line_mac(rdzvstate.purpose_key(TOKEN, "rendezvous-state"), hello)}):  # the state's key
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as conn:
                conn.sendall((json.dumps(line) + "\n").encode())
                assert conn.recv(1) == b"", "the server hangs up"
        err = capsys.readouterr().err
        assert "carries no MAC of the job's token" in err and err.count("its MAC does not match the job's token") == 3, err
        time.sleep(0.3)
        assert codec.loads(_get(store)).participants == {A: 0, B: 1}, "nobody was removed"

        lease = leases.Lease(("127.0.0.1", server.port), {k: v for k, v in hello.items() if k != "aliases"}, token=TOKEN)
        wait_for(lambda: len(server.held) == 1, 10, 0.05, "the signed lease held")
        lease.close()
        wait_for(lambda: codec.loads(_get(store)).participants == {A: 0}, 10, 0.05, "B released by its own signed lease")
        assert _get(store).startswith(rdzvstate.SIGNED), "the store's own edit is signed, so the agents take it"
    finally:
        server.close()


def test_the_pre_flight_echo_answers_only_a_request_with_the_tokens_mac(store):
    server = leases.LeaseServer("127.0.0.1", store.port + RDZV_LEASE_PORT_OFFSET, store, token=TOKEN)
    try:
        address = ("127.0.0.1", server.port)
        assert preflight.measure(address, rounds=1, size=1 << 16, token=TOKEN).rate is not None
        refused = preflight.measure(address, rounds=1, size=1 << 16)
        assert refused.rate is None and "does not echo" in (refused.skipped or ""), refused
        assert preflight.measure(address, rounds=1, size=1 << 16, token=OTHER_TOKEN).rate is None
    finally:
        server.close()


def _run_agent(store, tmp_path: Path, token: str | None, starts: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != Env.RDZV_TOKEN}
    if token:
        env[Env.RDZV_TOKEN] = token
    # The worker notes each start and whether the token reached it.
    worker = f'echo "start ${{{Env.RDZV_TOKEN}:-none}}" >> {starts}; sleep 10'
    return subprocess.Popen([sys.executable, str(AGENT), "--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                             f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={RUN}",
                             "--rdzv-conf=is_host=false,join_timeout=15,last_call_timeout=1", "--max-restarts=3",
                             "--monitor-interval=0.1", "--no-python", "sh", "-c", worker],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "agent.err").open("w"), cwd=tmp_path, env=env)


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
def test_a_forged_waiting_node_restarts_an_unsigned_job_and_costs_a_signed_one_nothing(store, tmp_path, signed):
    """A real torchrun agent of ours, and a pod without the token that writes the state
    torchrun reads back with a node added to the wait list: torchrun's own types only, so
    the restricted reader alone takes it, and the agent restarts its healthy worker to let
    the node in (the control: this is what the forgery costs without a token). With the
    token the agent refuses it, the store's guard puts back the signed state, and the
    worker runs once. The ranks never see the token."""
    starts = tmp_path / "starts"
    token = TOKEN if signed else None
    guard = leases.StateGuard(rdzvstate.StateCodec(token))
    agent = _run_agent(store, tmp_path, token, starts)
    log = tmp_path / "agent.err"
    try:
        wait_for(lambda: starts.exists(), 60, 0.1, "the worker started")
        assert guard.check(store, RUN), "the agent's own state is good"
        raw = _get(store)
        assert raw.startswith(rdzvstate.SIGNED) is signed
        forged = _unsigned_copy(raw) if signed else pickle.loads(raw)
        forged.wait_list.add(_NodeDesc("intruder", 4242, 0))
        forged.last_heartbeats[_NodeDesc("intruder", 4242, 0)] = datetime.datetime.now(datetime.UTC)
        _put(store, pickle.dumps(forged))
        if signed:
            wait_for(lambda: "refused the rendezvous state in the store" in log.read_text(), 10, 0.05, "the agent refusing it")
            assert not guard.check(store, RUN), "the guard refuses the forgery and puts back the last good state"
            assert agent.wait(timeout=60) == 0, log.read_text()[-3000:]
            assert starts.read_text().splitlines() == ["start none"], "one start, and no token in the rank's environment"
        else:
            wait_for(lambda: len(starts.read_text().splitlines()) >= 2, 30, 0.1, "the worker restarted for the forged node")
    finally:
        agent.kill()
        agent.wait()


def test_the_fork_server_the_ranks_are_forked_from_starts_without_the_token(monkeypatch):
    """The built-in trainer's ranks are forked from the pod's fork server, whose process
    environment they inherit in memory (``/proc/self/environ``): it never holds the token."""
    from llmtrain_trainer.launch import zygote

    monkeypatch.setenv(Env.RDZV_TOKEN, TOKEN)
    monkeypatch.setenv("LLMTRAIN_SEEN_BY_THE_FORK_SERVER", "1")
    server = zygote.start()
    assert server is not None
    try:
        path = Path(f"/proc/{server.proc.pid}/environ")
        # Read once the server has exec'd (a forked child not yet exec'd shows the parent's).
        wait_for(lambda: b"llmtrain_trainer.launch.zygote" in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes(), 10, 0.01,
                 "the server exec'd")
        environ = path.read_bytes().split(b"\0")
        assert b"LLMTRAIN_SEEN_BY_THE_FORK_SERVER=1" in environ, "the rest of the environment is passed on"
        assert not [v for v in environ if v.startswith(Env.RDZV_TOKEN.encode())] and TOKEN.encode() not in b"".join(environ)
    finally:
        server.stop()

