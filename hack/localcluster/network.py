"""Pod networking: a Linux bridge on the host and one network namespace per pod,
joined by a veth pair. Pods and the host share one L2 segment, so every pod reaches
every other pod and the host (API server, DNS) without NAT or kube-proxy."""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess
import threading
from pathlib import Path

BRIDGE = "lcbr0"
POD_CIDR = "10.244.0.0/16"
GATEWAY = "10.244.0.1"
"""The host's address on the bridge: API server, DNS and probes are reached here."""
SERVICE_CIDR = "10.96.0.0/16"
NETNS_PREFIX = "lc-"
CLUSTER_DOMAIN = "cluster.local"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def ensure_bridge() -> None:
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    prefix = POD_CIDR.split("/")[1]
    if f"{GATEWAY}/{prefix}" not in _ip("addr", "show", BRIDGE).stdout:
        _ip("addr", "add", f"{GATEWAY}/{prefix}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def remove_bridge() -> None:
    _ip("link", "del", BRIDGE, check=False)


def netns_name(pod_uid: str) -> str:
    return NETNS_PREFIX + pod_uid.replace("-", "")[:12]


def _veth_names(pod_uid: str) -> tuple[str, str]:
    digest = hashlib.sha1(pod_uid.encode()).hexdigest()[:8]
    return f"lch{digest}", f"lcp{digest}"


class IPAM:
    """Hands out pod addresses from the pod CIDR (the host keeps .0.1)."""

    def __init__(self) -> None:
        net = ipaddress.ip_network(POD_CIDR)
        self._free = (str(h) for h in net.hosts() if str(h) != GATEWAY and not str(h).endswith(".0.0"))
        self._released: list[str] = []
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            return self._released.pop(0) if self._released else next(self._free)

    def release(self, ip: str) -> None:
        with self._lock:
            self._released.append(ip)


def create_pod_network(pod_uid: str, ip: str, etc_dir: Path, hosts: str, search: list[str]) -> str:
    """Network namespace + veth + address + route, and the resolv.conf/hosts that
    ``ip netns exec`` bind-mounts for processes started in it."""
    ns = netns_name(pod_uid)
    host_if, pod_if = _veth_names(pod_uid)
    _ip("netns", "add", ns)
    _ip("link", "add", host_if, "type", "veth", "peer", "name", pod_if)
    _ip("link", "set", host_if, "master", BRIDGE)
    _ip("link", "set", host_if, "up")
    _ip("link", "set", pod_if, "netns", ns)
    prefix = POD_CIDR.split("/")[1]
    _ip("-n", ns, "addr", "add", f"{ip}/{prefix}", "dev", pod_if)
    _ip("-n", ns, "link", "set", pod_if, "name", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", ns, "route", "add", "default", "via", GATEWAY)
    folder = etc_dir / ns
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "resolv.conf").write_text(f"nameserver {GATEWAY}\nsearch {' '.join(search)}\noptions ndots:5\n")
    (folder / "hosts").write_text(hosts)
    return ns


def set_link(pod_uid: str, up: bool) -> None:
    """Cut a pod off the network (or reconnect it) by switching its host-side veth."""
    host_if, _ = _veth_names(pod_uid)
    _ip("link", "set", host_if, "up" if up else "down", check=False)


def set_rate(pod_uid: str, rate: str | None) -> None:
    """Limit a pod's link to ``rate`` (tc's words: ``8mbit``) in both directions, as a
    degraded NIC or port would, or lift the limit (None): a token bucket on each end of its
    veth (the host's end shapes what reaches the pod, the pod's end what it sends)."""
    host_if, _ = _veth_names(pod_uid)
    ns = netns_name(pod_uid)
    for prefix in ([], ["ip", "netns", "exec", ns]):
        dev = host_if if not prefix else "eth0"
        if rate is None:
            subprocess.run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True, check=False)
        else:
            subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kbit",
                            "latency", "400ms"], capture_output=True, check=True)


def delete_pod_network(pod_uid: str, etc_dir: Path) -> None:
    ns = netns_name(pod_uid)
    host_if, _ = _veth_names(pod_uid)
    _ip("link", "del", host_if, check=False)
    _ip("netns", "del", ns, check=False)
    folder = etc_dir / ns
    for child in folder.glob("*"):
        child.unlink(missing_ok=True)
    if folder.exists():
        folder.rmdir()


def sweep(etc_dir: Path) -> None:
    """Remove every namespace a previous bed left behind."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(NETNS_PREFIX):
            _ip("netns", "del", name, check=False)
            folder = etc_dir / name
            if folder.exists():
                for child in folder.glob("*"):
                    child.unlink(missing_ok=True)
                folder.rmdir()
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith("lch"):
            _ip("link", "del", name, check=False)
