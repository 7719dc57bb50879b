"""Network conditions for the checkpoint benchmark, built on this machine.

Two properties of real networks decide how fast checkpoints move, and loopback has
neither:

- *Per-connection throughput is limited* (S3 serves one connection at tens of MB/s; a
  client gets bandwidth by opening many): ``PacedProxy`` forwards each TCP connection
  at a capped rate, so one stream is slow and parallel ranged GETs add up, as with S3.
- *Each node has its own link*: ``NodeLinks`` puts each emulated node in a network
  namespace whose egress is shaped (``tc tbf``), so N nodes writing their 1/N share of a
  replicated state move N times the bytes per second, as N hosts do.

This kernel has no ``fq`` or ``netem`` qdisc (``tbf`` and ``htb`` only), hence the proxy
for the per-connection limit.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time


class PacedProxy:
    """127.0.0.1:<port> -> ``target``, each connection paced to ``rate`` bytes/s in each
    direction (a token bucket per connection and direction)."""

    def __init__(self, target_host: str, target_port: int, rate: float, chunk: int = 256 << 10):
        self.target = (target_host, target_port)
        self.rate, self.chunk = rate, chunk
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paced-proxy", daemon=True)

    def start(self) -> PacedProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)
        except asyncio.CancelledError:
            pass

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        began, sent = time.monotonic(), 0
        try:
            while data := await reader.read(self.chunk):
                writer.write(data)
                await writer.drain()
                sent += len(data)
                ahead = began + sent / self.rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


class NodeLinks:
    """``count`` network namespaces ("nodes"), each joined to the host by a veth pair
    whose node-side egress is shaped to ``rate_mbit``. The host side of node i is
    10.231.<i>.1, the node side 10.231.<i>.2."""

    def __init__(self, count: int, rate_mbit: int, prefix: str = "llmb"):
        self.count, self.rate, self.prefix = count, rate_mbit, prefix

    def ns(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    def host_ip(self, i: int) -> str:
        return f"10.231.{i}.1"

    def __enter__(self) -> NodeLinks:
        self.down()
        for i in range(self.count):
            ns, host_if, node_if = self.ns(i), f"{self.prefix}h{i}", f"{self.prefix}p{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", node_if)
            _run("ip", "link", "set", node_if, "netns", ns)
            _run("ip", "addr", "add", f"{self.host_ip(i)}/30", "dev", host_if)
            _run("ip", "link", "set", host_if, "up")
            _run("ip", "-n", ns, "addr", "add", f"10.231.{i}.2/30", "dev", node_if)
            _run("ip", "-n", ns, "link", "set", node_if, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", node_if, "root", "tbf", "rate", f"{self.rate}mbit",
                 "burst", "1mb", "latency", "100ms")
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def down(self) -> None:
        for i in range(self.count):
            _run("ip", "link", "del", f"{self.prefix}h{i}", check=False)
            _run("ip", "netns", "del", self.ns(i), check=False)

    def command(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i), *argv]
