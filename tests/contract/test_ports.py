"""Free port runs for processes sharing one host: the store's port and its lease port."""

from __future__ import annotations

import socket

import pytest
from llmtrain_contract import ports


def test_a_run_of_ports_binds_and_lies_below_the_ephemeral_range():
    start = ports._ephemeral_start()
    for _ in range(20):
        base = ports.free_ports(3)
        assert ports._LOWEST <= base and base + 3 <= start
        held = [socket.create_server(("127.0.0.1", base + i)) for i in range(3)]
        for sock in held:
            sock.close()


def test_a_taken_port_inside_a_run_is_never_returned(monkeypatch):
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    real = ports.random.randint
    picks = iter([port - 1, port])  # two runs that hold the taken port, then random ones
    monkeypatch.setattr(ports.random, "randint", lambda low, high: next(picks, None) or real(low, high))
    try:
        base = ports.free_ports(2)
        assert base not in (port - 1, port), "a run holding a taken port"
        assert next(picks, None) is None, "both runs holding it were tried"
    finally:
        taken.close()


def test_no_free_run_is_an_error_naming_the_range(monkeypatch):
    monkeypatch.setattr(ports, "_bindable", lambda host, port: False)
    with pytest.raises(OSError, match="no 2 consecutive free ports on 127.0.0.1 in 200 tries"):
        ports.free_ports(2)
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: ports._LOWEST + 1)
    with pytest.raises(OSError, match="no room for 2 ports"):
        ports.free_ports(2)
