"""The launcher's pre-flight check (``launch/preflight.py``) against the real lease server
beside a real c10d TCPStore (``rendezvous/leases.py`` echoes for it): a healthy path
measures, a slow one is refused naming its rate, a store that cannot be reached or does
not echo skips the check, and the launcher exits ``PREFLIGHT_FAILED`` before torchrun
starts. A degraded link on a real node is the end-to-end test (tests/e2e/test_preflight.py)."""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from llmtrain_contract.exitcodes import ExitCode
from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET, Env
from llmtrain_contract.ports import free_ports
from llmtrain_trainer.launch import preflight
from llmtrain_trainer.rendezvous import leases
from torch.distributed import TCPStore


@pytest.fixture()
def lease_server():
    store = TCPStore("127.0.0.1", free_ports(1 + RDZV_LEASE_PORT_OFFSET), is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=10), use_libuv=True)
    server = leases.serve("127.0.0.1", store.port, store)
    yield store, server
    server.close()
    del store


def test_the_store_echoes_what_it_is_sent_and_the_check_measures_it(lease_server):
    _, server = lease_server
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(b'{"echo": 5}\nhello')
        got = b""
        while len(got) < len(b"ok\nhello"):
            got += conn.recv(64)
        assert got == b"ok\nhello"
    result = preflight.measure(("127.0.0.1", server.port))
    assert result.skipped is None and result.mbps() > 10, result  # loopback: far above any floor
    assert preflight.verdict(result, 50) is None


@pytest.mark.parametrize("line", [b'{"echo": 0}\n', b'{"echo": -1}\n', b'{"echo": 999999999999}\n', b'{"echo": true}\n',
                                  b'{"echo": "4"}\n'])
def test_an_echo_out_of_bounds_is_refused_and_the_server_serves_on(lease_server, line, capsys):
    _, server = lease_server
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(line)
        conn.settimeout(5)
        assert conn.recv(16) == b"", "the server hangs up"
    assert "echo of" in capsys.readouterr().err
    assert preflight.measure(("127.0.0.1", server.port), rounds=1).skipped is None


def test_a_first_line_sent_a_byte_at_a_time_holds_the_thread_no_longer_than_the_hello_timeout(lease_server, monkeypatch):
    _, server = lease_server
    monkeypatch.setattr(leases, "HELLO_TIMEOUT_SECONDS", 1.0)
    with socket.create_connection(("127.0.0.1", server.port)) as slow:
        began = time.monotonic()
        slow.settimeout(5)
        try:
            for _ in range(8):
                slow.sendall(b"{")
                time.sleep(0.3)
        except OSError:
            pass  # hung up on already
        assert slow.recv(16) == b"" and time.monotonic() - began < 4


def test_echoes_beyond_the_slots_are_told_busy_at_once_and_the_check_skipped(lease_server):
    _, server = lease_server
    held = []
    for _ in range(leases.ECHO_SLOTS):
        conn = socket.create_connection(("127.0.0.1", server.port))
        conn.sendall(b'{"echo": 1000}\n')  # and never sends the bytes: the slot stays taken
        assert conn.recv(3) == b"ok\n"
        held.append(conn)
    try:
        began = time.monotonic()
        result = preflight.measure(("127.0.0.1", server.port), rounds=1)
        assert result.rate is None and "busy" in (result.skipped or ""), result
        assert time.monotonic() - began < 1, "no queue behind other checks"
    finally:
        for conn in held:
            conn.close()


class SlowEcho:
    """An echo server that sends back ``rate`` bytes a second at most: a degraded path;
    with ``later``, the connections after the first at that rate (a busy moment, then a
    healthy path)."""

    def __init__(self, rate: float, echo: bool = True, later: float | None = None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.rate, self.echo, self.later = rate, echo, later
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            rate = self.rate if self.connections == 0 or self.later is None else self.later
            self.connections += 1
            threading.Thread(target=self._one, args=(conn, rate), daemon=True).start()

    def _one(self, conn: socket.socket, rate: float) -> None:
        with conn:
            try:
                line = b""
                while not line.endswith(b"\n"):
                    line += conn.recv(1)
                if not self.echo:
                    return  # an older store: a hello it cannot read, dropped
                conn.sendall(b"ok\n")
                while chunk := conn.recv(4096):
                    conn.sendall(chunk)
                    time.sleep(len(chunk) / rate)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def test_a_slow_path_is_measured_by_what_came_back_within_the_deadline_and_refused_naming_its_rate():
    slow = SlowEcho(rate=400_000)
    try:
        began = time.monotonic()
        result = preflight.measure(slow.address, rounds=2, seconds=1.0, enough=50 * preflight.MB)
        assert time.monotonic() - began < 6, "each round ends at its deadline"
        assert result.skipped is None and 0.1 < result.mbps() < 1.0 and result.rounds == 2, result
        why = preflight.verdict(result, 50)
        assert why is not None and f"{result.mbps():.1f} MB/s" in why and "preflightMinMbps=50" in why
        assert "the best of 2 rounds" in why, why
    finally:
        slow.close()


def test_a_round_at_the_floor_ends_the_check_and_one_slow_round_refuses_nothing():
    # A busy moment (the first round at 0.4 MB/s), then the path at full speed: the check
    # goes on past the slow round and passes at the first fast one, without the rest.
    bursty = SlowEcho(rate=400_000, later=1e9)
    try:
        result = preflight.measure(bursty.address, seconds=1.0, enough=5 * preflight.MB)
        assert result.skipped is None and result.mbps() >= 5 and result.rounds == 2, result
        assert bursty.connections == 2 and preflight.verdict(result, 5) is None
    finally:
        bursty.close()
    fast = SlowEcho(rate=1e9)
    try:
        result = preflight.measure(fast.address, enough=5 * preflight.MB)
        assert result.rounds == 1 and fast.connections == 1 and preflight.verdict(result, 5) is None, result
    finally:
        fast.close()


def test_a_store_that_does_not_answer_or_does_not_echo_skips_the_check():
    port = free_ports(1 + RDZV_LEASE_PORT_OFFSET) + RDZV_LEASE_PORT_OFFSET  # neither the store's port nor this one bound
    result = preflight.measure(("127.0.0.1", port), connect_window=1.0)
    assert result.rate is None and "did not answer" in (result.skipped or ""), result
    assert preflight.verdict(result, 50) is None, "an unreachable store is not the node's fault"
    # The store answers on its own port, its lease port is not served: skipped at once.
    store = socket.create_server(("127.0.0.1", free_ports(1 + RDZV_LEASE_PORT_OFFSET)))  # the next port free too
    began = time.monotonic()
    result = preflight.measure(("127.0.0.1", store.getsockname()[1] + RDZV_LEASE_PORT_OFFSET), connect_window=20.0)
    store.close()
    assert "leases off" in (result.skipped or "") and time.monotonic() - began < 5, result
    old = SlowEcho(rate=1e9, echo=False)
    try:
        result = preflight.measure(old.address)
        assert result.rate is None and "does not echo" in (result.skipped or ""), result
    finally:
        old.close()


@pytest.mark.parametrize("text, floor", [("50", 50.0), ("0", 0.0), ("", 0.0), ("-5", 0.0), ("nan", 0.0), ("inf", 0.0),
                                         ("fast", 0.0), ("12.5", 12.5)])
def test_the_floor_is_a_positive_finite_number_or_the_check_is_off(text, floor):
    assert preflight.floor_mbps({Env.PREFLIGHT_MIN_MBPS: text}) == floor


def test_the_check_reads_the_rendezvous_endpoint_from_torchruns_flags():
    command = ["torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", "job-rdzv.ns.svc:29400", "train.py"]
    assert leases.lease_port(command) == ("job-rdzv.ns.svc", 29400 + RDZV_LEASE_PORT_OFFSET)
    assert leases.lease_port(["torchrun", "--rdzv-backend", "static", "--rdzv-endpoint", "h:1", "x"]) is None
    assert leases.lease_port(["torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:port", "x"]) is None


def test_the_launcher_refuses_to_join_over_a_slow_path_before_torchrun_starts(tmp_path: Path):
    slow = SlowEcho(rate=300_000)
    try:
        marker = tmp_path / "torchrun-started"
        fake = ["python", "-c", f"open({str(marker)!r}, 'w').write('x')"]
        store_port = slow.address[1] - RDZV_LEASE_PORT_OFFSET
        command = [*fake, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store_port}"]
        log = tmp_path / "termination"
        env = {**__import__("os").environ, Env.PREFLIGHT_MIN_MBPS: "50"}
        out = subprocess.run([sys.executable, "-m", "llmtrain_trainer.launch.launcher", "--run-dir", str(tmp_path / "run"),
                              "--termination-log", str(log), "--", *command], capture_output=True, text=True, env=env,
                             timeout=120)
        assert out.returncode == ExitCode.PREFLIGHT_FAILED, out.stderr[-3000:]
        assert not marker.exists(), "torchrun never started"
        message = json.loads(log.read_text())
        assert (message["code"], message["reason"]) == (87, "PreflightFailed"), message
        assert "MB/s" in message["message"] and "too slow to join" in message["message"], message
        assert f"the best of {preflight.ROUNDS} rounds" in message["message"], "refused only after every round"
    finally:
        slow.close()
