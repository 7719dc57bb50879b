"""A real Prometheus server (Debian's package) scraping the local cluster's pods.

Debian builds Prometheus without the Kubernetes service discovery, so targets come
through ``file_sd``: a thread lists the pods annotated ``prometheus.io/scrape: "true"``
(the same convention kubernetes_sd relabelling uses) and rewrites the targets file, with
the labels the chart's PodMonitor sets (namespace, pod, llmtrain_job). It evaluates the
chart's alert rules (charts/llmtrain-operator/files/alerts.yaml)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from collections.abc import Callable

import yaml
from support.waiting import wait_for

PORT = 19090
ALERTS = Path(__file__).resolve().parents[2] / "charts" / "llmtrain-operator" / "files" / "alerts.yaml"


class Prometheus:
    def __init__(self, bed, folder: Path):
        self.bed = bed
        self.folder = folder
        self.proc: subprocess.Popen | None = None

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed (hack/system-deps.sh installs it)")
        config = {
            "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{
                "job_name": "pods",
                # As the chart's ServiceMonitor does for the operator, whose series name the
                # job's namespace, not the operator pod's (llmtrain_contract.names.MetricLabel).
                # One scrape job here serves the operator and the workers (whose pages
                # carry no namespace or pod label, so nothing of theirs is honoured instead).
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(self.folder / "targets.json")], "refresh_interval": "2s"}],
            }],
        }
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._write_targets()
        log = (self.folder / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.folder / 'prometheus.yml'}", f"--storage.tsdb.path={self.folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{PORT}"], stdout=log, stderr=subprocess.STDOUT)
        threading.Thread(target=self._discover, daemon=True).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"prometheus did not become ready; see {self.folder / 'prometheus.log'}")

    def _write_targets(self) -> None:
        out = self.bed.kubectl("get", "pods", "-A", "-o", "json", check=False)
        groups = []
        if out.returncode == 0:
            for pod in json.loads(out.stdout)["items"]:
                notes = pod["metadata"].get("annotations") or {}
                ip = (pod.get("status") or {}).get("podIP")
                if notes.get("prometheus.io/scrape") == "true" and ip and pod["status"].get("phase") == "Running":
                    labels = {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"]}
                    job = (pod["metadata"].get("labels") or {}).get("llmtrain.io/job")
                    if job:
                        labels["llmtrain_job"] = job
                    groups.append({"targets": [f"{ip}:{notes.get('prometheus.io/port', '80')}"], "labels": labels})
        tmp = self.folder / "targets.json.tmp"
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.folder / "targets.json")

    def _discover(self) -> None:
        while self.proc is not None and self.proc.poll() is None:
            self._write_targets()
            time.sleep(2)

    def query(self, expr: str) -> float | None:
        url = f"http://127.0.0.1:{PORT}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:
            data = json.loads(resp.read())
        result = data["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def rules(self) -> list[dict]:
        """Every loaded alerting/recording rule with its ``health`` and ``state``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/api/v1/rules", timeout=5) as resp:
            data = json.loads(resp.read())
        return [rule for group in data["data"]["groups"] for rule in group["rules"]]

    def wait_value(self, expr: str, predicate: Callable[[float], bool], timeout: float) -> float:
        """The query's value once ``predicate`` holds (a failed query is retried)."""
        def probe() -> float | None:
            value = self.query(expr)
            return value if value is not None and predicate(value) else None

        return wait_for(probe, timeout, interval=1, what=f"{expr} satisfying the check")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
