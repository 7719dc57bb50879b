"""Bring the whole bed up and down, and drive it from tests.

    bed = LocalCluster.default()
    bed.up()                       # build/reuse tools, control plane, bridge, node agent
    bed.kubectl("get", "nodes")
    bed.fail_node("node-1")
    bed.down()
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import control_plane, network
from .control_plane import Layout

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_NODES = [
    # A system node for the operator, and a pool of "GPU" nodes for the jobs: losing a
    # GPU node in a test must not take the operator with it (nor does it in production).
    "node-0:cpu=8,memory=32Gi,label.llmtrain.io/pool=system",
    "node-1:cpu=8,memory=32Gi,gpus=2,label.llmtrain.io/pool=gpu",
    "node-2:cpu=8,memory=32Gi,gpus=2,label.llmtrain.io/pool=gpu",
    "node-3:cpu=8,memory=32Gi,gpus=2,label.llmtrain.io/pool=gpu",
]
CONTROL_PORT = 17080
MOUNTED_OVER = ("/tmp",)
"""Where the project's pods mount volumes over the host's tree (an emptyDir at /tmp beside
a read-only root). A pod runs on the host's files, so whatever lies below is hidden in it."""


def check_reachable_in_pods(paths: list[Path]) -> None:
    """Refuse a bed whose own files (the venv, container_init.py, the pods' volumes) lie
    under a path the pods mount over: every such pod would fail at its first mount or
    exec ("special device ... does not exist"), far from the cause."""
    for path in paths:
        for top in MOUNTED_OVER:
            if str(path) == top or str(path).startswith(top + "/"):
                raise RuntimeError(f"the local cluster cannot run from {path}: its pods mount an emptyDir over {top}, "
                                   f"which hides it inside them. Clone the project (or set LLMTRAIN_LOCALCLUSTER_STATE) "
                                   f"outside {top}.")


def read_audit_log(path: Path) -> list[dict[str, Any]]:
    """The API server's audit events in ``path`` so far (JSON lines; none if absent)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line being written right now
    return events


def build_tools(*tools: str) -> Path:
    """The bin directory holding ``tools`` (default: all), built first if missing. Waits
    while another run of build.sh builds them (the test suite starts one early)."""
    out = subprocess.run(["bash", str(ROOT / "hack" / "cluster-tools" / "build.sh"), *tools], capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-30:])
        raise RuntimeError(f"hack/cluster-tools/build.sh {' '.join(tools)} failed (exit {out.returncode}):\n{tail}")
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class LocalCluster:
    serves_pod_logs = False
    """No kubelet API (docs/local-cluster.md): the API server cannot read a pod's log."""
    state: Path
    nodes: list[str] = field(default_factory=lambda: list(DEFAULT_NODES))
    venv_bin: Path = ROOT / ".venv" / "bin"
    bin: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def default(cls) -> LocalCluster:
        state = Path(os.environ.get("LLMTRAIN_LOCALCLUSTER_STATE", ROOT / ".cache" / "localcluster"))
        return cls(state=state)

    @property
    def layout(self) -> Layout:
        assert self.bin is not None
        return Layout(self.state, self.bin)

    @property
    def kubeconfig(self) -> Path:
        return self.state / "admin.kubeconfig"

    @property
    def host_address(self) -> str:
        """Where pods reach this host (a server the tests start, e.g. MinIO): the bridge."""
        return network.GATEWAY

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}

    # ------------------------------------------------------------------ lifecycle

    def up(self) -> LocalCluster:
        check_reachable_in_pods([ROOT, self.venv_bin, self.state])
        began = time.monotonic()
        self.bin = build_tools()
        self.timings["tools_seconds"] = time.monotonic() - began
        self.down(quiet=True)  # a previous run may have left processes behind
        self.state.mkdir(parents=True, exist_ok=True)
        for stale in ("etcd", "pods", "nodes", "pvs", "logs"):  # every `up` is a fresh cluster
            shutil.rmtree(self.state / stale, ignore_errors=True)
        started = time.monotonic()
        control_plane.start(self.layout)
        network.ensure_bridge()
        self._start_daemon()
        self.wait_nodes_ready()
        self._wait_default_service_account()
        self.timings["start_seconds"] = time.monotonic() - started
        (self.state / "timings.json").write_text(json.dumps(self.timings))
        return self

    def _start_daemon(self) -> None:
        log = (self.layout.logs / "node-agent.log").open("ab")
        cmd = [sys.executable, "-m", "localcluster.daemon", "--state", str(self.state),
               "--kubeconfig", str(self.state / "agent.kubeconfig"), "--venv-bin", str(self.venv_bin),
               "--control-port", str(CONTROL_PORT)]
        for node in self.nodes:
            cmd += ["--node", node]
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'hack'}:{os.environ.get('PYTHONPATH', '')}"}
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        (self.layout.pids / "node-agent.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"node agent exited; see {self.layout.logs / 'node-agent.log'}")
            try:
                self._control("GET", "/healthz")
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError("node agent did not come up")

    def down(self, quiet: bool = False) -> None:
        if self.bin is None:
            self.bin = build_tools()
        layout = self.layout
        if control_plane.running(layout, "node-agent"):
            try:
                self._control("POST", "/shutdown", {})
            except OSError:
                pass
            control_plane.stop(layout, "node-agent", timeout=60)
        control_plane.stop_all(layout)
        network.sweep(Path("/etc/netns"))
        if not quiet:
            network.remove_bridge()

    def wait_nodes_ready(self, timeout: float = 60) -> None:
        names = [n.split(":")[0] for n in self.nodes]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.kubectl("get", "nodes", "-o", "json", check=False)
            if out.returncode == 0:
                ready = {n["metadata"]["name"] for n in json.loads(out.stdout)["items"]
                         if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
                if set(names) <= ready:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"nodes {names} not Ready within {timeout}s")

    def _wait_default_service_account(self, timeout: float = 60) -> None:
        """Pods are refused until the controller-manager created the default SA."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise TimeoutError("no default service account")

    # ------------------------------------------------------------------ tools

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "kubectl"), *args], env=self.env(), capture_output=True, text=True,
                              check=check, input=input, timeout=timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin / "helm"), *args], env=self.env(), capture_output=True, text=True, check=check, timeout=timeout)

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """Container logs (there is no kubelet API, so no ``kubectl logs``)."""
        pod = self.get("pod", name, "-n", namespace)
        folder = self.state / "pods" / pod["metadata"]["uid"]
        names = [container] if container else [c["name"] for c in pod["spec"]["containers"]]
        return "\n".join((folder / f"{n}.log").read_text(errors="replace") for n in names if (folder / f"{n}.log").exists())

    def audit(self) -> list[dict[str, Any]]:
        """The API server's audit events so far: every write a workload's service account
        made (who, from which replica by user agent, when, and the answer)."""
        return read_audit_log(control_plane.audit_log(self.layout))

    # ------------------------------------------------------------------ faults

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{CONTROL_PORT}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - a loopback http URL built here
            return json.loads(resp.read() or b"{}")

    def kill_pod(self, namespace: str, name: str, signal: str = "SIGKILL") -> None:
        self._control("POST", "/pods/kill", {"namespace": namespace, "name": name, "signal": signal})

    def fail_node(self, name: str) -> None:
        self._control("POST", "/nodes/fail", {"name": name})

    def partition_node(self, name: str) -> None:
        self._control("POST", "/nodes/partition", {"name": name})

    def slow_node(self, name: str, rate: str | None) -> None:
        """Degrade the node's links to ``rate`` (``8mbit``), or lift it (None)."""
        self._control("POST", "/nodes/slow", {"name": name, "rate": rate})

    def heal_node(self, name: str) -> None:
        self._control("POST", "/nodes/heal", {"name": name})

    def restart_apiserver(self) -> float:
        began = time.monotonic()
        control_plane.restart_apiserver(self.layout)
        return time.monotonic() - began
