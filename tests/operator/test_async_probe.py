"""The operator's probes run on the event loop (probe.AsyncProber): a real trainer's and a
real launcher's pages are read as the synchronous scrape reads them, and an endpoint
that is down, refuses, answers an error or hangs is no answer, never an exception."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llmtrain_operator.probe import UNASKED, AsyncProber, scrape, scrape_launcher
from llmtrain_trainer.train.metrics import TrainerMetrics
from prometheus_client import generate_latest


def trainer_page() -> bytes:
    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="0" * 12, job="probe")
    m.started(world_size=2, restarts=1, failed_attempts={"crash": 1})
    m.step(42, samples=8, loss=3.5, seconds=1.0, node_tokens=512)
    m.checkpoint_committed("local", 40, seconds=0.2, size=1000)
    m.tier_health("shared", "NoSpace")
    return generate_latest(m.registry)


class Server:
    """A real HTTP server: /trainer, /launcher, /error (500), /slow (answers after 5 s),
    /huge (a valid page of 300 KB)."""

    def __init__(self):
        page = trainer_page()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/flood":  # 100 MB, streamed: a pod's answer to a scrape
                    self.send_response(200)
                    self.end_headers()
                    try:
                        for _ in range(1600):
                            self.wfile.write(b"# " + b"x" * 65533 + b"\n")
                    except OSError:
                        pass  # the prober hung up: as it should
                    return
                if self.path == "/slow":
                    time.sleep(5)
                if self.path == "/brief":
                    time.sleep(0.3)
                body = {"/trainer": page, "/slow": page, "/brief": page, "/huge": page + b"# padding\n" * 30_000,
                        "/launcher": b'llmtrain_launcher_failed_attempts_total{cause="hang"} 2.0\n'
                                     b"llmtrain_launcher_workers_running 1.0\n"}.get(self.path)
                self.send_response(200 if body else 500)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_async_probe_reads_what_the_synchronous_one_reads_and_no_answer_is_none():
    server = Server()
    prober = AsyncProber(concurrency=4)

    async def main():
        try:
            trainer, launcher, error, down = await asyncio.gather(
                prober.trainer(f"{server.url}/trainer", 2), prober.launcher(f"{server.url}/launcher", 2),
                prober.trainer(f"{server.url}/error", 2), prober.trainer(f"http://127.0.0.1:{closed_port()}/metrics", 2))
            started = time.monotonic()
            slow = await prober.trainer(f"{server.url}/slow", 0.5)
            waited = time.monotonic() - started
            many = await asyncio.gather(*(prober.trainer(f"{server.url}/trainer", 2) for _ in range(20)))
        finally:
            await prober.close()
        return trainer, launcher, error, down, slow, waited, many

    trainer, launcher, error, down, slow, waited, many = asyncio.run(main())
    assert trainer == scrape(f"{server.url}/trainer") and trainer.step == 42 and trainer.tier_degraded == {"shared": "NoSpace"}
    assert launcher == scrape_launcher(f"{server.url}/launcher") and launcher.failed == {"hang": 2}
    assert error is None and down is None and slow is None
    assert waited < 2, "a hanging trainer held the probe past its timeout"
    assert all(m == trainer for m in many), "20 probes through 4 connections"
    server.httpd.shutdown()


def test_a_timeout_runs_from_the_requests_start_not_from_its_wait_behind_the_others():
    """Ten pages that take 0.3 s each through 2 connections (a prober of 4: half for
    trainers' pages), with a 1 s timeout: the last ones wait 1.2 s for a connection and
    finish 1.5 s after the call, and each answers (counted from the call, as aiohttp's
    total timeout is, the last waves were lost to their own queue). Requests that cannot
    start within twice the timeout are not asked (``UNASKED``), so many hanging pods
    bound the round."""
    server = Server()
    prober = AsyncProber(concurrency=4)

    async def main():
        try:
            brief = await asyncio.gather(*(prober.trainer(f"{server.url}/brief", 1.0) for _ in range(10)))
            started = time.monotonic()
            hanging = await asyncio.gather(*(prober.trainer(f"{server.url}/slow", 0.3) for _ in range(40)))
            return brief, hanging, time.monotonic() - started
        finally:
            await prober.close()

    brief, hanging, took = asyncio.run(main())
    assert all(b is not None and b is not UNASKED and b.step == 42 for b in brief), \
        f"{sum(b is None or b is UNASKED for b in brief)} of 10 lost to the queue"
    # Those that started time out (None: the pod did not answer); the others were never
    # asked (UNASKED: nothing is known of those pods, no silence).
    assert all(h is None or h is UNASKED for h in hanging)
    assert 2 <= sum(h is None for h in hanging) <= 10 and sum(h is UNASKED for h in hanging) >= 25
    assert took < 2.5, f"40 hanging pods held the round {took:.1f}s (each request 0.3 s, the wait 0.6 s at most)"
    server.httpd.shutdown()


def test_a_prober_outlives_its_event_loop():
    """Each asyncio.run is a new loop (tests, a restarted operator): the prober opens a
    new session there instead of using one bound to a closed loop."""
    server = Server()
    prober = AsyncProber()
    first = asyncio.run(prober.trainer(f"{server.url}/trainer", 2))
    second = asyncio.run(prober.trainer(f"{server.url}/trainer", 2))
    assert first is not None and first == second
    server.httpd.shutdown()


def test_the_restricted_page_reads_as_the_whole_page_and_is_a_fraction_of_it():
    """The operator asks a trainer for the samples it reads (``name[]``, served by
    prometheus_client): every field of the probe is the same as from the whole page."""
    import urllib.request
    from types import SimpleNamespace

    from llmtrain_operator.probe import parse, trainer_url
    from prometheus_client import start_http_server

    m = TrainerMetrics(rank=0, strategy="ddp", config_hash="0" * 12, job="probe")
    m.started(world_size=4, restarts=2, failed_attempts={"crash": 1, "victim": 3})
    m.step(77, samples=8, loss=3.5, seconds=1.0, node_tokens=512)
    for tier, step in (("local", 70), ("shared", 60), ("s3", 50)):
        m.checkpoint_committed(tier, step, seconds=0.2, size=1000)
    m.tier_health("s3", "Unreachable")
    m.cadence(25, SimpleNamespace(cost_seconds=3.5, latency_seconds=4.0, mtbf_seconds=3600.0, step_seconds=1.25))
    m.stragglers({3: 1.8}, set())
    m.data_position(SimpleNamespace(rollbacks=1, heals=2, skips=[SimpleNamespace(first_step=10, last_step=12, first_sample=80,
                                                                                  end_sample=104)]))
    server, _ = start_http_server(0, addr="127.0.0.1", registry=m.registry)
    port = server.server_port
    whole = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    restricted = urllib.request.urlopen(trainer_url("127.0.0.1", port)).read().decode()
    server.shutdown()
    full, part = parse(whole), parse(restricted)
    assert part == full
    assert (part.step, part.world_size, part.interval_steps, part.stragglers, part.rollbacks, part.heals, len(part.skipped)) \
        == (77, 4, 25, {3: 1.8}, 1, 2, 1)
    assert part.tier_degraded == {"s3": "Unreachable"} and part.failed_attempts == {"crash": 1, "victim": 3}
    assert len(restricted) < len(whole) / 2


def test_a_page_over_the_size_limit_is_no_answer_and_is_not_read_whole():
    """A pod serving a huge page (hostile or broken) costs the operator at most MAX_BODY
    bytes of it, whichever probe reads it."""
    from llmtrain_operator.probe import MAX_BODY

    server = Server()
    prober = AsyncProber()
    assert len(trainer_page() + b"# padding\n" * 30_000) > MAX_BODY
    assert asyncio.run(prober.trainer(f"{server.url}/huge", 2)) is None
    assert scrape(f"{server.url}/huge") is None
    assert asyncio.run(prober.trainer(f"{server.url}/trainer", 2)) is not None, "a normal page still reads"
    server.httpd.shutdown()


def test_a_100_mb_page_costs_the_operator_no_more_than_the_limit():
    """A pod that answers a scrape with 100 MB (no Content-Length, streamed) moves the
    operator's memory by less than 10 MB: the prober stops reading at MAX_BODY."""
    import tracemalloc

    server = Server()
    prober = AsyncProber()
    tracemalloc.start()
    try:
        result = asyncio.run(prober.trainer(f"{server.url}/flood", 10))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result is None
    assert peak < 10 * 2**20, f"{peak / 2**20:.1f} MB held while probing a 100 MB page"
    assert scrape(f"{server.url}/flood", timeout=10) is None
    server.httpd.shutdown()


RSS_PROBE = """
import asyncio, sys
from llmtrain_operator.probe import AsyncProber

def kb(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))

async def main(url):
    prober = AsyncProber()
    assert await prober.trainer(url + "/trainer", 10) is not None  # imports, session, a parse thread: all warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the kernel resets this process's peak RSS (VmHWM) to its RSS now
    before = kb("VmRSS")
    flooded = (await prober.trainer(url + "/flood", 20), await prober.launcher(url + "/flood", 20))
    print(before, kb("VmHWM"), flooded == (None, None))
    await prober.close()

asyncio.run(main(sys.argv[1]))
"""


def test_a_100_mb_page_moves_the_operator_process_peak_rss_by_less_than_10_mb():
    """The same flood, measured as the issue asks: the kernel's peak resident set of a
    process that probes it (C buffers included, which tracemalloc does not see), from a
    reset just before the probes to just after, as the trainer and the launcher probe."""
    import subprocess
    import sys

    server = Server()
    try:
        out = subprocess.run([sys.executable, "-c", RSS_PROBE, server.url], capture_output=True, text=True, timeout=120)
    finally:
        server.httpd.shutdown()
    assert out.returncode == 0, out.stderr[-2000:]
    before, peak, refused = out.stdout.split()
    assert refused == "True", "a 100 MB page must be no answer"
    grown = (int(peak) - int(before)) / 1024
    assert grown < 10, f"peak RSS grew by {grown:.1f} MB while probing a 100 MB page twice"
