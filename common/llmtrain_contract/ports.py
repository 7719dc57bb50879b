"""Free TCP ports for processes that share one host (``llmtrain run``, the process bed,
tests), where a pod would have its own network namespace and fixed ports.

The c10d store serves leases on its port + ``RDZV_LEASE_PORT_OFFSET``, so a caller needs
a run of free ports, not one. Asking the kernel for port 0 gives one from the ephemeral
range, the same range it draws every outgoing connection's local port from: the next
port up may already be some client's, or become one before the second server binds it
(CI saw exactly that: ``Address already in use`` on the lease port). Ports below the
ephemeral range are never handed to a client, so only another explicit bind can take
them; a random start keeps concurrent callers apart.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000
"""Below this sit well-known and registered services' usual ports."""
_ATTEMPTS = 200


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default, and the start of IANA's dynamic range is higher


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive ports that bind on ``host`` now, below the
    ephemeral range; OSError naming the range when none is found."""
    high = _ephemeral_start() - count
    if high <= _LOWEST:
        raise OSError(f"no room for {count} ports between {_LOWEST} and the ephemeral range's start")
    for _ in range(_ATTEMPTS):
        base = random.randint(_LOWEST, high)
        if all(_bindable(host, base + i) for i in range(count)):
            return base
    raise OSError(f"no {count} consecutive free ports on {host} in {_ATTEMPTS} tries between {_LOWEST} and {high + count}")
