"""The process node agent: it plays the kubelet of N nodes.

- registers the Nodes (capacity, labels, a fake ``nvidia.com/gpu`` where asked) and keeps
  their Leases and Ready condition fresh, so the real node-lifecycle controller sees
  them as healthy;
- watches the pods bound to its nodes, runs them (pods.py), reports their status, and
  deletes them once their processes are gone after a graceful delete;
- injects faults: kill a pod's processes, fail a node (heartbeats stop, processes die),
  cut a node off the network (heartbeats stop, processes live, links down).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from . import network
from .network import GATEWAY
from .pods import PodRunner, ready_of

log = logging.getLogger("localcluster.agent")
LEASE_SECONDS = 40
HEARTBEAT_SECONDS = 2.0
STATUS_SECONDS = 10.0


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iso_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeState:
    name: str
    labels: dict[str, str]
    capacity: dict[str, str]
    healthy: bool = True
    """False after a failure or a partition: no heartbeats, no status reports."""
    partitioned: bool = False
    link_rate: str | None = None
    """A degraded link (``slow_node``): every pod's traffic on the node limited to it."""
    transition: str = ""
    """When this agent last started reporting Ready (registration, or a heal)."""


@dataclass
class Agent:
    api: client.ApiClient
    state: Path
    venv_bin: str
    nodes: dict[str, NodeState] = field(default_factory=dict)
    pods: dict[str, PodRunner] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.RLock = field(default_factory=threading.RLock)
    links: threading.Lock = field(default_factory=threading.Lock)
    """Held for each write a node makes (a heartbeat, a pod's status) and to take a node
    down: a node's last write lands before ``fail_node`` or ``partition_node`` returns,
    never after. A pod's readiness probe that a cut link makes fail while the agent is
    already past its health check must not reach the API server as "not ready": a
    partitioned kubelet writes nothing."""

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.ipam = network.IPAM()

    # ------------------------------------------------------------------ nodes

    def add_node(self, name: str, cpu: str = "8", memory: str = "32Gi", gpus: int = 0, labels: dict[str, str] | None = None) -> None:
        capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi"}
        if gpus:
            capacity["nvidia.com/gpu"] = str(gpus)
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "node.localcluster.io/simulated": "true", **(labels or {})}
        self.nodes[name] = NodeState(name, node_labels, capacity, transition=iso_now())
        self._register(self.nodes[name])

    def _register(self, node: NodeState) -> None:
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name, "labels": node.labels},
            "spec": {},
            "status": {"capacity": node.capacity, "allocatable": node.capacity},
        }
        try:
            self.core.create_node(body)
        except ApiException as err:
            if err.status != 409:
                raise
            self.core.patch_node(node.name, {"metadata": {"labels": node.labels}})
        self._report_node(node)
        self._renew_lease(node)

    def _report_node(self, node: NodeState) -> None:
        stamp = iso_now()
        conditions = [
            {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": "ok", "lastHeartbeatTime": stamp}
            for t, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"), ("PIDPressure", "SufficientPID"))
        ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "localcluster agent is posting ready status",
              "lastHeartbeatTime": stamp, "lastTransitionTime": node.transition}]
        status = {
            "capacity": node.capacity, "allocatable": node.capacity, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": GATEWAY}, {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "containerRuntimeVersion": "localcluster://0.1",
                         "operatingSystem": "linux", "architecture": "amd64", "osImage": "localcluster", "kernelVersion": "",
                         "machineID": node.name, "systemUUID": node.name, "bootID": node.name},
        }
        self.core.patch_node_status(node.name, {"status": status})

    def _renew_lease(self, node: NodeState) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node.name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_now()}}
        try:
            self.coord.patch_namespaced_lease(node.name, "kube-node-lease", {"spec": body["spec"]})
        except ApiException as err:
            if err.status != 404:
                raise
            self.coord.create_namespaced_lease("kube-node-lease", body)

    def heartbeat_loop(self) -> None:
        last_status = 0.0
        while not self.stop.wait(HEARTBEAT_SECONDS):
            report = time.monotonic() - last_status > STATUS_SECONDS
            for node in list(self.nodes.values()):
                try:
                    with self.links:
                        if not node.healthy:
                            continue
                        self._renew_lease(node)
                        if report:
                            self._report_node(node)
                except Exception as err:  # noqa: BLE001 - keep beating through API restarts
                    log.warning("heartbeat of %s: %s", node.name, err)
            if report:
                last_status = time.monotonic()

    # ------------------------------------------------------------------ pods

    def watch_loop(self) -> None:
        """Watch every pod; act on those bound to our nodes. Re-lists after errors
        (including 410 Gone and an API server restart)."""
        while not self.stop.is_set():
            try:
                listing = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
                seen = set()
                for item in listing.items:
                    raw = self.api.sanitize_for_serialization(item)
                    seen.add(raw["metadata"]["uid"])
                    self._on_pod(raw, deleted=False)
                self._forget_missing(seen)
                stream = watch.Watch()
                for event in stream.stream(self.core.list_pod_for_all_namespaces, field_selector="spec.nodeName!=",
                                           resource_version=listing.metadata.resource_version, timeout_seconds=120,
                                           _request_timeout=150):
                    if self.stop.is_set():
                        stream.stop()
                        break
                    raw = self.api.sanitize_for_serialization(event["object"])
                    self._on_pod(raw, deleted=event["type"] == "DELETED")
            except Exception as err:  # noqa: BLE001
                if not self.stop.is_set():
                    log.info("pod watch restarting: %s", err)
                    time.sleep(1)

    def _forget_missing(self, seen: set[str]) -> None:
        with self.lock:
            for uid in [u for u in self.pods if u not in seen]:
                runner = self.pods.pop(uid)
                threading.Thread(target=runner.cleanup, daemon=True).start()

    def _on_pod(self, pod: dict[str, Any], deleted: bool) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self.nodes:
            return
        uid = pod["metadata"]["uid"]
        with self.lock:
            runner = self.pods.get(uid)
            if deleted:
                if runner is not None:
                    self.pods.pop(uid)
                    self.ipam.release(runner.ip)
                    threading.Thread(target=runner.cleanup, daemon=True).start()
                return
            if not self.nodes[node].healthy:
                return  # a dead or partitioned node neither starts pods nor reports
            if runner is None:
                if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    self._finish_delete(pod)
                    return
                runner = PodRunner(self.core, pod, node, self.state, self.ipam.allocate(), self.venv_bin,
                                   link_rate=self.nodes[node].link_rate)
                self.pods[uid] = runner
                threading.Thread(target=self._start, args=(runner,), daemon=True).start()
                return
            runner.pod["metadata"] = pod["metadata"]
            if runner.reported_ready is not None and ready_of(pod) != runner.reported_ready:
                # Someone else rewrote Ready: the node lifecycle controller marks every pod
                # of a node NotReady when its heartbeats stop (an API server restart does
                # that to all nodes). The kubelet's status manager writes its own view back.
                runner.dirty = True
            if pod["metadata"].get("deletionTimestamp"):
                runner.begin_delete(int(pod["metadata"].get("deletionGracePeriodSeconds") or 0))

    def _start(self, runner: PodRunner) -> None:
        try:
            runner.start()
        except Exception as err:  # report, do not crash the agent
            log.exception("starting %s failed", runner.key)
            for c in runner.containers:
                c.waiting_reason, c.waiting_message = "CreateContainerError", str(err)
        runner.dirty = True

    def _finish_delete(self, pod: dict[str, Any]) -> None:
        """The kubelet's last word on a graceful delete: remove the object for good."""
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0,
                                            body=client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": meta["uid"]}))
        except ApiException as err:
            if err.status not in (404, 409):
                log.warning("final delete of %s/%s: %s", meta["namespace"], meta["name"], err.reason)

    def supervise_loop(self) -> None:
        while not self.stop.wait(0.25):
            with self.lock:
                runners = list(self.pods.values())
            for runner in runners:
                node = self.nodes.get(runner.node)
                if node is None or not node.healthy:
                    continue
                try:
                    if runner.netns is None:
                        continue  # still starting
                    runner.tick()
                    with self.links:
                        if not node.healthy:
                            continue  # cut off or dead while this tick ran: its probes' verdict goes nowhere
                        runner.report()
                        if runner.deleting_since is not None and runner.all_stopped():
                            self._finish_delete(runner.pod)
                except Exception as err:  # noqa: BLE001
                    log.warning("supervising %s: %s", runner.key, err)

    # ------------------------------------------------------------------ faults

    def kill_pod(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> bool:
        with self.lock:
            for runner in self.pods.values():
                if runner.pod["metadata"]["namespace"] == namespace and runner.pod["metadata"]["name"] == name:
                    runner.kill(sig)
                    return True
        return False

    def fail_node(self, name: str) -> int:
        """Heartbeats stop and every process on the node dies, as in a power loss."""
        node = self.nodes[name]
        with self.links:
            node.healthy = False
        killed = 0
        with self.lock:
            for runner in self.pods.values():
                if runner.node == name:
                    runner.kill(signal.SIGKILL)
                    killed += 1
        return killed

    def partition_node(self, name: str) -> int:
        """Heartbeats stop and the node's pods lose their links; processes keep running."""
        node = self.nodes[name]
        with self.links:
            node.healthy, node.partitioned = False, True
        count = 0
        with self.lock:
            for runner in self.pods.values():
                if runner.node == name:
                    network.set_link(runner.uid, up=False)
                    count += 1
        return count

    def slow_node(self, name: str, rate: str | None) -> int:
        """The node's link degrades to ``rate`` (tc's words, ``8mbit``; None: healthy again)
        for its pods and every pod it starts later; the node stays Ready."""
        node = self.nodes[name]
        node.link_rate = rate
        count = 0
        with self.lock:
            for runner in self.pods.values():
                if runner.node == name and runner.netns is not None:
                    runner.link_rate = rate
                    network.set_rate(runner.uid, rate)
                    count += 1
        return count

    def heal_node(self, name: str) -> None:
        node = self.nodes[name]
        with self.lock:
            for runner in self.pods.values():
                if runner.node == name and node.partitioned:
                    network.set_link(runner.uid, up=True)
        node.healthy, node.partitioned = True, False
        node.transition = iso_now()
        with self.lock:
            for runner in self.pods.values():
                if runner.node == name:
                    runner.dirty = True  # a kubelet back on line reports every pod again
        try:
            self.core.read_node(name)
        except ApiException as err:
            if err.status != 404:
                raise
            self._register(node)  # its Node object was deleted: register again, as a restarted kubelet does
            return
        self._report_node(node)  # Ready again now, with a fresh transition time
        self._renew_lease(node)

    def shutdown(self) -> None:
        self.stop.set()
        with self.lock:
            runners = list(self.pods.values())
            self.pods.clear()
        for runner in runners:
            runner.cleanup()
