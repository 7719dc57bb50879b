"""The rank's side of the pod's fork server (``launch/zygote.py``).

torchrun starts every rank as ``python -m llmtrain_trainer``; when the launcher started a
fork server, that process asks it for a forked rank (``run_forked``, called first thing by
``__main__``) and then only stands in for it: it forwards signals to the child and exits
as the child did (the same code, or killed by the same signal), so torchrun, the
supervisor, the exit records and the heartbeat files (written by the child, with its pid)
see what they would see without the server.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
from typing import Any

REPLY_TIMEOUT_SECONDS = 120.0
"""How long a stand-in waits for its child's pid (the server's first import included)
before it gives up on the server and runs the trainer itself."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
MAX_MESSAGE = 1 << 20
"""The largest message either side sends (a request carries the rank's environment)."""


def _receive(conn: socket.socket) -> dict[str, Any] | None:
    data = conn.recv(MAX_MESSAGE)
    return json.loads(data) if data else None


def run_forked(path: str, argv: list[str]) -> int | None:
    """Ask the server at ``path`` for a forked rank and stand in for it until it exits;
    returns its exit code (or ends this process by its signal). None when no server
    answered: the caller runs the trainer itself."""
    streams = [fd for fd in (0, 1, 2) if _is_open(fd)]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.settimeout(REPLY_TIMEOUT_SECONDS)
        conn.connect(path)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "streams": streams}
        conn.sendmsg([json.dumps(request).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", streams))])
        first = _receive(conn)
    except (OSError, ValueError):
        conn.close()
        return None
    if not first or "pid" not in first:
        conn.close()
        return None
    pid = int(first["pid"])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    conn.settimeout(None)
    try:
        end = _receive(conn)
    except (OSError, ValueError):
        end = None
    if end is None:
        forward(signal.SIGKILL, None)
        print(f"llmtrain: the fork server ended before rank process {pid}; it was killed", file=sys.stderr, flush=True)
        return 1
    if "signal" in end:
        signum = int(end["signal"])
        if signum not in (signal.SIGKILL, signal.SIGSTOP):  # these two have no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # torchrun sees the rank killed by the same signal
        return 128 + signum  # a signal that does not end a process by default
    return int(end["exit"])


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
