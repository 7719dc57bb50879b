"""Run a real elastic job on this machine: a rendezvous store plus N "nodes", each a
launcher -> torchrun -> trainer process tree with its own run dir and local tier.

Used by the trainer suite (tests/trainer/). The command lines come from
``llmtrain_contract.command``, exactly as the operator renders them into pods.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from llmtrain_contract.command import store_command, torchrun_args, trainer_program, worker_command
from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET
from llmtrain_contract.ports import free_ports
from llmtrain_operator.localrun.cluster import descendants

PY = sys.executable


def free_port(count: int = 1) -> int:
    """The first of ``count`` consecutive free ports (``llmtrain_contract.ports``)."""
    return free_ports(count)


def base_config(**overrides: Any) -> dict[str, Any]:
    """A tiny, fast DDP config; tests override what they exercise."""
    cfg: dict[str, Any] = {
        "jobName": "test",
        "maxSteps": 30,
        "globalBatchSize": 8,
        "microBatchSize": 2,
        "logIntervalSteps": 5,
        "data": {"seqLen": 32, "vocabSize": 256},
        "model": {"preset": "tiny"},
        "optimizer": {"lr": 0.002, "warmupSteps": 3},
        "checkpoint": {"intervalSteps": 5},
        "faultTolerance": {"hangTimeoutSeconds": 60, "collectiveTimeoutSeconds": 30},
        "metrics": {"port": 0, "host": "127.0.0.1"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@dataclass
class Node:
    index: int
    proc: subprocess.Popen
    log: Path
    run_dir: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class ElasticJob:
    """One job run. ``root`` holds node dirs and the shared tier; reuse the same root
    for a second run to resume from the first run's checkpoints."""

    root: Path
    config: dict[str, Any]
    nodes: int = 1
    procs_per_node: int = 1
    min_nodes: int | None = None
    max_restarts: int = 0
    node_max_restarts: dict[int, int] = field(default_factory=dict)
    """Node -> its torchrun's ``--max-restarts``, where not ``max_restarts``."""
    shared_tier: bool = False
    shared_keep: int = 3
    extra_tiers: list[dict[str, Any]] = field(default_factory=list)
    """Tiers after local (and shared), e.g. an S3 tier."""
    local_dirs: dict[int, Path] = field(default_factory=dict)
    """Node -> its tier-1 directory, where not ``node<i>/ckpt`` (e.g. a tiny filesystem)."""
    env: dict[str, str] = field(default_factory=dict)
    node_env: dict[int, dict[str, str]] = field(default_factory=dict)
    """Node -> environment of its own on top of ``env`` (a fault on one node, whichever
    ranks the rendezvous gives it)."""
    health_port: int | None = None
    """Node i's launcher serves /healthz and /metrics on this port + i (``free_port(nodes)``)."""
    program: list[str] | None = None
    """torchrun's program for a user's script (``script_program``), in place of the
    built-in trainer; its tiers then come from ``env``/``node_env``, as the operator gives
    a script job them (``LLMTRAIN_CHECKPOINT_TIERS``)."""
    running: list[Node] = field(default_factory=list)
    store: subprocess.Popen | None = None

    def node_dir(self, index: int) -> Path:
        return self.root / f"node{index}"

    def _node_config(self, index: int) -> Path:
        cfg = json.loads(json.dumps(self.config))
        ckpt = cfg.setdefault("checkpoint", {})
        tiers = [{"name": "local", "uri": str(self.local_dirs.get(index, self.node_dir(index) / "ckpt")), "keep": 3}]
        if self.shared_tier:
            tiers.append({"name": "shared", "uri": str(self.root / "shared"), "keep": self.shared_keep})
        ckpt.setdefault("tiers", tiers + self.extra_tiers)
        cfg["runDir"] = str(self.node_dir(index) / "run")
        path = self.node_dir(index) / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg))
        return path

    def start(self) -> ElasticJob:
        port = free_port(1 + RDZV_LEASE_PORT_OFFSET)  # the store's and its leases'
        self.root.mkdir(parents=True, exist_ok=True)
        with self.store_log.open("w") as fh:
            self.store = subprocess.Popen(store_command(PY, port, "127.0.0.1"), stdout=fh, stderr=subprocess.STDOUT)
        self._flags = torchrun_args(
            nnodes_min=self.min_nodes or self.nodes, nnodes_max=self.nodes, nproc_per_node=self.procs_per_node,
            rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id="test-job", max_restarts=self.max_restarts,
            join_timeout_seconds=120, last_call_seconds=1,
        )
        for index in range(self.nodes):
            self.running.append(self._start_node(index))
        return self

    def threads_per_rank(self) -> int:
        """Each rank's ``OMP_NUM_THREADS``: this machine's cores over every rank of every
        node, at least 1, as the operator gives the ranks of pods that share a node
        (``planner/environment.py``); one set in the environment or in ``env`` wins. With
        torch's default, a thread per core in every rank, the nodes here oversubscribe the
        cores: 4 nodes of the tiny model paced to 0.3 s took 0.8 to 3.2 s a step, and
        0.42 to 0.45 s with one thread each (the trainer's own step times, 30 steps)."""
        given = self.env.get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        if given and given.isdigit():
            return int(given)
        return max(1, len(os.sched_getaffinity(0)) // (self.nodes * self.procs_per_node))

    def _start_node(self, index: int, log_mode: str = "w") -> Node:
        env = {"OMP_NUM_THREADS": str(self.threads_per_rank()), **os.environ, "LLMTRAIN_FAULT_STATE_DIR": str(self.root / "faults"),
               "LLMTRAIN_LOG_LEVEL": "INFO", **self.env, **self.node_env.get(index, {})}
        cfg_path = self._node_config(index)
        run_dir = self.node_dir(index) / "run"
        log = self.node_dir(index) / "node.log"
        restarts = self.node_max_restarts.get(index, self.max_restarts)
        node_flags = [f"--max-restarts={restarts}" if f.startswith("--max-restarts=") else f for f in self._flags]
        program = self.program or trainer_program(str(cfg_path))
        cmd = worker_command(PY, str(run_dir), node_flags, program, str(self.node_dir(index) / "termination-log"),
                             self.health_port + index if self.health_port else None)
        with log.open(log_mode) as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return Node(index, proc, log, run_dir)

    def replace_node(self, index: int) -> Node:
        """Start node ``index`` again after ``kill_node``, as the pod that replaces a lost
        one: the same node folder (its tier 1 and run dir survive, as on the same host),
        its output appended to the same log."""
        self.running[index] = self._start_node(index, log_mode="a")
        return self.running[index]

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        try:
            for node in self.running:
                codes.append(node.proc.wait(timeout=max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("job timed out:\n" + self.logs()) from None
        finally:
            self.stop_store()
        return codes

    @property
    def store_log(self) -> Path:
        return self.root / "store.log"

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index``'s whole process tree, as when its pod dies: torchrun starts
        its workers in sessions of their own, which the launcher's process group does not
        reach."""
        node = self.running[index]
        if node.proc.poll() is None:
            tree = descendants(node.proc.pid)
            os.killpg(node.proc.pid, signal.SIGKILL)
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            node.proc.wait()

    def kill(self) -> None:
        """SIGKILL every node's whole process tree."""
        for node in self.running:
            self.kill_node(node.index)
        self.stop_store()

    def stop_store(self) -> None:
        if self.store and self.store.poll() is None:
            self.store.terminate()
            self.store.wait(timeout=10)

    def logs(self, tail: int | None = None) -> str:
        """Every node's whole output, or only each node's last ``tail`` characters.

        Whole by default: tests check that a line is present, and a long stack dump or
        many step lines could push an early line out of a tail."""
        return "\n".join(f"----- node {n.index} -----\n{n.output()[-tail if tail else 0:]}" for n in self.running)

    def steps(self) -> list[dict[str, Any]]:
        """Every step record rank 0 wrote, in time order (rank 0 may move between nodes)."""
        records = []
        for path in self.root.glob("node*/run/steps.jsonl"):
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(records, key=lambda r: r["time"])

    def exits(self) -> dict[int, list[dict[str, Any]]]:
        """Per torchrun attempt, the exit record of every rank that wrote one, on any node
        (``exitrecord.py``: its code, message and last step)."""
        out: dict[int, list[dict[str, Any]]] = {}
        for path in sorted(self.root.glob("node*/run/exit/attempt-*/local-*.json")):
            attempt = int(path.parent.name.removeprefix("attempt-"))
            out.setdefault(attempt, []).append(json.loads(path.read_text()))
        return out

    def termination(self, index: int) -> dict[str, Any]:
        return json.loads((self.node_dir(index) / "termination-log").read_text())


def run_job(root: Path, config: dict[str, Any], timeout: float = 300, **kwargs: Any) -> tuple[ElasticJob, list[int]]:
    job = ElasticJob(root, config, **kwargs).start()
    return job, job.wait(timeout)


def losses_by_step(records: list[dict[str, Any]]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in records:
        out.setdefault(r["step"], []).append(r["loss"])
    return out
