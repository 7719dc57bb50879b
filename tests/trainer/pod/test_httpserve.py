"""The pod's HTTP servers are bounded: idle connections from anywhere in the cluster
cost no thread beyond the caps, time out, and leave other clients (the kubelet's
probes, the operator's scrapes) served."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler

from llmtrain_trainer.pod import httpserve
from llmtrain_trainer.train.metrics import TrainerMetrics
from support.waiting import wait_for


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _get_from(source: str, port: int, path: str = "/") -> bytes:
    """A request from another loopback address (another peer, as a probe from the node is)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _idle(port: int, n: int) -> list[socket.socket]:
    conns = []
    for _ in range(n):
        conns.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    return conns


def test_a_thousand_idle_connections_hold_at_most_the_caps_threads_and_others_are_still_served():
    server = httpserve.serve("127.0.0.1", 0, Hello, "test-bounded", timeout=1.0)
    port = server.server_port
    threads_before = threading.active_count()
    conns = _idle(port, 1000)
    try:
        # Accepted and closed at once, but for the caps' few (and what the kernel's accept
        # queue still holds: it drains as the client's handshakes are retried).
        deadline = time.monotonic() + 3
        while server.refused < 900 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.refused >= 900
        grew = threading.active_count() - threads_before
        assert grew <= httpserve.MAX_PER_PEER, f"{grew} threads for idle connections from one peer"
        started = time.monotonic()
        assert _get_from("127.0.0.2", port).endswith(b"hello\n"), "another peer is served at once"
        assert time.monotonic() - started < 1.0
    finally:
        for c in conns:
            c.close()
    # The idle ones that held threads time out: their slots come back.
    deadline = time.monotonic() + 5
    while server.open_connections() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.open_connections() == 0
    assert _get_from("127.0.0.1", port).endswith(b"hello\n")
    server.shutdown()


def test_the_total_cap_holds_across_peers():
    server = httpserve.serve("127.0.0.1", 0, Hello, "test-total", max_connections=4, max_per_peer=4, timeout=2.0)
    port = server.server_port
    conns = [socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(f"127.0.0.{i}", 0)) for i in range(3, 9)]
    try:
        # The accept thread sorts the six in its own time: wait until it has seen them all.
        wait_for(lambda: server.open_connections() + server.refused == 6, 5, 0.02, "all six connections accepted or refused")
        assert server.open_connections() == 4 and server.refused == 2
    finally:
        for c in conns:
            c.close()
        server.shutdown()


def test_a_ranks_metrics_endpoint_answers_its_scraper_through_idle_connections(tmp_path):
    metrics = TrainerMetrics(rank=0, strategy="ddp", config_hash="0" * 12, job="bounded")
    metrics.step(7, samples=8, loss=1.0, seconds=0.5, node_tokens=64)
    port = metrics.serve("127.0.0.1", 0, tmp_path, 0)
    conns = _idle(port, 300)
    try:
        page = _get_from("127.0.0.3", port, "/metrics?name[]=llmtrain_trainer_step")
        assert b"llmtrain_trainer_step 7.0" in page and b"llmtrain_trainer_loss" not in page, "name[] filtering kept"
    finally:
        for c in conns:
            c.close()
    full = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    assert b"llmtrain_trainer_loss" in full
