"""Running one pod: its network, volumes, containers, probes, status and deletion.

A container is ``ip netns exec <ns> unshare -m -u python container_init.py <spec>``;
its processes live in a per-container memory cgroup, which bounds memory (limits),
tells OOM kills apart, and lets a kill reach every process the container started. No
image is pulled: a container's command runs in the Python environment its image names
(``images.py``). Init containers run first, one at a time, each to success, as the
kubelet runs them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from . import images, network, volumes
from .network import GATEWAY

log = logging.getLogger("localcluster.pods")
CGROUP_ROOT = Path("/sys/fs/cgroup/memory/localcluster")
INIT = str(Path(__file__).with_name("container_init.py"))
NETNS_ETC = Path("/etc/netns")
API_PORT = 443  # see control_plane.API_PORT
CONFIG_RETRY_SECONDS = 1.0
"""How often a pod waiting on a missing ConfigMap/Secret looks again (the kubelet retries too)."""
VOLUME_REFRESH_SECONDS = 3.0
"""How often mounted ConfigMaps and Secrets are refreshed in running pods (the kubelet
does it within about a minute; tests do not wait that long)."""


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantity_bytes(value: Any) -> int | None:
    if value is None:
        return None
    text = str(value)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


@dataclass
class Container:
    spec: dict[str, Any]
    proc: subprocess.Popen | None = None
    cgroup: Path | None = None
    restarts: int = 0
    started_at: str | None = None
    last_terminated: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None
    ready: bool = False
    next_start: float = 0.0
    next_probe: float = 0.0
    next_liveness: float = 0.0
    liveness_failures: int = 0
    kill_at: float | None = None
    """After a failed liveness probe: when the SIGTERMed container gets SIGKILL."""
    waiting_reason: str | None = "ContainerCreating"
    waiting_message: str | None = None

    @property
    def name(self) -> str:
        return self.spec["name"]


@dataclass
class PodRunner:
    core: client.CoreV1Api
    pod: dict[str, Any]
    node: str
    state: Path
    ip: str
    venv_bin: str
    containers: list[Container] = field(default_factory=list)
    init_containers: list[Container] = field(default_factory=list)
    netns: str | None = None
    link_rate: str | None = None
    """The node's degraded link (``Agent.slow_node``): applied before any container starts."""
    deleting_since: float | None = None
    grace_deadline: float | None = None
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    dirty: bool = True
    reported_ready: str | None = None
    """The Ready status this agent last wrote (the node controller may overwrite it)."""
    next_config_retry: float = 0.0
    next_volume_refresh: float = 0.0
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Condition type -> (status, when it last changed)."""

    @property
    def uid(self) -> str:
        return self.pod["metadata"]["uid"]

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    @property
    def folder(self) -> Path:
        return self.state / "pods" / self.uid

    # ------------------------------------------------------------------ start

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        meta, spec = self.pod["metadata"], self.pod.get("spec") or {}
        ns = meta["namespace"]
        hostname = spec.get("hostname") or meta["name"]
        fqdn = f"{hostname}.{spec['subdomain']}.{ns}.svc.{network.CLUSTER_DOMAIN}" if spec.get("subdomain") else hostname
        hosts = f"127.0.0.1 localhost\n{self.ip} {fqdn} {hostname}\n"
        search = [f"{ns}.svc.{network.CLUSTER_DOMAIN}", f"svc.{network.CLUSTER_DOMAIN}", network.CLUSTER_DOMAIN]
        self.netns = network.create_pod_network(self.uid, self.ip, NETNS_ETC, hosts, search)
        if self.link_rate is not None:
            network.set_rate(self.uid, self.link_rate)
        self.pod.setdefault("status", {})["podIP"] = self.ip  # for downward-API fieldRefs
        self.containers = [Container(c) for c in spec.get("containers") or []]
        self.init_containers = [Container(c) for c in spec.get("initContainers") or []]
        self.volumes: dict[str, Path] | None = None
        self._prepare_and_launch()

    def _prepare_and_launch(self) -> None:
        """Mount the volumes (once) and launch every container still waiting. A missing
        ConfigMap, Secret or key leaves the pod waiting with CreateContainerConfigError,
        and ``tick`` tries again, the way the kubelet keeps retrying until the object
        appears (an operator may create a pod a moment before its ConfigMap)."""
        self.next_config_retry = time.monotonic() + CONFIG_RETRY_SECONDS
        if self.volumes is None:
            spec = self.pod.get("spec") or {}
            try:
                self.volumes = {v["name"]: volumes.prepare_volume(self.core, self.pod, v, self.folder, self.state / "nodes" / self.node,
                                                                  self.state / "pvs") for v in spec.get("volumes") or []}
            except volumes.ConfigError as err:
                for c in self.containers:
                    c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(err)
                self.dirty = True
                return
        pending = self._pending_init()
        if pending is not None:
            if pending.proc is None and pending.terminated is None \
                    and pending.waiting_reason in ("ContainerCreating", "CreateContainerConfigError"):
                self._launch(pending)
            for c in self.containers:
                c.waiting_reason = "PodInitializing"
            return
        for c in self.containers:
            if c.proc is None and c.terminated is None \
                    and c.waiting_reason in ("ContainerCreating", "CreateContainerConfigError", "PodInitializing"):
                self._launch(c)

    def _pending_init(self) -> Container | None:
        """The init container to run (or running) now; None once all succeeded."""
        return next((c for c in self.init_containers if not (c.terminated and c.terminated["exitCode"] == 0)), None)

    def _init_failed(self) -> bool:
        """An init container failed and the pod's policy does not retry it."""
        policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
        return policy == "Never" and any(c.terminated and c.terminated["exitCode"] != 0 for c in self.init_containers)

    def _all_containers(self) -> list[Container]:
        return [*self.init_containers, *self.containers]

    def _launch(self, c: Container) -> None:
        spec = c.spec
        base = {
            "PATH": f"{images.bin_dir(spec.get('image', ''), self.venv_bin, self.state)}"
                    ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "HOSTNAME": (self.pod.get("spec") or {}).get("hostname") or self.pod["metadata"]["name"],
            # No kube-proxy here: in-cluster clients talk to the API server on the bridge.
            "KUBERNETES_SERVICE_HOST": GATEWAY, "KUBERNETES_SERVICE_PORT": str(API_PORT),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(API_PORT), "KUBERNETES_PORT": f"tcp://{GATEWAY}:{API_PORT}",
        }
        try:
            env = volumes.container_env(self.core, self.pod, spec, base)
        except volumes.ConfigError as err:
            c.waiting_reason, c.waiting_message = "CreateContainerConfigError", str(err)
            self.dirty = True
            return
        argv = volumes.expand_command(spec, env)
        if not argv:
            c.waiting_reason, c.waiting_message = "CreateContainerError", "no command: images are not run here, the pod must set command"
            self.dirty = True
            return
        mounts = volumes.mounts_for(spec, self.volumes)
        term_path = spec.get("terminationMessagePath") or "/dev/termination-log"
        term_file = self.folder / f"{c.name}.termination-log"
        term_file.write_text("")
        mounts.append({"source": str(term_file), "target": term_path, "readOnly": False})
        c.cgroup = self._cgroup(c)
        launch = {"hostname": (self.pod.get("spec") or {}).get("hostname") or self.pod["metadata"]["name"][:63],
                  "mounts": mounts, "env": env, "argv": argv, "workingDir": spec.get("workingDir"),
                  "readOnlyRoot": bool((spec.get("securityContext") or {}).get("readOnlyRootFilesystem")),
                  "memoryCgroup": c.cgroup is not None}
        spec_file = self.folder / f"{c.name}.json"
        spec_file.write_text(json.dumps(launch))
        logfile = (self.folder / f"{c.name}.log").open("ab")
        inner = ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--uts", "--propagation", "private",
                 sys.executable, INIT, str(spec_file)]
        if c.cgroup is not None:
            # Join the cgroup before `ip netns exec`, which remounts /sys for the netns and
            # hides the cgroup tree; every descendant inherits the membership.
            inner = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(c.cgroup), *inner]
        c.proc = subprocess.Popen(
            inner,
            stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        logfile.close()
        c.started_at, c.terminated, c.ready, c.waiting_reason, c.waiting_message = now_iso(), None, False, None, None
        c.next_probe = time.monotonic() + float((spec.get("readinessProbe") or {}).get("initialDelaySeconds", 0))
        live = spec.get("livenessProbe") or {}
        c.next_liveness = time.monotonic() + float(live.get("initialDelaySeconds", 0)) + float(live.get("periodSeconds", 10))
        c.liveness_failures, c.kill_at = 0, None
        self.dirty = True

    def _cgroup(self, c: Container) -> Path | None:
        try:
            path = CGROUP_ROOT / f"{self.uid}-{c.name}"
            path.mkdir(parents=True, exist_ok=True)
            limit = _quantity_bytes(((c.spec.get("resources") or {}).get("limits") or {}).get("memory"))
            if limit:
                (path / "memory.limit_in_bytes").write_text(str(limit))
            return path
        except OSError:
            return None  # no writable memory cgroup: no limits, no OOM detection

    # ------------------------------------------------------------------ supervise

    def tick(self) -> None:
        """Poll processes, restart per policy, run readiness and liveness probes."""
        policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
        self._tick_init(policy)
        for c in self.containers:
            if c.proc is not None and c.terminated is None:
                code = c.proc.poll()
                if code is not None:
                    self._terminated(c, code)
                    if self.deleting_since is None and (policy == "Always" or (policy == "OnFailure" and c.terminated["exitCode"] != 0)):
                        c.last_terminated, c.terminated = c.terminated, None
                        c.restarts += 1
                        c.proc = None
                        c.waiting_reason = "CrashLoopBackOff"
                        c.next_start = time.monotonic() + min(30.0, 2.0 ** (c.restarts - 1))
                    self.dirty = True
                elif c.spec.get("readinessProbe") and time.monotonic() >= c.next_probe:
                    probe = c.spec["readinessProbe"]
                    c.next_probe = time.monotonic() + float(probe.get("periodSeconds", 10))
                    ok = self._probe(probe)
                    if ok != c.ready:
                        c.ready, self.dirty = ok, True
                elif not c.spec.get("readinessProbe") and not c.ready:
                    c.ready, self.dirty = True, True
                if code is None and self.deleting_since is None:
                    self._liveness(c)
            elif c.proc is None and c.terminated is None and c.waiting_reason == "CrashLoopBackOff" and time.monotonic() >= c.next_start:
                self._launch(c)
        if (self.deleting_since is None and time.monotonic() >= self.next_config_retry
                and any(c.waiting_reason == "CreateContainerConfigError" for c in self.containers)):
            self._prepare_and_launch()
        if self.deleting_since is not None and self.grace_deadline is not None and time.monotonic() > self.grace_deadline:
            self.kill(signal.SIGKILL)
        if self.volumes is not None and self.deleting_since is None and time.monotonic() >= self.next_volume_refresh:
            self.next_volume_refresh = time.monotonic() + VOLUME_REFRESH_SECONDS
            volumes.refresh_config_volumes(self.core, self.pod, self.volumes)

    def _tick_init(self, policy: str) -> None:
        """The running init container: on success the next one (or the containers) start;
        a failure fails the pod under ``restartPolicy: Never`` and is retried with backoff
        otherwise (the kubelet's ``Init:CrashLoopBackOff``)."""
        c = self._pending_init()
        if c is None or self.deleting_since is not None:
            return
        if c.proc is not None and c.terminated is None:
            code = c.proc.poll()
            if code is None:
                return
            self._terminated(c, code)
            self.dirty = True
            if c.terminated["exitCode"] == 0:
                self._prepare_and_launch()
            elif policy != "Never":
                c.last_terminated, c.terminated = c.terminated, None
                c.restarts += 1
                c.proc = None
                c.waiting_reason = "CrashLoopBackOff"
                c.next_start = time.monotonic() + min(30.0, 2.0 ** (c.restarts - 1))
        elif c.proc is None and c.terminated is None and c.waiting_reason == "CrashLoopBackOff" and time.monotonic() >= c.next_start:
            self._launch(c)

    def _liveness(self, c: Container) -> None:
        """As the kubelet does: ``failureThreshold`` failed probes in a row kill the
        container (SIGTERM, then SIGKILL after the probe's or the pod's grace period)."""
        probe = c.spec.get("livenessProbe")
        now = time.monotonic()
        if c.kill_at is not None:
            if now >= c.kill_at:
                self._signal(c, signal.SIGKILL)
                c.kill_at = float("inf")
            return
        if not probe or now < c.next_liveness:
            return
        c.next_liveness = now + float(probe.get("periodSeconds", 10))
        if self._probe(probe):
            c.liveness_failures = 0
            return
        c.liveness_failures += 1
        if c.liveness_failures < int(probe.get("failureThreshold", 3)):
            return
        grace = probe.get("terminationGracePeriodSeconds", (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        print(f"localcluster: {self.pod['metadata']['name']}/{c.name}: liveness probe failed "
              f"{c.liveness_failures} times; killing the container", flush=True)
        self._signal(c, signal.SIGTERM)
        c.kill_at = now + float(grace)

    def _terminated(self, c: Container, code: int) -> None:
        exit_code = 128 - code if code < 0 else code
        oom = False
        if c.cgroup is not None:
            try:
                counters = dict(line.split() for line in (c.cgroup / "memory.oom_control").read_text().splitlines() if line.strip())
                oom = int(counters.get("oom_kill", 0)) > 0
            except (OSError, ValueError):
                oom = False
        message = ""
        term_file = self.folder / f"{c.name}.termination-log"
        if term_file.exists():
            message = term_file.read_text()[:4096]
        reason = "OOMKilled" if oom else ("Completed" if exit_code == 0 else "Error")
        c.terminated = {"exitCode": exit_code, "reason": reason, "message": message or None,
                        "startedAt": c.started_at, "finishedAt": now_iso()}
        c.ready = False
        self._reap_cgroup(c)

    def _probe(self, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = self._port(get["port"])
            try:
                with urllib.request.urlopen(f"http://{self.ip}:{port}{get.get('path', '/')}", timeout=timeout) as resp:
                    return 200 <= resp.status < 400
            except OSError:
                return False
        if "tcpSocket" in probe:
            try:
                with socket.create_connection((self.ip, self._port(probe["tcpSocket"]["port"])), timeout=timeout):
                    return True
            except OSError:
                return False
        if "exec" in probe:
            result = subprocess.run(["ip", "netns", "exec", self.netns, *probe["exec"]["command"]], capture_output=True,
                                    timeout=timeout + 5)
            return result.returncode == 0
        return True

    def _port(self, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for c in self.containers:
            for p in c.spec.get("ports") or []:
                if p.get("name") == port:
                    return int(p["containerPort"])
        raise ValueError(f"unknown named port {port}")

    # ------------------------------------------------------------------ stop

    def begin_delete(self, grace_seconds: int) -> None:
        if self.deleting_since is not None:
            return
        self.deleting_since = time.monotonic()
        self.grace_deadline = time.monotonic() + grace_seconds
        sig = signal.SIGTERM if grace_seconds > 0 else signal.SIGKILL
        log.info("%s deleted: %s to %s (grace %d s)", self.key, sig.name,
                 ", ".join(f"{c.spec['name']} pid {c.proc.pid}" for c in self._all_containers() if c.proc is not None), grace_seconds)
        self.kill(sig)

    def kill(self, sig: int) -> None:
        """SIGTERM reaches each container's first process (like PID 1); SIGKILL, SIGSTOP and
        SIGCONT reach every process of the container (a kill, a freeze and a thaw of it)."""
        for c in self._all_containers():
            self._signal(c, sig)

    def _signal(self, c: Container, sig: int) -> None:
        if c.proc is None or c.proc.poll() is not None:
            return
        pids = {c.proc.pid}
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT):
            pids |= _descendants(c.proc.pid)
            if c.cgroup is not None:
                try:
                    pids |= {int(p) for p in (c.cgroup / "cgroup.procs").read_text().split()}
                except OSError:
                    pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def all_stopped(self) -> bool:
        return all(c.proc is None or c.proc.poll() is not None for c in self._all_containers())

    def _reap_cgroup(self, c: Container) -> None:
        if c.cgroup is None:
            return
        try:
            for pid in (c.cgroup / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)  # orphans of a dead first process
                except ProcessLookupError:
                    pass
        except OSError:
            pass

    def cleanup(self) -> None:
        self.kill(signal.SIGKILL)
        for c in self._all_containers():
            if c.proc is not None:
                try:
                    c.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            if c.cgroup is not None:
                for _ in range(50):
                    try:
                        c.cgroup.rmdir()
                        break
                    except OSError:
                        self._reap_cgroup(c)
                        time.sleep(0.1)
        network.delete_pod_network(self.uid, NETNS_ETC)
        emptydirs = self.folder / "volumes"
        if emptydirs.exists():
            subprocess.run(["rm", "-rf", str(emptydirs)], check=False)

    # ------------------------------------------------------------------ status

    @staticmethod
    def _container_status(c: Container) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": c.name, "image": c.spec.get("image", ""), "imageID": "", "restartCount": c.restarts,
                                 "ready": c.ready, "started": c.terminated is None and c.proc is not None}
        if c.terminated is not None:
            entry["state"] = {"terminated": {k: v for k, v in c.terminated.items() if v is not None}}
        elif c.proc is not None:
            entry["state"] = {"running": {"startedAt": c.started_at}}
        else:
            entry["state"] = {"waiting": {"reason": c.waiting_reason or "ContainerCreating",
                                          **({"message": c.waiting_message} if c.waiting_message else {})}}
        if c.last_terminated:
            entry["lastState"] = {"terminated": {k: v for k, v in c.last_terminated.items() if v is not None}}
        return entry

    def status(self) -> dict[str, Any]:
        policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
        statuses, phase = [self._container_status(c) for c in self.containers], "Running"
        if self.containers and all(c.terminated is not None for c in self.containers):
            if policy == "Never" or (policy == "OnFailure" and all(c.terminated["exitCode"] == 0 for c in self.containers)):
                phase = "Succeeded" if all(c.terminated["exitCode"] == 0 for c in self.containers) else "Failed"
        initialized = self._pending_init() is None
        if any(c.proc is None and c.terminated is None and c.waiting_reason != "CrashLoopBackOff" for c in self.containers) \
                or not initialized:
            phase = "Pending"
        if self._init_failed():
            phase = "Failed"
        ready = bool(self.containers) and all(c.ready for c in self.containers) and phase == "Running"
        stamp = now_iso()
        conditions = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True" if initialized else "False"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ]
        for cond in conditions:
            # A condition's transition time moves only when its status flips, as the
            # kubelet reports it (the operator reads when a pod became (un)ready).
            previous = self.transitions.get(cond["type"])
            if previous is None or previous[0] != cond["status"]:
                self.transitions[cond["type"]] = (cond["status"], stamp)
            cond["lastTransitionTime"] = self.transitions[cond["type"]][1]
        return {"phase": phase, "podIP": self.ip, "podIPs": [{"ip": self.ip}], "hostIP": GATEWAY, "hostIPs": [{"ip": GATEWAY}],
                "startTime": self.pod.get("status", {}).get("startTime") or stamp, "conditions": conditions,
                "containerStatuses": statuses,
                **({"initContainerStatuses": [self._container_status(c) for c in self.init_containers]} if self.init_containers else {})}

    def report(self) -> None:
        """Write the pod's status if something changed."""
        if not self.dirty:
            return
        body = {"status": self.status()}
        try:
            self.core.patch_namespaced_pod_status(self.pod["metadata"]["name"], self.pod["metadata"]["namespace"], body)
            self.dirty = False
            self.reported_ready = ready_of(body)
        except ApiException as err:
            if err.status == 404:
                self.dirty = False
            else:
                log.warning("status of %s: %s", self.key, err.reason)
        except Exception as err:  # noqa: BLE001 - the API server may be restarting
            log.warning("status of %s: %s", self.key, err)


def ready_of(pod: dict[str, Any]) -> str | None:
    """The status of a pod's Ready condition, if it has one."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status")
    return None


def _descendants(pid: int) -> set[int]:
    """Every process under ``pid`` (for a container without a cgroup of its own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(stat.parent.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out
