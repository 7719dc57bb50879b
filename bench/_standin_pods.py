"""What a worker pod serves to the operator, for pods that kwok runs without a process.

bench/operator_scale.py runs hundreds of jobs' pods on kwok's fake nodes: they go Running
with an address from their node's ``podCIDR`` (a slice of 127.0.0.0/8, so every pod
address reaches this host's loopback) and nothing behind it. This one process answers
for all of them, on the ports a real worker serves:

- ``METRICS_PORT`` (the trainer's local rank 0): the page the real ``TrainerMetrics``
  renders (restricted by ``name[]`` as the real endpoint does), with the step advancing
  once a second from the first request to that address;
- ``HEALTH_PORT`` (the launcher): the page the real launcher renders, its workers running.

So every pass of the operator scrapes the endpoints of the running workers it reads and
finds progress to write, as it would on a cluster of trainers. The server tells pods apart
by the address they were dialled on (``getsockname``), and counts the pages it served:
``GET /requests`` on ``HEALTH_PORT`` answers ``trainer N`` and ``launcher M`` (the
benchmark's own count of the operator's probes, read from outside the operator). A pod's
rank is what the benchmark last posted for its address (``POST /ranks``, a JSON object
address -> rank: its slot in its job, as torchrun would number one rank a node), or, for
an address it did not name, the order of first requests modulo the world.

    python bench/_standin_pods.py [--step-seconds 1.0] [--world 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "common"), str(ROOT / "trainer_image")]

from llmtrain_contract.names import HEALTH_PORT, Metric  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402

METRICS_PORT = 9400
STEP_MARK, TIME_MARK = "987654321", "1234567890.5"
"""Values no real page holds: the places the step and its time go in the template."""


def trainer_registry(rank: int = 0, world: int = 2):
    """The real trainer's registry for a healthy rank of a job of ``world`` nodes, its step
    and step time set to marks (so a page's size and parse cost are the real ones)."""
    from llmtrain_trainer.train.metrics import TrainerMetrics  # noqa: PLC0415

    m = TrainerMetrics(rank=rank, strategy="ddp", config_hash="0" * 12, job="scale")
    m.started(world_size=world, restarts=0, failed_attempts={})
    m.step(int(STEP_MARK), samples=8, loss=3.5, seconds=1.0, node_tokens=512)
    m.checkpoint_committed("local", 10, seconds=0.2, size=46_000_000)
    m.tier_health("local", None)
    return m.registry


def trainer_page(names: list[str] | None = None, rank: int = 0, world: int = 2) -> str:
    """The page as the trainer's endpoint renders it, restricted to ``names`` as its
    ``name[]`` query asks (prometheus_client's own filter), with the marks in place."""
    registry = trainer_registry(rank, world)
    text = generate_latest(registry.restricted_registry(names) if names else registry).decode()
    out = []
    for line in text.splitlines():
        if line.startswith(Metric.LAST_STEP_TIMESTAMP + " "):
            line = f"{Metric.LAST_STEP_TIMESTAMP} {TIME_MARK}"
        out.append(line.replace("9.87654321e+08", STEP_MARK))
    page = "\n".join(out) + "\n"
    assert STEP_MARK in page and TIME_MARK in page, "the trainer's page changed: update the marks"
    return page


def launcher_page() -> bytes:
    from llmtrain_trainer.launch.supervisor import _Families  # noqa: PLC0415
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: PLC0415
    from llmtrain_contract.names import LauncherMetric  # noqa: PLC0415

    return generate_latest(_Families([
        CounterMetricFamily(LauncherMetric.FAILED_ATTEMPTS, "Failed attempts in this pod, by cause", labels=["cause"]),
        GaugeMetricFamily(LauncherMetric.ATTEMPT, "The attempt the local worker group runs", value=0),
        GaugeMetricFamily(LauncherMetric.WORKERS_RUNNING, "1 while torchrun's worker processes run", value=1)]))


class Pods:
    def __init__(self, step_seconds: float, world: int):
        self.step_seconds = step_seconds
        self.world = world
        self.first_seen: dict[str, float] = {}
        self.rank_of: dict[str, int] = {}
        """Each address's rank, in the order of their first request, modulo the world: the
        pods of one job each get a rank of their own."""
        self.assigned: dict[str, int] = {}
        """Address -> rank, as the benchmark posted them (``POST /ranks``)."""
        self.template = trainer_page(world=world)
        self.templates: dict[tuple[bytes, int], str] = {(b"", 0): self.template}
        self.launcher = launcher_page()
        self.served = {"trainer": 0, "launcher": 0}
        """Metrics pages asked for, by endpoint."""

    def trainer(self, address: str, query: bytes) -> bytes:
        rank = self.assigned.get(address)
        if rank is None:
            rank = self.rank_of.setdefault(address, len(self.rank_of) % self.world)
        template = self.templates.get((query, rank))
        if template is None:
            names = parse_qs(query.decode()).get("name[]")
            template = self.templates[(query, rank)] = trainer_page(names, rank, self.world)
        now = time.time()
        began = self.first_seen.setdefault(address, now)
        step = int((now - began) / self.step_seconds)
        last = began + step * self.step_seconds
        return template.replace(STEP_MARK, str(step)).replace(TIME_MARK, f"{last:.3f}").encode()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            address, port = writer.get_extra_info("sockname")[:2]
            target = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            path, _, query = target.partition(b"?")
            if path == b"/metrics" and port == METRICS_PORT and self.assigned and address not in self.assigned:
                # Ranks are given out: an address not among them yet is a trainer still
                # starting (no page), not one with a made-up rank that changes later.
                body, code = b"starting\n", b"503 Service Unavailable"
                self.served["trainer"] += 1  # asked all the same
            elif path == b"/metrics":
                body, code = (self.trainer(address, query) if port == METRICS_PORT else self.launcher), b"200 OK"
                self.served["trainer" if port == METRICS_PORT else "launcher"] += 1
            elif path == b"/ranks" and port == HEALTH_PORT and request.startswith(b"POST"):
                try:
                    length = int(next((line.split(b":", 1)[1] for line in request.split(b"\r\n")
                                       if line.lower().startswith(b"content-length:")), b"0"))
                    posted = json.loads(await asyncio.wait_for(reader.readexactly(length), timeout=10)) if length else {}
                    self.assigned = {str(k): int(v) % self.world for k, v in posted.items()}
                    body, code = f"{len(self.assigned)} ranks\n".encode(), b"200 OK"
                except (ValueError, TypeError, AttributeError) as err:
                    body, code = f"bad ranks: {err}\n".encode(), b"400 Bad Request"
            elif path == b"/requests" and port == HEALTH_PORT:
                body, code = "".join(f"{k} {v}\n" for k, v in self.served.items()).encode(), b"200 OK"
            elif path in (b"/healthz", b"/readyz") and port == HEALTH_PORT:
                body, code = b"ok\n", b"200 OK"
            else:
                body, code = b"not found\n", b"404 Not Found"
            writer.write(b"HTTP/1.1 " + code + b"\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--step-seconds", type=float, default=1.0)
    p.add_argument("--world", type=int, default=2, help="the jobs' worker count (their pages' world size and ranks)")
    args = p.parse_args()
    pods = Pods(args.step_seconds, args.world)
    # No SO_REUSEPORT: a second server on these ports must fail, not share them.
    servers = [await asyncio.start_server(pods.serve, "0.0.0.0", port, backlog=4096, reuse_address=True)
               for port in (METRICS_PORT, HEALTH_PORT)]
    print(f"serving {len(pods.template)} B trainer pages on :{METRICS_PORT} and the launcher on :{HEALTH_PORT}", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main())
