"""The leader-election Lease (``coordination.k8s.io/v1``), read and written with
optimistic concurrency: a replace carries the resourceVersion it read, so two replicas
racing for an expired Lease cannot both win (the loser gets 409)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .client import NETWORK_ERRORS, K8s, _classify


class LeaseConflict(Exception):
    """Another replica wrote the Lease first (create: it exists; replace: 409)."""


def micro_time(value: datetime) -> str:
    """The MicroTime wire format of Lease times."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    """``holderIdentity``; "" when released."""
    renew_time: str | None
    duration_seconds: int
    transitions: int = 0
    acquire_time: str | None = None
    resource_version: str | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            renew_time=spec.get("renewTime"),
            duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            acquire_time=spec.get("acquireTime"),
            resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
        )

    def to_object(self, namespace: str, name: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration_seconds,
                     "acquireTime": self.acquire_time, "renewTime": self.renew_time, "leaseTransitions": self.transitions},
        }


class LeaseClient:
    def __init__(self, k8s: K8s, namespace: str, name: str):
        self.api = client.CoordinationV1Api(k8s.api)
        self.timeout = k8s.timeout
        self.namespace = namespace
        self.name = name

    def get(self) -> LeaseRecord | None:
        try:
            response = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.timeout, _preload_content=False)
            return LeaseRecord.from_object(json.loads(response.data))
        except ApiException as err:
            if err.status == 404:
                return None
            raise _classify(err, f"read Lease {self.namespace}/{self.name}") from err
        except NETWORK_ERRORS as err:
            raise _classify(err, f"read Lease {self.namespace}/{self.name}") from err

    def create(self, record: LeaseRecord) -> LeaseRecord:
        return self._write(lambda body: self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self.timeout,
                                                                          _preload_content=False), record, "create")

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        return self._write(lambda body: self.api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self.timeout,
                                                                           _preload_content=False), record, "replace")

    def _write(self, call, record: LeaseRecord, verb: str) -> LeaseRecord:
        try:
            response = call(record.to_object(self.namespace, self.name))
            return LeaseRecord.from_object(json.loads(response.data))
        except ApiException as err:
            if err.status == 409:
                raise LeaseConflict(f"{verb} Lease {self.namespace}/{self.name}: another replica wrote it first") from err
            raise _classify(err, f"{verb} Lease {self.namespace}/{self.name}") from err
        except NETWORK_ERRORS as err:
            raise _classify(err, f"{verb} Lease {self.namespace}/{self.name}") from err
