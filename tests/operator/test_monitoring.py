"""The chart's workload monitoring: the alert rules and every dashboard query are valid
PromQL (Debian's promtool), the dashboard is a loadable Grafana dashboard, and every
metric and label they use is one the code exports: names are read from the real
registries of the operator, the trainer and the launcher, never from a list kept here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support.specs import ROOT

FILES = ROOT / "charts" / "llmtrain-operator" / "files"
ALERTS = FILES / "alerts.yaml"
DASHBOARD = FILES / "dashboard.json"
METRIC = re.compile(r"\b(llmtrain_(?:operator|trainer|launcher)_[a-z0-9_]+)\b")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
TARGET_LABELS = {"namespace", "pod", "llmtrain_job"}
"""What the chart's PodMonitor puts on every workload series (the operator exports the
job's ``namespace`` and ``llmtrain_job`` itself, honoured by its ServiceMonitor)."""
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def exported(tmp_path: Path) -> dict[str, set[str]]:
    """Sample name -> its label names, from the real registries of the operator and the
    trainer and from what the launcher serves."""
    from llmtrain_operator import metrics as operator_metrics
    from llmtrain_trainer.launch.attempts import AttemptTracker
    from llmtrain_trainer.train.metrics import TrainerMetrics
    from llmtrain_trainer.launch.supervisor import render_metrics

    out: dict[str, set[str]] = {}
    for registry in (operator_metrics.REGISTRY, TrainerMetrics(rank=0, strategy="ddp", config_hash="x", job="j").registry):
        # A labelled metric without children yet exports no sample to read its labels
        # from: prometheus_client keeps the sample names per collector, and the label
        # names on the metric object.
        for collector, sample_names in registry._collector_to_names.items():
            labels = set(getattr(collector, "_labelnames", ()))
            for name in sample_names:
                out[name] = labels | ({"le"} if name.endswith("_bucket") else set())
    from llmtrain_trainer.pod import progress

    # A script that reported a step: the launcher serves its progress only then.
    progress.pod_file(tmp_path).parent.mkdir(parents=True, exist_ok=True)
    progress.pod_file(tmp_path).write_text("7\n")
    for family in text_string_to_metric_families(render_metrics(AttemptTracker(tmp_path), peer_wait=2.0).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in board["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return queries


def alert_queries() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_the_dashboard_is_a_loadable_grafana_dashboard():
    board = json.loads(DASHBOARD.read_text())
    assert {"title", "uid", "panels", "schemaVersion", "templating"} <= set(board)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"]), panel["title"]
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for wanted in ("phase", "restarts", "detect", "recover", "goodput", "tokens", "stall", "age", "loss", "script"):
        assert wanted in titles, f"no panel for {wanted}"


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_metric_and_label_queried_is_exported(source, tmp_path):
    names = exported(tmp_path)
    labels = set().union(*names.values()) | TARGET_LABELS
    queries = alert_queries() if source == "alerts" else dashboard_queries()
    used = {m for q in queries for m in METRIC.findall(q)}
    assert used, "no llmtrain metric queried"
    assert used <= set(names), sorted(used - set(names))
    grouped = {label.strip() for q in queries for group in GROUPING.findall(q) for label in group.split(",") if label.strip()}
    assert grouped <= labels, sorted(grouped - labels)



def test_every_series_names_its_job_with_one_label_vocabulary(tmp_path):
    from llmtrain_contract.names import MetricLabel

    names = exported(tmp_path)
    every = set().union(*names.values())
    assert not every & {"job_namespace", "job_name", "job", "exported_namespace"}, sorted(every)
    job_labelled = {n for n, labels in names.items() if MetricLabel.JOB in labels}
    assert "llmtrain_operator_jobs_failed_total" in job_labelled and "llmtrain_trainer_info" in job_labelled, job_labelled
    assert all(MetricLabel.NAMESPACE in names[n] for n in job_labelled if n.startswith("llmtrain_operator_")), job_labelled
    # The operator's ServiceMonitor keeps what the operator exports (else Prometheus renames
    # its namespace label to exported_namespace, under the operator pod's own); the pods'
    # PodMonitor does not: a pod's page must not choose the namespace its series are filed under.
    templates = ROOT / "charts" / "llmtrain-operator" / "templates"
    assert "honorLabels: true" in (templates / "service.yaml").read_text()
    assert "honorLabels: true" not in (templates / "monitoring.yaml").read_text()



def test_the_operator_and_each_trainer_export_their_process_metrics():
    from llmtrain_operator import metrics as operator_metrics
    from llmtrain_trainer.train.metrics import TrainerMetrics
    from prometheus_client import generate_latest

    for registry in (operator_metrics.REGISTRY, TrainerMetrics(rank=0, strategy="ddp", config_hash="x", job="j").registry):
        samples = {s.name: s.value for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
        assert samples.get("process_resident_memory_bytes", 0) > 10_000_000, sorted(samples)[:20]
        assert "process_cpu_seconds_total" in samples and "process_open_fds" in samples

def test_every_alert_names_its_job_or_namespace_and_links_its_runbook_section():
    headings = {line[3:].strip().lower() for line in RUNBOOKS.read_text().splitlines() if line.startswith("## ")}
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert rules
    for rule in rules:
        notes = rule["annotations"]
        url = notes["runbook_url"]
        assert url.startswith("https://github.com/llmtrain/llmtrain-operator/blob/main/docs/runbooks.md#"), url
        assert url.rsplit("#", 1)[1] == rule["alert"].lower() in headings, (rule["alert"], sorted(headings))
        assert "$labels.namespace" in notes["summary"], notes["summary"]
    failed = next(r for r in rules if r["alert"] == "LLMTrainJobFailed")
    assert "$labels.llmtrain_job" in failed["annotations"]["summary"]

@pytest.mark.tools
def test_the_alerts_and_the_dashboard_queries_pass_promtool(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (hack/system-deps.sh installs Debian's prometheus)"
    checked = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert checked.returncode == 0 and "SUCCESS: 5 rules found" in checked.stdout, checked.stdout + checked.stderr
    # The dashboard's queries as recording rules, Grafana's variables replaced by values.
    rules = [{"record": f"llmtrain:dashboard_query_{i}:check",
              "expr": q.replace("$__rate_interval", "5m").replace("$namespace", ".*")}
             for i, q in enumerate(dashboard_queries()) if not q.startswith("label_values(")]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (le (x)"}]}]}))
    assert subprocess.run([promtool, "check", "rules", str(broken)], capture_output=True).returncode != 0, "promtool accepts anything"
