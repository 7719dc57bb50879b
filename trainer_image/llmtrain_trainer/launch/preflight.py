"""The launcher's pre-flight check: is this node's network fit to join the job?

A node with a degraded link (a NIC that came up at a tenth of its speed, a flapping
cable, a congested top-of-rack port) does not fail: it slows every collective of the job
down to its pace, for as long as it stays. So when a pod joins a job that has trained (a
replacement, a scale-up: the operator sets the floor only then), its launcher sends
``ROUND_BYTES`` through the job's rendezvous store and back before torchrun starts (the
store's lease port echoes them: ``rendezvous/leases.py``) and takes the best rate: one
stream through the node's network to the store's, the path every worker's rendezvous
takes. The first round at the floor ends the check; a node is refused only after
``ROUNDS`` rounds all below it. A degraded link is slow in every round, while a busy CPU
(the echo is Python at both ends) slows a round now and then: on a two-core kind bed
beside CI's other suites a healthy node's best of two rounds came to 48.3 MB/s against the
default floor of 50. Below
``faultTolerance.preflightMinMbps`` (``LLMTRAIN_PREFLIGHT_MIN_MBPS``; 0 turns the check off)
the pod exits ``PREFLIGHT_FAILED`` naming the rate, before it joins: the operator
quarantines the node for the job and places the replacement elsewhere, not charged.

A point-to-point check, not a collective among the workers: those are busy training (or
waiting in torchrun's rendezvous, which owns them). A store that cannot be reached within
``CONNECT_WINDOW_SECONDS`` (it may be starting with the job), one that answers on its own
port but not on the lease port (leases off), one that does not echo (an older store), or
one busy with other checks, skips the check rather than blame the node:
torchrun's own rendezvous timeout then speaks for an unreachable store.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from dataclasses import dataclass

from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET, Env

from llmtrain_trainer.rendezvous.leases import echo_request

ROUND_BYTES = 4 << 20
ROUNDS = 5
ROUND_SECONDS = 5.0
"""A round that has not finished by then is measured by what came back so far (shorter
with a floor: ``measure``)."""
CONNECT_WINDOW_SECONDS = 30.0
CHUNK = 256 << 10
MB = 1e6


@dataclass(frozen=True)
class Result:
    endpoint: str
    rate: float | None = None
    """Bytes per second, the best round's; None when skipped."""
    rounds: int = 0
    """How many rounds were measured."""
    skipped: str | None = None
    """Why nothing was measured."""

    def mbps(self) -> float:
        return (self.rate or 0.0) / MB


def _answers(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=2.0):
            return True
    except OSError:
        return False


def _connect(address: tuple[str, int], window: float) -> socket.socket | str:
    """A connection to the echo, or why there is none: the store not up within ``window``
    (it may be starting with the job), or up without its lease port (leases off)."""
    deadline = time.monotonic() + window
    while True:
        try:
            return socket.create_connection(address, timeout=min(5.0, max(0.5, deadline - time.monotonic())))
        except OSError:
            if _answers((address[0], address[1] - RDZV_LEASE_PORT_OFFSET)):
                return f"the rendezvous store answers but its port {address[1]} does not (leases off)"
            if time.monotonic() >= deadline:
                return f"the rendezvous store's port {address[0]}:{address[1]} did not answer"
            time.sleep(0.5)


def _round(conn: socket.socket, size: int, seconds: float, token: str | None = None) -> float | str:
    """One echo of ``size`` bytes (asked with the job's ``token``'s MAC when given): the
    rate (bytes per second), or why there is none."""
    conn.settimeout(seconds)
    conn.sendall(echo_request(size, token))
    answer = b""
    while not answer.endswith(b"\n") and len(answer) < 16:
        got = conn.recv(1)
        if not got:
            return "the store does not echo (an older store, or the request refused)"
        answer += got
    if answer != b"ok\n":
        return f"the store is busy with other checks ({answer.decode(errors='replace').strip()[:16]})"
    payload = bytes(CHUNK)

    def send() -> None:
        try:
            left = size
            while left:
                left -= conn.send(payload[:min(CHUNK, left)])
        except OSError:
            pass  # the round's end (its deadline closes the socket) or the store's

    started = time.monotonic()
    sender = threading.Thread(target=send, name="preflight-send", daemon=True)
    sender.start()
    received, deadline = 0, started + seconds
    try:
        while received < size and (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(CHUNK)
            if not chunk:
                break
            received += len(chunk)
    except OSError:
        pass  # the deadline: measured by what came back
    elapsed = max(time.monotonic() - started, 1e-6)
    return received / elapsed


def measure(address: tuple[str, int], rounds: int = ROUNDS, size: int = ROUND_BYTES, seconds: float = ROUND_SECONDS,
            connect_window: float = CONNECT_WINDOW_SECONDS, token: str | None = None,
            enough: float | None = None) -> Result:
    """The best rate of up to ``rounds`` echoes through ``address``, a connection each,
    asked with the job's ``token`` (a store that has one echoes nothing else); the first
    round at ``enough`` bytes per second, when given, ends it."""
    endpoint = f"{address[0]}:{address[1]}"
    if enough is not None and enough > 0:
        # At the floor a round takes size/enough seconds; four times that (at least 1 s)
        # is plenty to tell a path below it, so a degraded node is refused in seconds.
        seconds = min(seconds, max(1.0, 4 * size / enough))
    rates: list[float] = []
    for index in range(rounds):
        conn = _connect(address, connect_window if index == 0 else 5.0)
        if isinstance(conn, str):
            return Result(endpoint, skipped=conn)
        with conn:
            outcome = _round(conn, size, seconds, token)
        if isinstance(outcome, str):
            return Result(endpoint, skipped=outcome)
        rates.append(outcome)
        if enough is not None and outcome >= enough:
            break
    return Result(endpoint, rate=max(rates), rounds=len(rates))


def floor_mbps(env: dict[str, str] | None = None) -> float:
    """``LLMTRAIN_PREFLIGHT_MIN_MBPS``; 0 (off) when unset or not a non-negative number."""
    text = (os.environ if env is None else env).get(Env.PREFLIGHT_MIN_MBPS, "")
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def verdict(result: Result, floor: float) -> str | None:
    """Why the node may not join (the termination message's words), or None."""
    if result.rate is None or result.mbps() >= floor:
        return None
    return (f"the pre-flight echo through the rendezvous store at {result.endpoint} ran at {result.mbps():.1f} MB/s "
            f"(the best of {result.rounds} rounds of {ROUND_BYTES >> 20} MiB), below faultTolerance.preflightMinMbps={floor:g}: "
            "this node's network is too slow to join the job")
