"""The operator's Kubernetes client keeps its connections: every write returns its
connection to the pool (k8s/client.py ``_release``). Before, a write's raw response
kept its connection out of the pool, so each write opened a new connection (a TLS
handshake on a real API server, which at 500 jobs cost both sides most of their CPU)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llmtrain_operator.k8s.client import K8s


class CountingServer:
    """An HTTP/1.1 server that answers every request with a small JSON object and counts
    the connections it accepted."""

    def __init__(self):
        self.connections = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                outer.connections += 1
                super().setup()

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps({"kind": "Status", "items": [], "metadata": {}}).encode()
                self.send_response(201 if self.command == "POST" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def test_writes_and_reads_reuse_one_connection():
    server = CountingServer()
    k8s = K8s.for_url(server.url)
    job = {"apiVersion": "llmtrain.io/v1alpha1", "kind": "LLMTrainJob", "metadata": {"name": "a", "namespace": "ns", "uid": "u"}}
    for step in range(5):
        assert k8s.patch_status("ns", "a", {"step": step}, "7")
    assert k8s.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}})
    assert k8s.delete_pod("ns", "p", grace_seconds=5)
    k8s.post_event(job, "Normal", "Test", "hello")
    assert k8s.list_pods("ns", "x=y") == []
    assert k8s.read_object("llmtrain.io/v1alpha1", "llmtrainjobs", "ns", "a")[0]
    assert server.connections == 1, f"{server.connections} connections for 10 sequential requests"
    server.httpd.shutdown()
