"""The pod's small HTTP servers (the launcher's health port, each rank's metrics port),
bounded: any pod in the cluster can connect to them.

``http.server``'s threading server starts a thread per connection and waits forever for
a request line: a thousand idle connections were a thousand threads, until the pod could
start no process (torchrun's restart, the fork server, py-spy). Here each connection has
a socket timeout, and a connection beyond the caps (in all, and per peer address) is
closed at once instead of getting a thread. The per-peer cap keeps one noisy client from
taking the slots of the others: the kubelet's probes come from the node's address, the
operator's scrapes from its pod's.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_CONNECTIONS = 256
"""Connections handled at once (each holds a thread while it lasts): 32 pods at the
per-peer cap before the kubelet's probe could find no slot."""
MAX_PER_PEER = 8
"""Of those, from one address."""
CONNECTION_TIMEOUT_SECONDS = 5.0
"""A connection that sends nothing (or reads nothing) for this long is closed."""


class BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # A listen backlog like the default's: what waits there holds no thread.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_CONNECTIONS, max_per_peer: int = MAX_PER_PEER,
                 timeout: float = CONNECTION_TIMEOUT_SECONDS):
        self.max_connections, self.max_per_peer, self.connection_timeout = max_connections, max_per_peer, timeout
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()
        self.refused = 0
        """Connections closed at once because a cap was reached (for tests and logs)."""
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        with self._lock:
            if sum(self._open.values()) >= self.max_connections or self._open[peer] >= self.max_per_peer:
                self.refused += 1
                refuse = True
            else:
                self._open[peer] += 1
                refuse = False
        if refuse:
            self.shutdown_request(request)
            return
        request.settimeout(self.connection_timeout)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(peer)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is not worth a traceback in the pod's log."""

    def _release(self, peer: str) -> None:
        with self._lock:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    def open_connections(self) -> int:
        with self._lock:
            return sum(self._open.values())


def serve(host: str, port: int, handler: type[BaseHTTPRequestHandler], name: str, **caps: Any) -> BoundedHTTPServer:
    """Start a bounded server on a daemon thread; ``port=0`` picks a free one. ``host``
    may be an IPv6 address (a pod's IP in an IPv6 cluster)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    cls = BoundedHTTPServer if family == socket.AF_INET else type("BoundedHTTPServerV6", (BoundedHTTPServer,),
                                                                      {"address_family": family})
    server = cls((host, port), handler, **caps)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
