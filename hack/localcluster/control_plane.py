"""Start and stop the real control plane: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler, each a local process with its log under ``<state>/logs``."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import pki
from .network import GATEWAY, POD_CIDR, SERVICE_CIDR

API_PORT = 443
"""443, as the `kubernetes` Service exposes it: in-cluster clients (kopf included) dial
https://kubernetes.default.svc, and there is no kube-proxy to translate 443 to 6443."""
ETCD_CLIENT_PORT = 23790
ETCD_PEER_PORT = 23800
NODE_MONITOR_GRACE_SECONDS = 16
"""How long the node-lifecycle controller waits for a silent node before NotReady/Unknown.
The upstream default is 50 s; tests use a shorter one so that node failures resolve fast."""


@dataclass
class Layout:
    state: Path
    bin: Path

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    def kubeconfig(self, who: str = "admin") -> Path:
        return self.state / f"{who}.kubeconfig"


def write_kubeconfig(layout: Layout, who: str, server: str) -> Path:
    files = layout.pki
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "localcluster",
        "clusters": [{"name": "localcluster", "cluster": {"server": server, "certificate-authority": str(files / "ca.crt")}}],
        "users": [{"name": who, "user": {"client-certificate": str(files / f"{who}.crt"), "client-key": str(files / f"{who}.key")}}],
        "contexts": [{"name": "localcluster", "context": {"cluster": "localcluster", "user": who, "namespace": "default"}}],
    }
    path = layout.kubeconfig(who)
    path.write_text(yaml.safe_dump(config))
    return path


def _start(layout: Layout, name: str, cmd: list[str]) -> int:
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    log = (layout.logs / f"{name}.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (layout.pids / f"{name}.pid").write_text(str(proc.pid))
    return proc.pid


def stop(layout: Layout, name: str, timeout: float = 15.0) -> None:
    pidfile = layout.pids / f"{name}.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pidfile.unlink(missing_ok=True)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        _reap(pid)
        time.sleep(0.1)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(pid)
    pidfile.unlink(missing_ok=True)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def running(layout: Layout, name: str) -> bool:
    pidfile = layout.pids / f"{name}.pid"
    if not pidfile.exists():
        return False
    try:
        os.kill(int(pidfile.read_text()), 0)
        return True
    except ProcessLookupError:
        return False


def start_etcd(layout: Layout) -> None:
    data = layout.state / "etcd"
    _start(layout, "etcd", [
        str(layout.bin / "etcd"), "--name=localcluster", f"--data-dir={data}",
        f"--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}", f"--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}",
        f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}", f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
        f"--initial-cluster=localcluster=http://127.0.0.1:{ETCD_PEER_PORT}", "--log-level=warn",
        "--quota-backend-bytes=4294967296", "--unsafe-no-fsync",  # a test bed: speed over durability
    ])


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        # The controllers' own service accounts: not what tests look at, and chatty.
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
        # Every write a workload's service account makes (the operator's, in the tests:
        # who wrote, from which replica (user agent), when, and the answer).
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"],
         "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        {"level": "None"},
    ],
}


def audit_log(layout: Layout) -> Path:
    """JSON lines, one per write by a non-system service account (``AUDIT_POLICY``)."""
    return layout.logs / "audit.log"


def start_apiserver(layout: Layout) -> None:
    f = layout.pki
    policy = layout.state / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    _start(layout, "kube-apiserver", [
        str(layout.bin / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}",
        "--bind-address=0.0.0.0", f"--secure-port={API_PORT}", f"--advertise-address={GATEWAY}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--client-ca-file={f / 'ca.crt'}", f"--tls-cert-file={f / 'apiserver.crt'}", f"--tls-private-key-file={f / 'apiserver.key'}",
        f"--service-account-key-file={f / 'sa.pub'}", f"--service-account-signing-key-file={f / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=RBAC", "--allow-privileged=true",
        "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,DefaultStorageClass,ResourceQuota,Priority",
        f"--audit-policy-file={policy}", f"--audit-log-path={audit_log(layout)}", "--audit-log-format=json",
        "--audit-log-maxsize=200", "--audit-log-maxbackup=1", "--audit-log-mode=blocking",
        "--profiling=false", "--v=1",
    ])


def start_controller_manager(layout: Layout) -> None:
    f = layout.pki
    kc = write_kubeconfig(layout, "controller-manager", f"https://127.0.0.1:{API_PORT}")
    _start(layout, "kube-controller-manager", [
        str(layout.bin / "kube-controller-manager"), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        f"--service-account-private-key-file={f / 'sa.key'}", f"--root-ca-file={f / 'ca.crt'}",
        "--use-service-account-credentials=true", "--leader-elect=false",
        f"--cluster-cidr={POD_CIDR}", "--allocate-node-cidrs=false",
        "--node-monitor-period=2s", f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
        "--controllers=*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller,-node-ipam-controller",
        "--bind-address=127.0.0.1", "--secure-port=10257", "--v=1",
    ])


def start_scheduler(layout: Layout) -> None:
    kc = write_kubeconfig(layout, "scheduler", f"https://127.0.0.1:{API_PORT}")
    _start(layout, "kube-scheduler", [
        str(layout.bin / "kube-scheduler"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}", "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10259", "--v=1",
    ])


def wait_ready(layout: Layout, timeout: float = 120.0) -> None:
    """Until /readyz answers ok (admin client cert)."""
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{API_PORT}/readyz", context=ctx, timeout=3) as resp:
                if resp.status == 200:
                    return
        except OSError as err:
            last = str(err)
        if not running(layout, "kube-apiserver"):
            raise RuntimeError(f"kube-apiserver exited; see {layout.logs / 'kube-apiserver.log'}")
        time.sleep(0.5)
    raise TimeoutError(f"kube-apiserver not ready after {timeout:.0f}s ({last}); see {layout.logs / 'kube-apiserver.log'}")


def bootstrap(layout: Layout) -> None:
    """PKI and the admin/agent kubeconfigs (idempotent)."""
    pki.ensure(layout.pki, server_ips=["127.0.0.1", GATEWAY, "10.96.0.1"],
               server_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                             "kubernetes.default.svc.cluster.local"])
    write_kubeconfig(layout, "admin", f"https://127.0.0.1:{API_PORT}")
    write_kubeconfig(layout, "agent", f"https://127.0.0.1:{API_PORT}")


def start(layout: Layout) -> None:
    bootstrap(layout)
    start_etcd(layout)
    start_apiserver(layout)
    wait_ready(layout)
    start_controller_manager(layout)
    start_scheduler(layout)


def restart_apiserver(layout: Layout) -> None:
    """Fault injection: stop the API server and start it again with the same flags."""
    stop(layout, "kube-apiserver")
    start_apiserver(layout)
    wait_ready(layout)


def stop_all(layout: Layout) -> None:
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        stop(layout, name)
