"""Cluster DNS for pods: a small server on the bridge address (what kube-dns/CoreDNS
do in a real cluster).

Answers A records for:
- ``<service>.<namespace>.svc.cluster.local``: the ready endpoint addresses. There is no
  kube-proxy here, so ClusterIP services resolve to their endpoints as headless ones do;
- ``<hostname>.<subdomain>.<namespace>.svc.cluster.local``: a pod with that hostname and
  subdomain (the per-pod names of a headless Service);
- ``kubernetes.default.svc.cluster.local``: the API server on the bridge.
Anything else is NXDOMAIN: there is no upstream.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .network import CLUSTER_DOMAIN, GATEWAY

log = logging.getLogger("localcluster.dns")
TTL = 1


class ClusterResolver(BaseResolver):
    def __init__(self, api: client.ApiClient):
        self.core = client.CoreV1Api(api)
        self.discovery = client.DiscoveryV1Api(api)
        self._cache: dict[str, tuple[float, list[str]]] = {}
        self._lock = threading.Lock()

    def lookup(self, name: str) -> list[str] | None:
        """Addresses for a fully qualified name, or None for NXDOMAIN."""
        name = name.rstrip(".").lower()
        suffix = f".svc.{CLUSTER_DOMAIN}"
        if not name.endswith(suffix):
            return None
        with self._lock:
            cached = self._cache.get(name)
            if cached and time.monotonic() - cached[0] < TTL:
                return cached[1]
        parts = name[: -len(suffix)].split(".")
        try:
            if parts == ["kubernetes", "default"]:
                answer = [GATEWAY]
            elif len(parts) == 2:
                answer = self._service(parts[1], parts[0])
            elif len(parts) == 3:
                answer = self._pod(parts[2], parts[1], parts[0])
            else:
                answer = None
        except ApiException as err:
            log.warning("lookup %s: %s", name, err.reason)
            answer = None
        with self._lock:
            self._cache[name] = (time.monotonic(), answer)
        return answer

    def _service(self, namespace: str, service: str) -> list[str] | None:
        try:
            self.core.read_namespaced_service(service, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        slices = self.discovery.list_namespaced_endpoint_slice(namespace, label_selector=f"kubernetes.io/service-name={service}")
        out: list[str] = []
        for s in slices.items:
            for endpoint in s.endpoints or []:
                ready = endpoint.conditions.ready if endpoint.conditions else True
                if ready is not False:
                    out += endpoint.addresses
        return sorted(set(out))

    def _pod(self, namespace: str, subdomain: str, hostname: str) -> list[str] | None:
        pods = self.core.list_namespaced_pod(namespace)
        for pod in pods.items:
            # An ended pod is in no EndpointSlice, so CoreDNS has no record of it: a failed
            # pod kept for its log shares its host name with the pod that replaced it.
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            if pod.spec.hostname == hostname and pod.spec.subdomain == subdomain and pod.status.pod_ip:
                return [pod.status.pod_ip]
        return None

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        qname = str(request.q.qname)
        answer = self.lookup(qname)
        if answer is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype in (QTYPE.A, QTYPE.ANY):
            for address in answer:
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=TTL))
        return reply


def serve(api: client.ApiClient, address: str = GATEWAY, port: int = 53) -> list[DNSServer]:
    resolver = ClusterResolver(api)
    quiet = DNSLogger(log="-request,-reply,-truncated,-data,-recv,-send", prefix=False)
    servers = [DNSServer(resolver, address=address, port=port, tcp=tcp, logger=quiet) for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    return servers
