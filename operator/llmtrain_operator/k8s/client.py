"""Kubernetes I/O: the few calls the operator makes, with their errors given a meaning.

| response                         | meaning                                        |
|----------------------------------|------------------------------------------------|
| 409 on create                    | it exists already (idempotent)                 |
| 404 on delete                    | it is gone already (idempotent)                |
| 404 on a read, no Status naming the object | the API (a CRD) is not served  |
| 404 on a status patch            | the job is gone: nothing to record             |
| 409 on a status patch            | the pass planned from an older status (its     |
|                                  | resourceVersion precondition failed): retry once the watch caught up |
| 410, 429, 5xx, timeouts, resets  | transient: retry the pass after a delay        |
| 400, 403, 422                    | permanent for this object: reported, not retried in a tight loop |
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, UTC
from typing import Any
from collections.abc import Callable, Iterator

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from ..api.job import EVENT_SOURCE, GROUP, PLURAL, REPORTING_COMPONENT, VERSION
from .event_series import EventSeries

log = logging.getLogger("llmtrain.k8s")

TIMEOUT = (5, 20)
"""(connect, read) seconds for every call: a hung API server must not hang a pass."""


CONFLICT_RETRY_SECONDS = 1.0
"""A stale pass is retried as soon as the watch is likely to have delivered the newer
object (usually milliseconds)."""


class TransientApiError(Exception):
    """Retry later (the pass is repeated after ``delay`` seconds)."""

    def __init__(self, message: str, delay: float = 5.0):
        super().__init__(message)
        self.delay = delay


class PermanentApiError(Exception):
    """The API refused the request for a reason a retry cannot fix by itself."""

    def __init__(self, message: str, status: int | None = None, server_message: str = ""):
        super().__init__(message)
        self.status = status
        self.server_message = server_message
        """The API server's own words (the Status object's ``message``): what a quota, an
        admission webhook or Pod Security said."""


def _server_message(err: ApiException) -> str:
    try:
        body = json.loads(err.body or "")
        message = body.get("message") if isinstance(body, dict) else None
    except (ValueError, TypeError):
        message = None
    return str(message or err.reason or f"HTTP {err.status}")[:1000]


def _classify(err: Exception, what: str) -> Exception:
    if isinstance(err, ApiException):
        if err.status in (410, 429) or (err.status or 0) >= 500 or err.status == 409:
            return TransientApiError(f"{what}: HTTP {err.status} {err.reason}", delay=CONFLICT_RETRY_SECONDS if err.status == 409 else 5.0)
        return PermanentApiError(f"{what}: HTTP {err.status} {err.reason}: {(err.body or '')[:500]}", err.status, _server_message(err))
    return TransientApiError(f"{what}: {type(err).__name__}: {err}")


NETWORK_ERRORS = (urllib3.exceptions.HTTPError, OSError, TimeoutError)

CUSTOM_PLURALS = {"PodGroup": "podgroups", "Workload": "workloads"}
"""Kinds the operator creates outside the core API, by their resource name."""


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def _names_the_object(err: ApiException, name: str) -> bool:
    """A 404 whose Status names the object: the API exists and the object does not."""
    try:
        body = json.loads(err.body or "")
    except (ValueError, TypeError):
        return False
    details = body.get("details") if isinstance(body, dict) else None
    return isinstance(details, dict) and details.get("name") == name


def _release(response: Any) -> None:
    """Hand a response's connection back to the pool. The writes ask for the raw response
    (``_preload_content=False``: nothing to turn into model objects), and urllib3 keeps
    such a connection out of its pool until the body is read: without this every write
    opened a new TLS connection to the API server."""
    drain = getattr(response, "drain_conn", None)
    if drain is not None:
        drain()
        response.release_conn()


class K8s:
    def __init__(self, api_client: client.ApiClient, timeout: tuple[float, float] = TIMEOUT):
        self.api = api_client
        self.timeout = timeout
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.event_series = EventSeries()

    @classmethod
    def from_environment(cls, user_agent: str | None = None, connections: int | None = None) -> K8s:
        """In-cluster credentials if present, else the kubeconfig (``$KUBECONFIG``).
        ``user_agent`` names this replica in the API server's audit log. ``connections``:
        the kept-alive connections to the API server, one per thread that calls it (the
        library's default, five per core, makes every call beyond it open and close a TLS
        connection, which at hundreds of jobs cost both sides most of their CPU)."""
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            # Read $KUBECONFIG now: the client library reads it once, at import time.
            path = (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0]
            config.load_kube_config(config_file=os.path.expanduser(path), client_configuration=cfg)
        if connections:
            cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, connections)
        api = client.ApiClient(cfg)
        if user_agent:
            api.user_agent = user_agent
        return cls(api)

    @classmethod
    def for_url(cls, url: str, timeout: tuple[float, float] = TIMEOUT) -> K8s:
        """An unauthenticated client for a URL (API-contract tests against kmock)."""
        cfg = client.Configuration()
        cfg.host = url
        cfg.retries = 0
        return cls(client.ApiClient(cfg), timeout)

    # ------------------------------------------------------------------ writes

    def _send(self, request: Callable[[], Any], what: str, tolerated: int | None = None) -> bool:
        """One request, its errors given their meaning (see the table above). False when
        the answer is ``tolerated``: 409 on a create (it exists), 404 on a delete or a
        status patch (it is gone)."""
        try:
            _release(request())
            return True
        except ApiException as err:
            if tolerated is not None and err.status == tolerated:
                return False
            raise _classify(err, what) from err
        except NETWORK_ERRORS as err:
            raise _classify(err, what) from err

    def create(self, manifest: dict[str, Any]) -> bool:
        """Create an object; False if it already existed."""
        kind, meta = manifest["kind"], manifest["metadata"]
        ns = meta.get("namespace", "default")
        calls = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ConfigMap": self.core.create_namespaced_config_map,
            "NetworkPolicy": self.networking.create_namespaced_network_policy,
            # The job's token: created only, never read (a 409 is taken as this job's).
            "Secret": self.core.create_namespaced_secret,
        }
        # Strict: a field the server does not know (a misspelt `volumeMount:` a job's
        # podTemplate passed through) refuses the create, naming the field, where the
        # default would drop it in silence; the refusal reaches the ReplicaFailure condition.
        if kind in calls:
            call = lambda: calls[kind](ns, manifest, field_validation="Strict", _request_timeout=self.timeout,  # noqa: E731
                                       _preload_content=False)
        else:
            group, version = _group_version(manifest["apiVersion"])
            call = lambda: self.custom.create_namespaced_custom_object(  # noqa: E731
                group, version, ns, CUSTOM_PLURALS[kind], manifest, field_validation="Strict", _request_timeout=self.timeout,
                _preload_content=False)
        return self._send(call, f"create {kind} {ns}/{meta['name']}", tolerated=409)

    def owner_uids(self, kind: str, namespace: str, name: str) -> list[str] | None:
        """The uids in an existing Pod's, Service's, ConfigMap's or NetworkPolicy's
        ownerReferences; None when it is gone, being deleted (a namesake's leftover on its
        way out: the create is tried again later), or of another kind (not checked)."""
        reads = {"Pod": self.core.read_namespaced_pod, "Service": self.core.read_namespaced_service,
                 "ConfigMap": self.core.read_namespaced_config_map,
                 "NetworkPolicy": self.networking.read_namespaced_network_policy}
        if kind not in reads:
            return None
        what = f"read {kind} {namespace}/{name}"
        try:
            response = reads[kind](name, namespace, _request_timeout=self.timeout, _preload_content=False)
            try:
                meta = json.loads(response.data).get("metadata") or {}
            finally:
                _release(response)
        except ApiException as err:
            if err.status == 404:
                return None
            raise _classify(err, what) from err
        except NETWORK_ERRORS as err:
            raise _classify(err, what) from err
        except (ValueError, AttributeError) as err:
            raise TransientApiError(f"{what}: unreadable response: {err}") from err
        if meta.get("deletionTimestamp"):
            return None
        return [str(ref.get("uid")) for ref in meta.get("ownerReferences") or [] if isinstance(ref, dict)]

    def update_spec(self, manifest: dict[str, Any]) -> None:
        """Merge ``manifest["spec"]`` into a custom object (JSON merge patch)."""
        kind, meta = manifest["kind"], manifest["metadata"]
        ns = meta.get("namespace", "default")
        group, version = _group_version(manifest["apiVersion"])
        self._send(lambda: self.custom.patch_namespaced_custom_object(
            group, version, ns, CUSTOM_PLURALS[kind], meta["name"], {"spec": manifest["spec"]}, _request_timeout=self.timeout,
            _preload_content=False, _content_type="application/merge-patch+json"), f"update {kind} {ns}/{meta['name']}")

    def patch_object_status(self, api_version: str, kind: str, namespace: str, name: str, status: dict[str, Any],
                            resource_version: str) -> bool:
        """Merge ``status`` into a custom object's status, only at ``resource_version`` (a
        409 is transient: the next pass decides from the newer object). False if it is gone."""
        group, version = _group_version(api_version)
        body = {"metadata": {"resourceVersion": resource_version}, "status": status}
        return self._send(lambda: self.custom.patch_namespaced_custom_object_status(
            group, version, namespace, CUSTOM_PLURALS[kind], name, body, _request_timeout=self.timeout, _preload_content=False,
            _content_type="application/merge-patch+json"), f"patch status of {kind} {namespace}/{name}", tolerated=404)

    def set_suspend(self, namespace: str, name: str, suspend: bool) -> bool:
        """The job's own ``spec.suspend`` (what a queue's admission or eviction decides)."""
        return self._send(lambda: self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": {"suspend": suspend}}, _request_timeout=self.timeout,
            _preload_content=False, _content_type="application/merge-patch+json"),
            f"set spec.suspend={str(suspend).lower()} of LLMTrainJob {namespace}/{name}", tolerated=404)

    def delete_object(self, api_version: str, kind: str, namespace: str, name: str, uid: str = "") -> bool:
        """Delete a custom object; with ``uid``, only if the object of that name is still
        that one (a precondition: another object of the name is refused, 409)."""
        group, version = _group_version(api_version)
        body = client.V1DeleteOptions(propagation_policy="Background", preconditions=client.V1Preconditions(uid=uid) if uid else None)
        return self._send(lambda: self.custom.delete_namespaced_custom_object(
            group, version, namespace, CUSTOM_PLURALS[kind], name, body=body,
            _request_timeout=self.timeout, _preload_content=False), f"delete {kind} {namespace}/{name}", tolerated=404)

    def replace(self, manifest: dict[str, Any]) -> None:
        meta = manifest["metadata"]
        ns = meta.get("namespace", "default")
        self._send(lambda: self.core.replace_namespaced_config_map(meta["name"], ns, manifest, _request_timeout=self.timeout,
                                                                   _preload_content=False),
                   f"replace ConfigMap {ns}/{meta['name']}")

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None, force: bool = False) -> bool:
        """Delete a pod; ``force`` skips the kubelet's confirmation (a dead node)."""
        body = client.V1DeleteOptions(grace_period_seconds=0 if force else grace_seconds, propagation_policy="Background")
        return self._send(lambda: self.core.delete_namespaced_pod(name, namespace, body=body, _request_timeout=self.timeout,
                                                                  _preload_content=False),
                          f"delete Pod {namespace}/{name}", tolerated=404)

    def patch_pod_metadata(self, namespace: str, name: str, patch: dict[str, Any]) -> bool:
        """A JSON merge patch of a pod's metadata (labels, annotations; a ``uid`` in it is a
        precondition). False when the pod is gone (404)."""
        return self._send(lambda: self.core.patch_namespaced_pod(name, namespace, patch, _request_timeout=self.timeout,
                                                                 _preload_content=False, _content_type="application/merge-patch+json"),
                          f"patch Pod {namespace}/{name}", tolerated=404)

    def delete_job(self, namespace: str, name: str) -> None:
        self._send(lambda: self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                                       propagation_policy="Background",
                                                                       _request_timeout=self.timeout, _preload_content=False),
                   f"delete LLMTrainJob {namespace}/{name}", tolerated=404)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None) -> bool:
        """One JSON merge patch of the status subresource per pass (see patches.py).

        ``resource_version``: the version the pass planned from. The API server applies
        the patch only if the object is still at that version, else answers 409: a pass
        that planned from an older status (a lagging watch, a second replica) can never
        record a decision twice. False when the job is gone (404): deleted meanwhile,
        e.g. by its own TTL in the same pass; there is nothing left to record."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self._send(lambda: self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body, _request_timeout=self.timeout, _preload_content=False,
            _content_type="application/merge-patch+json"), f"patch status of LLMTrainJob {namespace}/{name}", tolerated=404)

    def post_event(self, job: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Events are best effort: a failure is logged, never fatal to the pass. A repeat
        of an Event this client posted raises that Event's count (event_series.py)."""
        meta = job["metadata"]
        namespace = meta.get("namespace", "default")
        message = message[:1024]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        key = EventSeries.key(namespace, str(meta.get("uid")), type_, reason, message)
        try:
            series = self.event_series.repeat(key)
            if series is not None:
                try:
                    _release(self.core.patch_namespaced_event(series.name, namespace, {"count": series.count, "lastTimestamp": now},
                                                              _content_type="application/merge-patch+json",
                                                              _request_timeout=self.timeout, _preload_content=False))
                    self.event_series.counted(key, series)
                    return
                except ApiException as err:
                    if err.status != 404:
                        raise
                    self.event_series.forget(key)  # expired (the Event TTL) or deleted: start anew
            # Named like the kubelet names events (object name + a hex timestamp).
            name = f"{meta['name']}.{time.time_ns():x}"
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {"apiVersion": job.get("apiVersion"), "kind": job.get("kind"), "name": meta["name"],
                                   "namespace": namespace, "uid": meta.get("uid")},
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": EVENT_SOURCE},
                "reportingComponent": REPORTING_COMPONENT,
                "reportingInstance": EVENT_SOURCE,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            _release(self.core.create_namespaced_event(namespace, event, _request_timeout=self.timeout, _preload_content=False))
            self.event_series.started(key, name, now)
        except (ApiException, *NETWORK_ERRORS) as err:
            log.warning("could not post event %s for %s: %s", reason, meta["name"], err)

    # ------------------------------------------------------------------ reads

    def pod_log(self, namespace: str, pod: str, container: str, follow: bool = False) -> Iterator[bytes]:
        """A container's log, in chunks as the API server sends them; with ``follow``,
        until the container ends (or the connection does)."""
        what = f"read the log of pod {namespace}/{pod}"
        try:
            # No read timeout: a followed log is quiet between a trainer's lines.
            response = self.core.read_namespaced_pod_log(pod, namespace, container=container, follow=follow,
                                                         _preload_content=False, _request_timeout=(self.timeout[0], None))
        except (ApiException, *NETWORK_ERRORS) as err:
            raise _classify(err, what) from err
        try:
            yield from response.stream(64 * 1024)
        finally:
            response.release_conn()

    def exists(self, kind: str, namespace: str, name: str) -> bool:
        reads = {"Secret": self.core.read_namespaced_secret, "PersistentVolumeClaim": self.core.read_namespaced_persistent_volume_claim}
        return self._send(lambda: reads[kind](name, namespace, _request_timeout=self.timeout, _preload_content=False),
                          f"read {kind} {namespace}/{name}", tolerated=404)

    def pod_uid(self, namespace: str, pod: str) -> str | None:
        """The uid of the pod now holding ``pod``'s name; None when there is none or it
        cannot be read (a caller that only tells pod objects apart carries on without)."""
        try:
            response = self.core.read_namespaced_pod(pod, namespace, _request_timeout=self.timeout, _preload_content=False)
            try:
                uid = (json.loads(response.data).get("metadata") or {}).get("uid")
            finally:
                _release(response)
        except (ApiException, ValueError, AttributeError, *NETWORK_ERRORS):
            return None
        return uid if isinstance(uid, str) and uid else None

    def read_object(self, api_version: str, plural: str, namespace: str | None, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(served, the object or None); ``namespace`` None for a cluster-scoped one.
        ``served`` is False when the cluster does not serve that resource at all (its CRD
        is not installed): the API server's 404 then carries no Status naming the object,
        only "404 page not found"."""
        group, version = _group_version(api_version)
        try:
            if namespace is None:
                response = self.custom.get_cluster_custom_object(group, version, plural, name, _request_timeout=self.timeout,
                                                                 _preload_content=False)
            else:
                response = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name,
                                                                    _request_timeout=self.timeout, _preload_content=False)
            try:
                return True, json.loads(response.data)
            finally:
                _release(response)
        except ApiException as err:
            if err.status == 404:
                return _names_the_object(err, name), None
            raise _classify(err, f"read {plural}.{group} {namespace}/{name}") from err
        except NETWORK_ERRORS as err:
            raise _classify(err, f"read {plural}.{group} {namespace}/{name}") from err
        except ValueError as err:
            raise TransientApiError(f"read {plural}.{group} {namespace}/{name}: unreadable response: {err}") from err

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._list(lambda: self.core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=self.timeout,
                                                                _preload_content=False), "pods")

    def list_nodes(self) -> list[dict[str, Any]]:
        return self._list(lambda: self.core.list_node(_request_timeout=self.timeout, _preload_content=False), "nodes")

    def list_services(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._list(lambda: self.core.list_namespaced_service(namespace, label_selector=selector, _request_timeout=self.timeout,
                                                                    _preload_content=False), "services")

    def list_configmaps(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._list(lambda: self.core.list_namespaced_config_map(namespace, label_selector=selector, _request_timeout=self.timeout,
                                                                       _preload_content=False), "configmaps")

    def list_network_policies(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._list(lambda: self.networking.list_namespaced_network_policy(
            namespace, label_selector=selector, _request_timeout=self.timeout, _preload_content=False), "networkpolicies")

    def _list(self, call, what: str) -> list[dict[str, Any]]:
        """Lists are read as raw JSON: no model round-trip (faster, and tolerant of
        fields newer than this client)."""
        try:
            response = call()
            try:
                return json.loads(response.data)["items"] or []
            finally:
                _release(response)
        except (ApiException, *NETWORK_ERRORS) as err:
            raise _classify(err, f"list {what}") from err
        except (ValueError, KeyError) as err:
            raise TransientApiError(f"list {what}: unreadable response: {err}") from err
