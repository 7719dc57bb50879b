"""A small raw client of the API server for benchmarks: JSON in and out, watches read line
by line, each event stamped by the benchmark's own clock the moment it arrives.

The Kubernetes Python client turns every watched object into model classes, which costs
more CPU than the controllers under test spend; a benchmark on two cores cannot afford
that beside them.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml


class ApiError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class Kube:
    def __init__(self, kubeconfig: Path):
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        url = urlparse(cluster["server"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.context.load_cert_chain(user["client-certificate"], user["client-key"])
        self._local = threading.local()

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                timeout: float = 60, raw: bool = False) -> Any:
        """One request on this thread's kept-alive connection (a new one after an error);
        an API server that asks to retry (429, 503: starting up, overloaded) is retried
        for up to a minute. ``raw``: the answer's text, not its JSON."""
        data = json.dumps(body).encode() if body is not None else None
        deadline = time.monotonic() + 60
        while True:
            try:
                return self._once(method, path, data, content_type, timeout, raw)
            except ApiError as err:
                if err.status not in (429, 503) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def text(self, path: str, timeout: float = 30) -> str:
        """A GET answered in plain text (the API server's ``/metrics``)."""
        result = self.request("GET", path, timeout=timeout, raw=True)
        assert isinstance(result, str)
        return result

    def _once(self, method: str, path: str, data: bytes | None, content_type: str, timeout: float,
              raw: bool = False) -> Any:
        for attempt in (1, 2):
            conn = getattr(self._local, "conn", None) or self._connection(timeout)
            self._local.conn = conn
            try:
                conn.request(method, path, body=data,
                             headers={"Content-Type": content_type, "Accept": "text/plain" if raw else "application/json"})
                resp = conn.getresponse()
                text = resp.read().decode()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                continue
            if resp.status >= 300:
                raise ApiError(resp.status, text)
            if raw:
                return text
            return json.loads(text) if text else None
        raise AssertionError("unreachable")

    def watch(self, path: str, resource_version: str, stop: threading.Event) -> Iterator[tuple[float, str, dict[str, Any]]]:
        """(arrival time by time.monotonic(), type, object) until ``stop``; re-dials from the
        last resourceVersion seen when the server ends the stream."""
        rv = resource_version
        while not stop.is_set():
            conn = self._connection(timeout=30)
            sep = "&" if "?" in path else "?"
            try:
                conn.request("GET", f"{path}{sep}watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=240")
                resp = conn.getresponse()
                if resp.status != 200:
                    raise ApiError(resp.status, resp.read().decode())
                while not stop.is_set():
                    try:
                        line = resp.readline()
                    except TimeoutError:
                        continue  # a quiet stream; the server ends it within timeoutSeconds
                    if not line:
                        break
                    arrived = time.monotonic()
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""  # expired: start from the newest state
                        break
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if event["type"] != "BOOKMARK":
                        yield arrived, event["type"], obj
            except (OSError, http.client.HTTPException):
                time.sleep(0.2)
            finally:
                conn.close()


def watch_in_thread(kube: Kube, path: str, on_event: Callable[[float, str, dict[str, Any]], None],
                    stop: threading.Event) -> str:
    """List ``path`` (each item handed over as ADDED at the list's arrival), then follow
    its watch in a daemon thread. Returns the list's resourceVersion."""
    listed = kube.request("GET", path)
    arrived = time.monotonic()
    for item in listed["items"]:
        on_event(arrived, "ADDED", item)

    def run() -> None:
        for when, kind, obj in kube.watch(path, listed["metadata"]["resourceVersion"], stop):
            on_event(when, kind, obj)

    threading.Thread(target=run, name=f"watch {path}", daemon=True).start()
    return listed["metadata"]["resourceVersion"]
