"""The end-to-end suite's bed on kind (Kubernetes in Docker), for machines with Docker.

It has the surface of ``localcluster.cluster.LocalCluster`` that tests/e2e and the
benchmarks drive (``kubectl``, ``helm``, ``env``, ``bin``, ``kubeconfig``, ``state``,
``pod_log``, ``audit``, ``kill_pod``, ``fail_node``, ``partition_node``, ``heal_node``,
``wait_nodes_ready``, ``restart_apiserver``, ``down``), so the same suite runs on both;
only the bootstrap and the faults differ:

- the cluster is ``hack/kind/e2e.sh``'s: kind nodes are containers, the images are built
  from the Dockerfile and loaded into them, the operator is helm-installed by the suite;
- a node loss is ``docker kill`` of the node's container (every process dies, heartbeats
  stop) and its healing ``docker start``; a partition disconnects the container from the
  kind network and reconnects it at its address;
- a pod's processes are signalled inside its node (``crictl`` finds the containers, the
  cgroup lists every process in them);
- the API server is restarted by stopping its container (the kubelet starts it again).

The tests read the pods' volumes and container logs from the host at the local cluster's
layout (``state/pods/<uid>/volumes/<name>``, ``state/pods/<uid>/trainer.log`` and
``trainer.json``). Here the kind config mounts each node's ``/var/lib/kubelet/pods`` and
``/var/log/pods`` from the host (``kind_config``), and ``state`` is a view refreshed on
every access (``StateView``): links into those mounts, and copies of the container logs,
kept after the pod is gone as the local cluster keeps them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODE_KUBELET_PODS = "kubelet-pods"
NODE_POD_LOGS = "pod-logs"
PVS = "pvs"
"""Host folders below the bed's root: per node (``nodes/<node>/...``) the kubelet's pods
and their logs, and one folder of shared volumes mounted at the same path in every node."""
IN_NODE_PVS = "/llmtrain-pvs"
AUDIT = "audit"
TRAINER_CONTAINER = "trainer"

WORKERS = [
    # As the local cluster: a system node for the operator, three "GPU" nodes for jobs.
    {"labels": {"llmtrain.io/pool": "system"}, "gpus": 0},
    {"labels": {"llmtrain.io/pool": "gpu"}, "gpus": 2},
    {"labels": {"llmtrain.io/pool": "gpu"}, "gpus": 2},
    {"labels": {"llmtrain.io/pool": "gpu"}, "gpus": 2},
]

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Metadata
  verbs: [create, update, patch, delete]
"""


NODE_IMAGE_PATCHES: list[dict[str, Any]] = [
    # The images hack/kind/node-image.sh puts in the node image, at the versions it builds
    # (kubeadm would name its own defaults, which no registry can serve here).
    {"kind": "ClusterConfiguration", "etcd": {"local": {"imageTag": "3.6.16-0"}}, "dns": {"imageTag": "v1.15.0"}},
    # Hosts on cgroup v1 (this project's CI machine): kubelet >= 1.35 refuses them unless told.
    {"kind": "KubeletConfiguration", "failCgroupV1": False},
]


def kind_config(root: Path, workers: list[dict[str, Any]] = WORKERS) -> str:
    """The kind cluster config: node labels, the host mounts the state view reads, the
    audit log, and node-lifecycle timings as the local cluster's (NotReady after 16 s)."""
    root = root.resolve()
    nodes: list[dict[str, Any]] = [{
        "role": "control-plane",
        "extraMounts": [{"hostPath": str(root / AUDIT), "containerPath": "/var/log/kubernetes/audit"}],
        "kubeadmConfigPatches": [json.dumps({
            "kind": "ClusterConfiguration",
            "apiServer": {"extraArgs": {"audit-policy-file": "/var/log/kubernetes/audit/policy.yaml",
                                        "audit-log-path": "/var/log/kubernetes/audit/audit.log"},
                          "extraVolumes": [{"name": "audit", "hostPath": "/var/log/kubernetes/audit",
                                            "mountPath": "/var/log/kubernetes/audit", "pathType": "DirectoryOrCreate"}]},
            "controllerManager": {"extraArgs": {"node-monitor-grace-period": "16s"}},
        })],
    }]
    for i, worker in enumerate(workers):
        host = root / "nodes" / f"worker-{i}"
        nodes.append({
            "role": "worker",
            "labels": dict(worker["labels"]),
            "extraMounts": [
                {"hostPath": str(host / NODE_KUBELET_PODS), "containerPath": "/var/lib/kubelet/pods"},
                {"hostPath": str(host / NODE_POD_LOGS), "containerPath": "/var/log/pods"},
                {"hostPath": str(root / PVS), "containerPath": IN_NODE_PVS},
            ],
        })
    return json.dumps({"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "nodes": nodes,
                       "kubeadmConfigPatches": [json.dumps(p) for p in NODE_IMAGE_PATCHES]}, indent=2)


@dataclass
class StateView:
    """``state/pods/<uid>/...`` as the local cluster lays it out, from the kind nodes'
    mounts: ``volumes/<name>`` links to the pod's emptyDir, ``<container>.log`` is a copy
    of the container's newest log (kept once the pod is gone), ``trainer.json`` the
    trainer container's environment as the pod spec gives it."""

    root: Path
    pods_seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    """uid -> the pod, as the API last listed it (deleted pods stay)."""

    def refresh(self, pods: list[dict[str, Any]] | None = None) -> None:
        for pod in pods or []:
            self.pods_seen[pod["metadata"]["uid"]] = pod
        view = self.root / "pods"
        view.mkdir(parents=True, exist_ok=True)
        for node in sorted((self.root / "nodes").glob("*")):
            for pod_dir in (node / NODE_KUBELET_PODS).glob("*"):
                self._link_volumes(view / pod_dir.name, pod_dir)
            for log_dir in (node / NODE_POD_LOGS).glob("*_*_*"):
                uid = log_dir.name.rsplit("_", 1)[1]
                self._copy_logs(view / uid, log_dir)
        for uid, pod in self.pods_seen.items():
            self._write_trainer_env(view / uid, pod)

    @staticmethod
    def _link_volumes(into: Path, pod_dir: Path) -> None:
        volumes = into / "volumes"
        for kind_dir in (pod_dir / "volumes").glob("kubernetes.io~*"):
            for volume in kind_dir.iterdir():
                link = volumes / volume.name
                if not link.is_symlink():
                    volumes.mkdir(parents=True, exist_ok=True)
                    link.symlink_to(volume)

    @staticmethod
    def _copy_logs(into: Path, log_dir: Path) -> None:
        """``<namespace>_<pod>_<uid>/<container>/<restart>.log``: the newest restart's,
        in the CRI format (``time stream tag message``), as plain lines."""
        for container in log_dir.iterdir():
            logs = sorted(container.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
            if not logs:
                continue
            lines = []
            for path in logs:
                for line in path.read_text(errors="replace").splitlines():
                    parts = line.split(" ", 3)
                    lines.append(parts[3] if len(parts) == 4 else line)
            into.mkdir(parents=True, exist_ok=True)
            (into / f"{container.name}.log").write_text("\n".join(lines) + ("\n" if lines else ""))

    @staticmethod
    def _write_trainer_env(into: Path, pod: dict[str, Any]) -> None:
        container = next((c for c in pod["spec"]["containers"] if c["name"] == TRAINER_CONTAINER), None)
        if container is None:
            return
        env: dict[str, str] = {}
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
            elif (var.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[var["name"]] = pod["metadata"]["namespace"]
        into.mkdir(parents=True, exist_ok=True)
        (into / "trainer.json").write_text(json.dumps({"env": env, "node": pod["spec"].get("nodeName")}))


@dataclass
class KindCluster:
    """The bed on a kind cluster that ``hack/kind/e2e.sh`` created."""

    serves_pod_logs = True
    """Real kubelets: the API server reads pod logs from them."""

    name: str
    root: Path
    bin: Path
    view: StateView = field(init=False)
    timings: dict[str, float] = field(default_factory=dict)
    host_address: str = ""
    """Where pods reach this host (a server the tests start, e.g. MinIO): the kind
    network's gateway, known once ``up``."""
    _addresses: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.view = StateView(self.root)

    @classmethod
    def from_env(cls) -> KindCluster:
        return cls(os.environ.get("LLMTRAIN_KIND_CLUSTER", "llmtrain"), Path(os.environ["LLMTRAIN_KIND_STATE"]),
                   Path(os.environ.get("LLMTRAIN_KIND_BIN", "/usr/local/bin")))

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state(self) -> Path:
        """The local cluster's layout, refreshed now (see ``StateView``)."""
        out = self.kubectl("get", "pods", "-A", "-o", "json", check=False)
        self.view.refresh(json.loads(out.stdout)["items"] if out.returncode == 0 else None)
        return self.root

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}

    def up(self) -> KindCluster:
        from kubernetes import client, config  # noqa: PLC0415
        from localcluster import provisioner  # noqa: PLC0415

        self.wait_nodes_ready(120)
        self._advertise_gpus()
        network = json.loads(self._docker("network", "inspect", "kind").stdout)[0]
        self.host_address = next(c["Gateway"] for c in network["IPAM"]["Config"] if ":" not in c.get("Gateway", ":"))
        # ReadWriteMany claims (the shared tier) as the local cluster serves them: a folder
        # every node sees (kind's own provisioner makes node-local, ReadWriteOnce volumes).
        core = client.CoreV1Api(config.new_client_from_config(str(self.kubeconfig)))
        self._stop = threading.Event()
        threading.Thread(target=provisioner.loop, args=(core, self.root / PVS, self._stop, Path(IN_NODE_PVS)), daemon=True).start()
        return self

    def down(self, quiet: bool = False) -> None:
        """Stops the provisioner; the cluster belongs to hack/kind/e2e.sh, which deletes it."""
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    # ------------------------------------------------------------------ tools

    def _tool(self, name: str) -> str:
        """``bin/<name>`` (some tests run kubectl from ``bin`` themselves), else PATH's."""
        path = self.bin / name
        return str(path) if path.exists() else (shutil.which(name) or name)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self._tool("kubectl"), *args], env=self.env(), capture_output=True, text=True,
                              check=check, input=input, timeout=timeout)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self._tool("helm"), *args], env=self.env(), capture_output=True, text=True, check=check, timeout=timeout)

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        args = ["logs", name, "-n", namespace] + (["-c", container] if container else ["--all-containers"])
        return self.kubectl(*args, check=False).stdout

    def audit(self) -> list[dict[str, Any]]:
        from localcluster.cluster import read_audit_log  # noqa: PLC0415

        return read_audit_log(self.root / AUDIT / "audit.log")

    def wait_nodes_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.kubectl("get", "nodes", "-o", "json", check=False)
            if out.returncode == 0:
                items = json.loads(out.stdout)["items"]
                if items and all(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                                 for n in items):
                    return
            time.sleep(1)
        raise TimeoutError(f"kind nodes not Ready within {timeout}s")

    def _advertise_gpus(self) -> None:
        """The "GPU" pool's extended resource, as a device plugin would advertise it (the
        scheduling tests count GPUs; the trainers use CPU and gloo)."""
        for node in self.get("nodes")["items"]:
            if (node["metadata"].get("labels") or {}).get("llmtrain.io/pool") == "gpu":
                patch = json.dumps([{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "2"}])
                self.kubectl("patch", "node", node["metadata"]["name"], "--subresource=status", "--type=json", "-p", patch)

    # ------------------------------------------------------------------ faults

    def _docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=120)

    def _each_container(self, namespace: str, name: str, body: str, container: str | None = None) -> str:
        """Runs ``body`` in the pod's node once per container of the pod (one named
        ``container``, if given), with ``$pid`` its first process as the node sees it; its
        output."""
        node = self.get("pod", name, "-n", namespace)["spec"]["nodeName"]
        only = f" --name '^{container}$'" if container else ""
        # crictl's filters are regular expressions: anchored, so pod-1 does not match pod-10.
        script = (
            f"for s in $(crictl pods -q --state ready --name '^{name}$' --namespace '^{namespace}$'); do "
            f'for c in $(crictl ps -q --pod "$s"{only}); do '
            'pid=$(crictl inspect -o go-template --template "{{.info.pid}}" "$c"); '
            f"{body}; done; done")
        return self._docker("exec", node, "sh", "-c", script).stdout

    def kill_pod(self, namespace: str, name: str, signal: str = "SIGKILL") -> None:
        """Every process of every container of the pod, in its node, as the local agent does."""
        self._each_container(namespace, name, (
            # cgroup v1 (the pids hierarchy) or v2 (the unified one): every process of the container
            'line=$(grep -E "^[0-9]+:([^:]*,)?pids(,[^:]*)?:" "/proc/$pid/cgroup" || grep "^0::" "/proc/$pid/cgroup"); '
            'ctrl=$(echo "$line" | cut -d: -f2); cg=$(echo "$line" | cut -d: -f3-); '
            'for p in $(cat "/sys/fs/cgroup${ctrl:+/$ctrl}$cg/cgroup.procs"); do '
            f'kill -s {signal.removeprefix("SIG")} "$p" || true; done'))

    def signal_first_process(self, namespace: str, name: str, container: str, signal: str) -> None:
        """``signal`` (``SIGSTOP``) to a running container's first process, sent by the node.
        That process is the init of the pod's PID namespace: the kernel drops a signal sent
        to it from inside that namespace unless it handles it (SIGSTOP and SIGKILL cannot
        be handled), so a test that freezes it sends the signal from the node, an ancestor
        namespace."""
        out = self._each_container(namespace, name, f'kill -s {signal.removeprefix("SIG")} "$pid" && echo "$pid"', container)
        if not out.strip():
            raise LookupError(f"no running container {container!r} in pod {namespace}/{name}")

    def container_process(self, namespace: str, name: str, container: str) -> dict[str, str]:
        """What the runtime made of a running container's first process, read by the node's
        kernel, not the pod spec: its ``/proc/<pid>/status`` fields (``Uid``, ``Gid``,
        ``Groups``, ``NoNewPrivs``, ``Seccomp``, ``CapEff`` ...) and ``RootMount``, the
        options of the mount at ``/`` in its mount namespace (``ro,...`` for a read-only root
        filesystem)."""
        out = self._each_container(namespace, name, (
            'cat "/proc/$pid/status"; '
            "awk '$5 == \"/\" {print \"RootMount:\\t\" $6}' \"/proc/$pid/mountinfo\""), container)
        fields = dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)
        if not fields:
            raise LookupError(f"no running container {container!r} in pod {namespace}/{name}")
        return {key: value.strip() for key, value in fields.items()}

    def fail_node(self, name: str) -> None:
        self._docker("kill", name)

    def partition_node(self, name: str) -> None:
        """The node's own interface taken down, in its network namespace: its kubelet and
        its pods reach nothing off the node, and nothing reaches them. Not ``docker network
        disconnect``: kind's network has no user-set IPv4 subnet, so the engine refuses to
        connect the node again at its address (``--ip``), and at another one its kubelet
        would report the old one (seen on kind: the node stayed cut off, and every later
        test failed for want of it). The default route goes with the link; it is kept."""
        self._addresses[name] = self._docker("exec", name, "ip", "-4", "route", "show", "default").stdout.strip()
        self._docker("exec", name, "ip", "link", "set", "eth0", "down")

    def slow_node(self, name: str, rate: str | None) -> None:
        """Degrade what the node sends to other nodes to ``rate`` (tc's words, ``8mbit``), or
        lift it (None): a token bucket on the node's own interface, in its network
        namespace (the node container's), as a degraded NIC would. The node stays Ready;
        traffic between pods of the node is not shaped."""
        if rate is None:
            self._docker("exec", name, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        else:
            self._docker("exec", name, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                         "rate", rate, "burst", "32kbit", "latency", "400ms")

    def heal_node(self, name: str) -> None:
        """Whatever was done to the node, undone: a stopped node started, a cut link up
        again (with its default route), and a deleted Node object registered again by
        restarting its kubelet (as on a real node), its GPUs advertised again."""
        running = json.loads(self._docker("inspect", name).stdout)[0]["State"]["Running"]
        if not running:
            self._docker("start", name)
        elif name in self._addresses:
            default = self._addresses.pop(name)
            self._docker("exec", name, "ip", "link", "set", "eth0", "up")
            if default:
                self._docker("exec", name, "sh", "-c", f"ip route replace {default}")
        if "NotFound" in self.kubectl("get", "node", name, check=False).stderr:  # not a passing API error
            self._docker("exec", name, "systemctl", "restart", "kubelet")
            deadline = time.monotonic() + 120
            while self.kubectl("get", "node", name, check=False).returncode != 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node {name} did not register again within 120 s of its kubelet's restart")
                time.sleep(1)
            self._advertise_gpus()
            self.route_pods(name)

    def route_pods(self, name: str) -> None:
        """This machine reaches a node's pods through the node (``up.sh``): a Node object
        registered again gets a new ``podCIDR`` from the controller manager, and without a
        route to it every reply from this machine to those pods is lost (an S3 server or a
        webhook served here times out). The route follows, and ``down.sh``'s list too."""
        deadline = time.monotonic() + 60
        while not (cidr := self.get("node", name)["spec"].get("podCIDR")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {name} got no podCIDR within 60 s")
            time.sleep(1)
        address = self._docker("inspect", "-f", "{{.NetworkSettings.Networks.kind.IPAddress}}", name).stdout.strip()
        subprocess.run(["ip", "route", "replace", cidr, "via", address], check=True, capture_output=True, text=True)
        routes = self.root / "host-routes"
        known = routes.read_text().split() if routes.exists() else []
        if cidr not in known:
            with routes.open("a") as fh:
                fh.write(cidr + "\n")

    def restart_apiserver(self) -> float:
        began = time.monotonic()
        node = f"{self.name}-control-plane"
        self._docker("exec", node, "sh", "-c", "crictl stop $(crictl ps -q --name kube-apiserver)")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            time.sleep(1)
            if self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0:
                return time.monotonic() - began
        raise TimeoutError("the API server did not come back within 180 s")


def write_config(root: Path) -> Path:
    """The config and the host folders it mounts (kind refuses missing ones)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / AUDIT).mkdir(exist_ok=True)
    (root / AUDIT / "policy.yaml").write_text(AUDIT_POLICY)
    (root / PVS).mkdir(exist_ok=True)
    for i in range(len(WORKERS)):
        for sub in (NODE_KUBELET_PODS, NODE_POD_LOGS):
            (root / "nodes" / f"worker-{i}" / sub).mkdir(parents=True, exist_ok=True)
    path = root / "kind.json"
    path.write_text(kind_config(root))
    return path


if __name__ == "__main__":
    import sys

    print(write_config(Path(sys.argv[1])))
