"""The bed's node-side daemon: node agent + cluster DNS + PV provisioner + a control
endpoint for fault injection. Started in the background by ``cluster.py``.

    python -m localcluster.daemon --state DIR --kubeconfig FILE --venv-bin DIR \
        --node node-0:cpu=4,memory=16Gi,gpus=2,label.zone=a [--node ...] --control-port 17080
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client, config

from . import dns, network, provisioner
from .agent import Agent
from .pods import CGROUP_ROOT, NETNS_ETC

log = logging.getLogger("localcluster.daemon")


def parse_node(text: str) -> dict[str, Any]:
    name, _, rest = text.partition(":")
    spec: dict[str, Any] = {"name": name, "labels": {}}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key.startswith("label."):
            spec["labels"][key[6:]] = value
        elif key == "gpus":
            spec["gpus"] = int(value)
        else:
            spec[key] = value
    return spec


def control_server(agent: Agent, port: int, stop: threading.Event) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            return

        def _json(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._json(200, {"nodes": {n: s.healthy for n, s in agent.nodes.items()}, "pods": len(agent.pods)})
            else:
                self._json(404, {"error": self.path})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            try:
                if self.path == "/pods/kill":
                    ok = agent.kill_pod(body["namespace"], body["name"], getattr(signal, body.get("signal", "SIGKILL")))
                    self._json(200 if ok else 404, {"killed": ok})
                elif self.path == "/nodes/fail":
                    self._json(200, {"killed": agent.fail_node(body["name"])})
                elif self.path == "/nodes/partition":
                    self._json(200, {"pods": agent.partition_node(body["name"])})
                elif self.path == "/nodes/slow":
                    self._json(200, {"pods": agent.slow_node(body["name"], body.get("rate"))})
                elif self.path == "/nodes/heal":
                    agent.heal_node(body["name"])
                    self._json(200, {})
                elif self.path == "/shutdown":
                    self._json(200, {})
                    stop.set()
                else:
                    self._json(404, {"error": self.path})
            except KeyError as err:
                self._json(400, {"error": f"missing or unknown {err}"})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster.daemon")
    parser.add_argument("--state", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--venv-bin", required=True)
    parser.add_argument("--node", action="append", default=[])
    parser.add_argument("--control-port", type=int, default=17080)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config.load_kube_config(config_file=args.kubeconfig)
    api = client.ApiClient()
    state = Path(args.state)
    network.ensure_bridge()
    network.sweep(NETNS_ETC)
    CGROUP_ROOT.mkdir(parents=True, exist_ok=True)
    agent = Agent(api, state, args.venv_bin)
    for text in args.node:
        spec = parse_node(text)
        agent.add_node(spec["name"], cpu=spec.get("cpu", "8"), memory=spec.get("memory", "32Gi"),
                       gpus=spec.get("gpus", 0), labels=spec["labels"])
    stop = threading.Event()
    dns_servers = dns.serve(api)
    threads = [threading.Thread(target=t, daemon=True, name=t.__name__)
               for t in (agent.heartbeat_loop, agent.watch_loop, agent.supervise_loop)]
    threads.append(threading.Thread(target=provisioner.loop, args=(client.CoreV1Api(api), state / "pvs", stop), daemon=True))
    for t in threads:
        t.start()
    server = control_server(agent, args.control_port, stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("node agent up: %s", ", ".join(agent.nodes))
    stop.wait()
    log.info("shutting down: stopping every pod")
    server.shutdown()
    agent.shutdown()
    for s in dns_servers:
        s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
