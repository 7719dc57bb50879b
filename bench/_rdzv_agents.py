"""A process of rendezvous agents for ``bench/rendezvous_scale.py``: each agent is a thread
running torch's own c10d rendezvous handler (what torchrun's agent runs), no training.

    python bench/_rdzv_agents.py --mode ours|plain --port P --run-id R --first I --count K
                                 --min-nodes MIN --max-nodes MAX [--token T]

``ours``: the handler as the project's torchrun agent patches it
(``launch/torchrun_agent.py``: the state read restricted and signed with the job's
token, re-read while joining at the pace the agent takes for the job's size,
``join_poll_seconds``), and each agent holds a lease on the store's lease port, as a
worker pod's launcher does, from its own loopback address (127.0.x.y, its torchrun
``--local-addr``), its hello signed with the token. ``plain``: torch's handler as
torchrun runs it.

Commands on stdin, a line each: ``form`` (every agent joins), ``kill N`` (the first N
agents still alive of this process die: their keep-alive stops and their lease
connection closes, as when a pod's processes are killed; every other agent joins the
next round, as torchrun's agent does when its workers fail), ``quit``. Events on stdout,
a JSON line each: ``{"ready": K}`` once every handler exists, ``{"joined": agent, "round":
r, "world": w}`` when an agent's ``next_rendezvous`` returns, ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "trainer_image"), str(ROOT / "common")]

KEEP_ALIVE_SECONDS, KEEP_ALIVE_MISSED, LAST_CALL_SECONDS = 1, 3, 1
"""torchrun's rendezvous settings as the operator passes them (``llmtrain_contract.command``)."""

_print_lock = threading.Lock()


def say(**event: object) -> None:
    with _print_lock:
        print(json.dumps(event), flush=True)


def address(index: int) -> str:
    """Agent ``index``'s own loopback address: its node's address in the rendezvous."""
    return f"127.0.{index // 250}.{index % 250 + 2}"


def patch_as_our_agent(max_nodes: int) -> None:
    spec = importlib.util.spec_from_file_location("llmtrain_torchrun_agent",
                                                  ROOT / "trainer_image" / "llmtrain_trainer" / "launch" / "torchrun_agent.py")
    agent = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(agent)
    poll = agent.join_poll_seconds([f"--nnodes={max_nodes}"])  # as the agent paces itself
    if not (agent.read_state_safely() and agent.read_through_forgeries()):
        raise SystemExit("this torch lacks what the project's torchrun agent patches")
    agent.poll_faster(poll)  # False at torch's own pace (64 nodes or more): torch's loop as it is


class Agent:
    def __init__(self, index: int, args: argparse.Namespace):
        from torch.distributed.elastic.rendezvous.api import RendezvousParameters  # noqa: PLC0415
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend  # noqa: PLC0415
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: PLC0415

        self.index, self.addr, self.args = index, address(index), args
        params = RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{args.port}", run_id=args.run_id, min_nodes=args.min_nodes,
            max_nodes=args.max_nodes, local_addr=self.addr, is_host="false", join_timeout="900",
            last_call_timeout=str(LAST_CALL_SECONDS), keep_alive_interval=str(KEEP_ALIVE_SECONDS),
            keep_alive_max_attempt=str(KEEP_ALIVE_MISSED), read_timeout="120")
        backend, store = create_backend(params)
        self.handler = create_handler(store, backend, params)
        self.lease: socket.socket | None = None
        self.alive = True

    def hold_lease(self, token: str) -> None:
        from llmtrain_trainer.pod.rdzvstate import purpose_key  # noqa: PLC0415
        from llmtrain_trainer.rendezvous.leases import line_mac  # noqa: PLC0415

        hello: dict[str, object] = {"run_id": self.args.run_id, "addr": self.addr, "pid": os.getpid(), "min_nodes": self.args.min_nodes}
        hello["mac"] = line_mac(purpose_key(token, "lease"), hello)
        conn = socket.create_connection(("127.0.0.1", self.args.port + 1), timeout=30, source_address=(self.addr, 0))
        conn.sendall((json.dumps(hello) + "\n").encode())
        self.lease = conn

    def join(self) -> None:
        try:
            info = self.handler.next_rendezvous()
            rank, world = (info.rank, info.world_size) if hasattr(info, "rank") else (info[1], info[2])
            say(joined=self.index, rank=rank, world=world, round=self.handler._state_holder.state.round)
        except Exception as err:  # noqa: BLE001 - reported to the bench, which counts it
            if self.alive:
                say(error=f"agent {self.index}: {type(err).__name__}: {err}"[:500])

    def die(self) -> None:
        self.alive = False
        self.handler._stop_heartbeats()  # torch's own: the keep-alive timer of a dead process stops
        if self.lease is not None:
            self.lease.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    for name, kind in (("--mode", str), ("--port", int), ("--run-id", str), ("--first", int), ("--count", int),
                       ("--min-nodes", int), ("--max-nodes", int)):
        parser.add_argument(name, type=kind, required=True)
    parser.add_argument("--token", default="")
    args = parser.parse_args()
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as the launcher runs torchrun
    if args.mode == "ours":
        os.environ["LLMTRAIN_RDZV_TOKEN"] = args.token
        patch_as_our_agent(args.max_nodes)
    agents = [Agent(i, args) for i in range(args.first, args.first + args.count)]
    if args.mode == "ours":
        for agent in agents:
            agent.hold_lease(args.token)
    say(ready=len(agents))
    for line in sys.stdin:
        command = line.split()
        if not command:
            continue
        if command[0] == "form":
            for agent in agents:
                threading.Thread(target=agent.join, daemon=True).start()
        elif command[0] == "kill":
            alive = [a for a in agents if a.alive]
            victims, survivors = alive[:int(command[1])], alive[int(command[1]):]
            for agent in victims:
                agent.die()
            for agent in survivors:
                threading.Thread(target=agent.join, daemon=True).start()
        elif command[0] == "quit":
            break
    os._exit(0)  # the handlers' timers and clients: nothing to wait for


if __name__ == "__main__":
    sys.exit(main())
