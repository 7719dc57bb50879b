"""Operator scale: N jobs whose pods run, our operator and Kubeflow's training-operator
side by side, every latency timed from outside by this script's own clock and watches.

Each controller gets a fresh local cluster (real kube-apiserver, etcd, scheduler and
controller-manager) whose nodes are kwok's (``hack/cluster-tools/kwok``): pods the
scheduler binds there go Running with an address in 127.64.0.0/16 and no process behind
it, and ``bench/_standin_pods.py`` answers on those addresses what a worker serves (the
real trainer's metrics page, a step a second, and the launcher's). So every pass of our
operator scrapes its trainers and has progress to write, as on a cluster of trainers.

For each controller, in one run:

1. *create*: N jobs created by 16 threads at once; ``create_to_first_pod`` is from a
   job's create acknowledged to its first pod in the watch; ``all_running_s`` from the
   first create to every pod Running;
2. *steady state*: its pass and queue histograms over a quiet window, its CPU (from
   /proc, cores) and RSS;
3. *kills*: K worker pods, one every ``--kill-every`` seconds, are marked Failed with
   exit code 137 (what a kubelet reports for a SIGKILLed container) through the status
   subresource. From that write, by this script's clock: ``kill_to_status`` (the job's
   status records the failure: our ``status.restarts`` or ``lastFailure`` moves, the
   latter for a kill merged into its node's episode, not charged again; Kubeflow's
   ``Restarting`` condition turns True), ``kill_to_delete`` (the pod's DELETED event) and
   ``kill_to_replacement`` (a new worker pod of the job in the watch). A kill that gets
   no answer within ``--kill-timeout`` counts as that timeout and is reported apart;
4. *nodes lost*: ``--node-kills`` nodes holding workers are made NotReady one after the
   other (``NodesDown``), as a kubelet reports a lost container runtime: this script
   writes the node's Ready condition False and keeps it so; its pods stay Running in
   the API. Before each, every job has its pods Running and a status that has not
   moved for 2 s (a job that has not settled within ``--node-kill-timeout`` is left out
   of the samples). From that write, for every settled job with a worker there:
   ``node_to_status`` and ``node_to_replacement``, as above. Example 01's
   ``nodeFailureGraceSeconds`` (10 s) is inside ours; Kubeflow acts on pod phases only,
   so its answer is the taint manager's eviction (300 s by default) or
   ``--node-kill-timeout``.

*API requests*: the API server's own ``apiserver_request_total``, read before and after
the steady state and after the kills, counted on the resources that only that
controller requests here (``Controller.resources``, ``controller_requests``: its jobs and
their status, pods, Services, ConfigMaps, Secrets, nodes; not the subresources of core
resources, Leases, Events or watches): writes and reads (GET, LIST) a second in the
steady state, and writes per kill beyond the steady state's; and the Events about its
jobs (``job_events``), a second in the steady state and per kill.

*Probes*: the metrics pages the operator asked the stand-in pods for during the steady
state, per second (``probe_requests_per_s``, the stand-in server's own count; the bench
tells it each worker's slot in its job, which its page gives as the rank). With
``--probe-pods-per-pass 0,64`` our operator runs once per value, each on a fresh bed
(``LLMTRAIN_OPERATOR_PROBE_PODS_PER_PASS``: 0 reads every worker at every pass, as before
the cap), and the RESULT line gives each run's figures (``cap0_...``) and their ratios.

Our operator also reports ``llmtrain_operator_event_to_action_seconds`` (a watch event
received to the writes it caused acknowledged, its wait for a slot and any failed
attempts included); those percentiles are interpolated from its buckets. The
headlines are the outside figures.

Both controllers run with the settings their own installs use (ours: the chart's
defaults; Kubeflow: its manifests' defaults, one worker thread). Kubeflow's webhook
Secret is issued by its own cert-controller; the benchmark copies it into the webhook's
certificate folder (the kubelet's part) and registers the webhook to select no object
(the bed has no kube-proxy to route the API server to a Service).

    python bench/operator_scale.py [--quick] [--jobs N] [--workers W] [--kills K] [--node-kills N] [--no-peer]
    RESULT jobs=500 kill_to_status_p50_s=... kill_to_status_p99_s=... node_to_status_p99_s=... api_writes_per_s=...
           event_to_action_p99_s=... reconcile_p99_s=... queue_p99_s=... rss_mb=... cpu_cores=...
           kubeflow_kill_to_status_p99_s=... ...
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, UTC
from pathlib import Path
from typing import Any
from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "hack"), str(ROOT / "tests")]
from _common import parser, result  # noqa: E402
from _kube import ApiError, Kube, watch_in_thread  # noqa: E402
from llmtrain_contract.names import HEALTH_PORT  # noqa: E402

NS = "scale"
PODS_PER_NODE = 200
OUR_METRICS_PORT = 18080
KF_METRICS_PORT, KF_PROBE_PORT, KF_WEBHOOK_PORT = 18081, 18082, 19443
KF_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
"""Hard-coded in training-operator v1.8.1 (pkg/cert)."""
KF_MODULE = "github.com/kubeflow/training-operator@v1.8.1"
KWOK_MODULE = "sigs.k8s.io/kwok@v0.8.0"
KWOK_STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")
"""kwok's own stage set for nodes that initialise at once and heartbeat through a Lease,
and pods that go Running at once and vanish when deleted (as ``kwokctl`` configures it)."""


def module_dir(module: str) -> Path:
    """A module's files in the Go module cache (``build_tools`` downloaded it)."""
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    return Path(cache) / module


# ---------------------------------------------------------------- what differs per controller


@dataclass
class Controller:
    name: str
    collection: str
    """The jobs' API path in the namespace."""
    extra_pods: int
    """Pods a job has besides its ``WORKERS`` workers' (ours: the rendezvous store; Kubeflow's
    master is one of them)."""
    job_label: str
    worker: Callable[[dict[str, Any]], bool]
    restart_mark: Callable[[dict[str, Any]], int]
    """A number that grows when the job's status records a restart."""
    manifest: Callable[[int], dict[str, Any]]
    metrics_port: int
    resources: frozenset[tuple[str, str]]
    """The API resources, as (group, resource), that only this controller requests here
    (``controller_requests``): the jobs, what it creates for them, the nodes it reads."""
    kind: str
    """Its jobs' kind: the Events about them are its own (``job_events``)."""


WORKERS = 2
"""Workers a job has (``--workers``): example 01's two by default."""


def _our_job(i: int) -> dict[str, Any]:
    from support.specs import apply_set, load_job  # noqa: PLC0415

    # Many kills in one job: a budget they cannot exhaust. And no progress backstop: on
    # this bed's two cores 8,192 pods take about ten minutes to be scheduled and run, and
    # example 01's 120 s restarted the jobs still waiting for their last workers.
    size = {} if WORKERS == 2 else {"spec.replicas": {"min": WORKERS, "max": WORKERS},
                                    "spec.trainer.builtin.globalBatchSize": 2 * WORKERS,
                                    "spec.faultTolerance.maxRestarts": 100_000,
                                    "spec.faultTolerance.progressTimeoutSeconds": 0}
    job = apply_set(load_job(), {
        # The bed's fake nodes have room for any request; tiny ones keep the scheduler's
        # arithmetic out of the picture. Everything else is example 01 as written.
        **size,
        "spec.resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "spec.trainer.builtin.maxSteps": 1_000_000,
        # kill_to_delete times the failed pod's delete, as Kubeflow's: by default the pod
        # would be kept for its log (a label patch) and never deleted.
        "spec.faultTolerance.keepFailedPods": 0,
    })
    job["metadata"] = {"name": f"job-{i:04d}", "namespace": NS}
    return job


def _kubeflow_job(i: int) -> dict[str, Any]:
    def replica(count: int = 1) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "ExitCode", "template": {"spec": {"containers": [{
            "name": "pytorch", "image": "ghcr.io/llmtrain/trainer:0.1.0", "command": ["python", "-m", "llmtrain_trainer"],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": f"job-{i:04d}", "namespace": NS},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(), "Worker": replica(WORKERS - 1)}, "runPolicy": {"backoffLimit": 1000}}}


def _kubeflow_restarting(job: dict[str, Any]) -> int:
    """When Kubeflow last recorded a restart (its ``Restarting`` condition's transition,
    epoch seconds; 0 before any). Read from the transition time, not the condition's
    state: when the replacement runs at once, Kubeflow may write Restarting=True and
    Running=True in successive passes, or only the latter with Restarting turned False."""
    conditions = (job.get("status") or {}).get("conditions") or []
    stamps = [c.get("lastTransitionTime") for c in conditions if c.get("type") == "Restarting"]
    if not stamps or not stamps[0]:
        return 0
    return int(datetime.strptime(stamps[0], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())


def _our_failure_mark(job: dict[str, Any]) -> int:
    """Grows when the status records a failure: its restarts, or (a kill that merges into
    its node's episode, not charged again) the newest failure's time, epoch seconds."""
    status = job.get("status") or {}
    stamp = (status.get("lastFailure") or {}).get("time")
    when = int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()) if stamp else 0
    return int(status.get("restarts") or 0) + when


OURS = Controller(
    name="llmtrain", collection=f"/apis/llmtrain.io/v1alpha1/namespaces/{NS}/llmtrainjobs", extra_pods=1,
    job_label="llmtrain.io/job", worker=lambda pod: pod["metadata"]["labels"].get("llmtrain.io/role") == "worker",
    restart_mark=lambda job: _our_failure_mark(job), manifest=_our_job,
    metrics_port=OUR_METRICS_PORT,
    resources=frozenset({("llmtrain.io", "llmtrainjobs"), ("", "pods"), ("", "services"), ("", "configmaps"), ("", "secrets"),
                         ("", "nodes")}),
    kind="LLMTrainJob")
KUBEFLOW = Controller(
    name="kubeflow", collection=f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs", extra_pods=0,
    job_label="training.kubeflow.org/job-name",
    worker=lambda pod: pod["metadata"]["labels"].get("training.kubeflow.org/replica-type") == "worker",
    restart_mark=_kubeflow_restarting, manifest=_kubeflow_job, metrics_port=KF_METRICS_PORT,
    resources=frozenset({("kubeflow.org", "pytorchjobs"), ("", "pods"), ("", "services"), ("", "configmaps"), ("", "nodes")}),
    kind="PyTorchJob")


# ---------------------------------------------------------------- the benchmark's own record


@dataclass
class Record:
    controller: Controller
    lock: threading.Lock = field(default_factory=threading.Lock)
    created: dict[str, float] = field(default_factory=dict)
    first_pod: dict[str, float] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Live pods by uid (a replacement may reuse its predecessor's name): job, worker or
    not, phase, the object."""
    added: dict[str, float] = field(default_factory=dict)
    owner: dict[str, tuple[str | None, bool]] = field(default_factory=dict)
    """Every pod seen, live or gone, by uid: (job, worker or not)."""
    deleted: dict[str, float] = field(default_factory=dict)
    marks: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    """Per job: (arrival, value) each time its restart mark changed."""

    def on_pod(self, when: float, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        job = pod["metadata"].get("labels", {}).get(self.controller.job_label)
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
                self.deleted.setdefault(uid, when)
                return
            if uid not in self.added:
                self.added[uid] = when
                self.owner[uid] = (job, self.controller.worker(pod))
                if job is not None:
                    self.first_pod.setdefault(job, when)
            self.pods[uid] = {"job": job, "worker": self.controller.worker(pod),
                              "phase": (pod.get("status") or {}).get("phase"), "pod": pod}

    def on_job(self, when: float, kind: str, job: dict[str, Any]) -> None:
        if kind == "DELETED":
            return
        name, value = job["metadata"]["name"], self.controller.restart_mark(job)
        with self.lock:
            marks = self.marks.setdefault(name, [])
            if not marks or marks[-1][1] != value:
                marks.append((when, value))

    def mark_now(self, job: str) -> int:
        with self.lock:
            marks = self.marks.get(job) or [(0.0, 0)]
            return marks[-1][1]

    def mark_after(self, job: str, since: float, above: int) -> float | None:
        with self.lock:
            return next((t for t, v in self.marks.get(job, []) if t >= since and v > above), None)

    def ranks(self) -> dict[str, int]:
        """Each running worker's address -> its slot in its job: the rank its stand-in page
        says (``_standin_pods.py``), one rank 0 a job, as torchrun numbers one rank a node."""
        with self.lock:
            pods = [p["pod"] for p in self.pods.values() if p["worker"] and p["phase"] == "Running"]
        slots = [((p.get("status") or {}).get("podIP"), (p["metadata"].get("labels") or {}).get("llmtrain.io/slot"))
                 for p in pods]
        return {ip: int(slot) for ip, slot in slots if ip and slot is not None and str(slot).isdigit()}

    def running(self) -> int:
        with self.lock:
            return sum(1 for p in self.pods.values() if p["phase"] == "Running")

    def replacement_after(self, job: str, since: float, killed: set[str]) -> float | None:
        with self.lock:
            times = [t for uid, t in self.added.items() if t >= since and uid not in killed and self.owner[uid] == (job, True)]
        return min(times) if times else None

    def running_workers_by_node(self) -> dict[str, dict[str, set[str]]]:
        """node -> job -> the uids of that job's running workers there."""
        out: dict[str, dict[str, set[str]]] = {}
        with self.lock:
            for uid, p in self.pods.items():
                node = (p["pod"].get("spec") or {}).get("nodeName")
                if p["worker"] and p["phase"] == "Running" and node and p["job"] is not None:
                    out.setdefault(node, {}).setdefault(p["job"], set()).add(uid)
        return out


# ---------------------------------------------------------------- measuring a process


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scrape_buckets(port: int, name: str, labels: dict[str, str] | None = None) -> list[tuple[float, float]]:
    """Cumulative (le, count) of one histogram, summed over its series matching ``labels``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    sums: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        inside = line[line.index("{") + 1:line.rindex("}")]
        pairs = dict(p.split("=", 1) for p in inside.split('",') if "=" in p)
        pairs = {k.strip(): v.strip('"') for k, v in pairs.items()}
        if labels and any(pairs.get(k) != v for k, v in labels.items()):
            continue
        le = float("inf") if pairs["le"] == "+Inf" else float(pairs["le"])
        sums[le] = sums.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return sorted(sums.items())


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative buckets (None without samples). At
    the +Inf bucket it answers the largest finite bound, as Prometheus does."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, prev_le, prev_count = q * buckets[-1][1], 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            span = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / span if span else 0)
        prev_le, prev_count = le, count
    return prev_le


def minus(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    earlier = dict(before)
    return [(le, count - earlier.get(le, 0.0)) for le, count in after]


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile of measured values, nearest rank (a p99 of 40 values is the worst)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


# ---------------------------------------------------------------- the API server's own count

WRITES = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READS = frozenset({"GET", "LIST"})
"""Watches are left out of the reads: one is a stream, whatever it carries."""


def api_requests(kube: Kube) -> dict[tuple[str, str, str, str], float]:
    """The API server's ``apiserver_request_total`` so far, by (verb, group, resource,
    subresource), summed over versions, scopes and answers."""
    out: dict[tuple[str, str, str, str], float] = {}
    for line in kube.text("/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        inside, _, value = line[len("apiserver_request_total{"):].rpartition("} ")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', inside))
        key = (labels.get("verb", ""), labels.get("group", ""), labels.get("resource", ""), labels.get("subresource", ""))
        out[key] = out.get(key, 0.0) + float(value)
    return out


def controller_requests(c: Controller, after: dict[tuple[str, str, str, str], float],
                        before: dict[tuple[str, str, str, str], float]) -> dict[str, dict[str, float]]:
    """The controller's requests between two counts: {"writes"|"reads": {"VERB resource[/sub]": n}}:
    those on ``c.resources``, with the ``status`` of its own kind of job. Left out: the
    subresources of core resources (pods' and nodes' status are kwok's, as a kubelet's, and
    this script's kills), Leases (kwok renews one a node; our operator's leader Lease, a
    GET and a PUT every few seconds, is not counted either: Kubeflow runs here without
    leader election), Events (here the endpoints controllers write thousands, about
    Services whose pods have loopback addresses: ``job_events`` counts the controller's)
    and watches (streams).
    A pod's delete counts twice: the controller's, and kwok's (a kubelet's last word on
    the pod; both controllers showed two a kill)."""
    out: dict[str, dict[str, float]] = {"writes": {}, "reads": {}}
    for (verb, group, resource, sub), count in after.items():
        if (group, resource) not in c.resources or (sub and not (sub == "status" and group)):
            continue
        n = count - before.get((verb, group, resource, sub), 0.0)
        kind = "writes" if verb in WRITES else "reads" if verb in READS else None
        if kind and n > 0:
            out[kind][f"{verb} {resource}{'/' + sub if sub else ''}"] = n
    return out


def job_events(kube: Kube, kind: str) -> int:
    """How many times the Events about jobs of ``kind`` in the jobs' namespace happened so
    far (their counts summed: a repeated Event is one object whose count grows): what the
    controller says on its jobs."""
    items = kube.request("GET", f"/api/v1/namespaces/{NS}/events")["items"]
    return sum(int(e.get("count") or 1) for e in items if (e.get("involvedObject") or {}).get("kind") == kind)


def events_by_reason(kube: Kube) -> dict[str, list[Any]]:
    """The jobs' namespace's core Events so far: reason -> [times they happened (their
    counts summed), one message], the most frequent first (which writes the Events were)."""
    out: dict[str, list[Any]] = {}
    for event in kube.request("GET", f"/api/v1/namespaces/{NS}/events")["items"]:
        seen = out.setdefault(str(event.get("reason")), [0, str(event.get("message"))[:160]])
        seen[0] += int(event.get("count") or 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][0])[:8])


# ---------------------------------------------------------------- the bed


def fake_nodes(kube: Kube, count: int) -> None:
    for i in range(count):
        name = f"kwok-{i}"
        cidr = f"127.{64 + (i + 1) // 256}.{(i + 1) % 256}.0/24"  # loopback: 254 pods a node, 48,000 nodes
        kube.request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok",
                                    "llmtrain.io/pool": "gpu"}},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
            "status": {"allocatable": {"cpu": "1000", "memory": "4Ti", "pods": str(PODS_PER_NODE)},
                       "capacity": {"cpu": "1000", "memory": "4Ti", "pods": str(PODS_PER_NODE)},
                       "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake"}}})


def wait(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (OSError, ApiError, KeyError, ValueError):
            value = None
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"{what} within {timeout:.0f}s")


class Bed:
    """A fresh local cluster with kwok's nodes and the stand-in pods' server."""

    def __init__(self, nodes: int, logs: Path):
        from localcluster.cluster import LocalCluster, build_tools  # noqa: PLC0415

        self.tools = build_tools("kwok", "training-operator")
        self.cluster = LocalCluster.default()
        self.cluster.nodes = []  # kwok's nodes only: no pod runs as a process
        self.nodes, self.logs, self.procs = nodes, logs, []

    def up(self) -> Kube:
        self.cluster.up()
        kube = Kube(self.cluster.kubeconfig)
        stages = module_dir(KWOK_MODULE) / "kustomize" / "stage"
        config = self.logs / "kwok-stages.yaml"
        config.write_text("---\n".join((stages / s).read_text() for s in KWOK_STAGES))
        self.start("kwok", [str(self.tools / "kwok"), f"--kubeconfig={self.cluster.kubeconfig}", f"--config={config}",
                            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--cidr=127.64.0.0/24",
                            "--node-lease-duration-seconds=40"])
        fake_nodes(kube, self.nodes)
        wait(lambda: sum(1 for n in kube.request("GET", "/api/v1/nodes")["items"]
                         if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])))
             == self.nodes, 120, f"{self.nodes} kwok nodes Ready")
        standin = self.start("standin-pods", [sys.executable, str(ROOT / "bench" / "_standin_pods.py"),
                                              f"--world={WORKERS}"])
        log = self.logs / "standin-pods.log"

        def serving() -> bool:
            if standin.poll() is not None:  # e.g. another process holds its ports
                raise RuntimeError(f"the stand-in pods' server exited: {log.read_text()[-2000:]}")
            return "serving" in log.read_text()

        wait(serving, 30, "the stand-in pods' server serving")
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        return kube

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env or self.cluster.env(), start_new_session=True)
        self.procs.append(proc)
        return proc

    def down(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
        self.cluster.down()


def start_ours(bed: Bed, kube: Kube, probe_cap: int | None) -> subprocess.Popen:
    kube_apply_file(bed, ROOT / "crds" / "llmtrain.io_llmtrainjobs.yaml")
    env = {**bed.cluster.env(), "LLMTRAIN_OPERATOR_METRICS_PORT": str(OUR_METRICS_PORT), "PYTHONUNBUFFERED": "1"}
    if probe_cap is not None:
        env["LLMTRAIN_OPERATOR_PROBE_PODS_PER_PASS"] = str(probe_cap)
    proc = bed.start("operator-llmtrain", [sys.executable, "-m", "kopf", "run", "--standalone", "--all-namespaces",
                                            "-m", "llmtrain_operator.handlers"], env)
    wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{OUR_METRICS_PORT}/metrics", timeout=2).status == 200
         and "llmtrain_operator_leader 1.0" in urllib.request.urlopen(f"http://127.0.0.1:{OUR_METRICS_PORT}/metrics").read().decode(),
         120, "our operator leading")
    return proc


def kube_apply_file(bed: Bed, path: Path) -> None:
    bed.cluster.kubectl("apply", "--server-side", "-f", str(path))


def start_kubeflow(bed: Bed, kube: Kube) -> subprocess.Popen:
    module = module_dir(KF_MODULE)
    kube_apply_file(bed, module / "manifests" / "base" / "crds" / "kubeflow.org_pytorchjobs.yaml")
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kubeflow"}})
    # Its manifests create the Secret empty; its cert-controller fills it in.
    kube.request("POST", "/api/v1/namespaces/kubeflow/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "training-operator-webhook-cert", "namespace": "kubeflow"}})
    kube.request("POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validator.training-operator.kubeflow.org"},
        "webhooks": [{"name": "validator.pytorchjob.training-operator.kubeflow.org", "admissionReviewVersions": ["v1"],
                      "sideEffects": "None", "failurePolicy": "Ignore",
                      "clientConfig": {"url": f"https://127.0.0.1:{KF_WEBHOOK_PORT}/validate-kubeflow-org-v1-pytorchjob"},
                      "objectSelector": {"matchExpressions": [{"key": "bench.llmtrain.io/never", "operator": "Exists"}]},
                      "rules": [{"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                                 "resources": ["pytorchjobs"]}]}]})
    shutil.rmtree(KF_CERT_DIR, ignore_errors=True)
    proc = bed.start("operator-kubeflow", [str(bed.tools / "training-operator"), f"--kubeconfig={bed.cluster.kubeconfig}",
                                           "--enable-scheme=pytorchjob", f"--metrics-bind-address=127.0.0.1:{KF_METRICS_PORT}",
                                           f"--health-probe-bind-address=127.0.0.1:{KF_PROBE_PORT}",
                                           f"--webhook-server-port={KF_WEBHOOK_PORT}"])
    secret = wait(lambda: (kube.request("GET", "/api/v1/namespaces/kubeflow/secrets/training-operator-webhook-cert").get("data")
                           or {}).get("tls.crt") and kube.request(
                               "GET", "/api/v1/namespaces/kubeflow/secrets/training-operator-webhook-cert")["data"],
                  120, "Kubeflow's webhook Secret filled in")
    KF_CERT_DIR.mkdir(parents=True, exist_ok=True)
    for key, value in secret.items():
        (KF_CERT_DIR / key).write_bytes(base64.b64decode(value))
    wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{KF_PROBE_PORT}/readyz", timeout=2).status == 200, 120,
         "Kubeflow's training-operator ready")
    wait(lambda: "controller_runtime_reconcile_total" in urllib.request.urlopen(
        f"http://127.0.0.1:{KF_METRICS_PORT}/metrics", timeout=2).read().decode(), 120, "Kubeflow's controller started")
    return proc


# ---------------------------------------------------------------- one controller's run


def histograms(c: Controller) -> dict[str, list[tuple[float, float]]]:
    if c is OURS:
        return {"reconcile": scrape_buckets(c.metrics_port, "llmtrain_operator_reconcile_duration_seconds"),
                "queue": scrape_buckets(c.metrics_port, "llmtrain_operator_reconcile_queue_seconds"),
                "event_to_action": scrape_buckets(c.metrics_port, "llmtrain_operator_event_to_action_seconds")}
    return {"reconcile": scrape_buckets(c.metrics_port, "controller_runtime_reconcile_time_seconds",
                                        {"controller": "pytorchjob-controller"}),
            "queue": scrape_buckets(c.metrics_port, "workqueue_queue_duration_seconds", {"name": "pytorchjob-controller"})}


def create_all(kube: Kube, c: Controller, rec: Record, jobs: int) -> float:
    began = time.monotonic()

    def create(i: int) -> None:
        manifest = c.manifest(i)
        kube.request("POST", c.collection, manifest, timeout=300)
        with rec.lock:
            rec.created[manifest["metadata"]["name"]] = time.monotonic()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, range(jobs)))
    return began


def kill(kube: Kube, pod: dict[str, Any]) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    statuses = [{"name": ct["name"], "image": ct["image"], "imageID": "", "ready": False, "restartCount": 0,
                 "state": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": now, "finishedAt": now}}}
                for ct in pod["spec"]["containers"]]
    kube.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status",
                 {"status": {"phase": "Failed", "containerStatuses": statuses,
                             "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}]}},
                 content_type="application/merge-patch+json")


def tally(got: dict[str, float | None], t0: float, timeout: float, out: dict[str, list[float]], missed: dict[str, int]) -> None:
    """One fault's answers (arrival times, None for none) into the latencies from ``t0``:
    an answer that never came counts as the timeout, and is counted in ``missed``."""
    for key, t in got.items():
        if t is None:
            missed[key] += 1
            out[key].append(timeout)
        else:
            out[key].append(t - t0)


def _answered(rec: Record, shot: tuple[str, str, float, int]) -> bool:
    job, uid, t0, before = shot
    return None not in (rec.mark_after(job, t0, before), rec.deleted.get(uid), rec.replacement_after(job, t0, {uid}))


def run_kills(kube: Kube, c: Controller, rec: Record, count: int, every: float, timeout: float) -> dict[str, Any]:
    """``count`` kills, one job at a time until every job was hit once, then again (a job
    is hit again only once its earlier kill was answered, or timed out, so that no answer
    is credited to the wrong kill: fewer jobs than kills, one job of 1,024 workers)."""
    rng = random.Random(7)
    shots: list[tuple[str, str, float, int]] = []
    hit: set[str] = set()
    for _ in range(count):
        with rec.lock:
            candidates = [(uid, p) for uid, p in rec.pods.items() if p["worker"] and p["phase"] == "Running" and p["job"] not in hit]
        if not candidates and hit:
            round_ = [s for s in shots if s[0] in hit]

            def settled(round_: list[tuple[str, str, float, int]] = round_) -> bool:
                return all(_answered(rec, s) or time.monotonic() > s[2] + timeout for s in round_)

            wait(settled, timeout + 5, "the round's kills answered", every=0.05)
            hit.clear()
            with rec.lock:
                candidates = [(uid, p) for uid, p in rec.pods.items() if p["worker"] and p["phase"] == "Running"]
        if not candidates:
            print(f"[{c.name}] only {len(shots)} of {count} kills: no running worker left", flush=True)
            break
        uid, pod = rng.choice(sorted(candidates, key=lambda x: x[0]))
        hit.add(pod["job"])
        before = rec.mark_now(pod["job"])
        t0 = time.monotonic()
        kill(kube, pod["pod"])
        shots.append((pod["job"], uid, t0, before))
        time.sleep(every)
    deadline = time.monotonic() + timeout
    out: dict[str, list[float]] = {"status": [], "delete": [], "replacement": []}
    missed = {k: 0 for k in out}
    pending = list(shots)
    while pending:
        still = []
        for job, uid, t0, before in pending:
            got = {"status": rec.mark_after(job, t0, before), "delete": rec.deleted.get(uid),
                   "replacement": rec.replacement_after(job, t0, {uid})}
            if all(v is not None for v in got.values()) or time.monotonic() > max(deadline, t0 + timeout):
                tally(got, t0, timeout, out, missed)
            else:
                still.append((job, uid, t0, before))
        pending = still
        time.sleep(0.05)
    return {"latencies": out, "missed": missed, "kills": len(shots)}


class NodesDown:
    """Nodes this script made NotReady, kept so. A kubelet whose container runtime died
    reports its node's Ready condition False and goes on renewing its Lease; here kwok
    plays the kubelet. Its annotation is removed so that kwok no longer hears of the
    node's changes, but a heartbeat kwok had already queued (every 600 s or so) may still
    write Ready back: a thread puts the condition back, with its first transition time,
    whenever it finds it otherwise (``rewrites`` counts those)."""

    def __init__(self, kube: Kube, stop: threading.Event):
        self.kube, self.stop = kube, stop
        self.down: dict[str, dict[str, str]] = {}
        self.rewrites = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._guard, daemon=True).start()

    def take_down(self, node: str) -> float:
        """``node`` NotReady now; the moment of the report by this script's clock (taken on
        a whole second, as the condition's stamp has no finer grain)."""
        self.kube.request("PATCH", f"/api/v1/nodes/{node}", {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}},
                          content_type="application/merge-patch+json")
        time.sleep(1.0 - (time.time() % 1.0))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "container runtime is down",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}
        t0 = time.monotonic()
        self._report(node, ready)
        with self.lock:
            self.down[node] = ready
        return t0

    def nodes(self) -> set[str]:
        with self.lock:
            return set(self.down)

    def _report(self, node: str, ready: dict[str, str]) -> None:
        # A strategic merge: nodes merge their conditions by type, so only Ready changes.
        self.kube.request("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"conditions": [ready]}},
                          content_type="application/strategic-merge-patch+json")

    def _guard(self) -> None:
        while not self.stop.wait(1.0):
            with self.lock:
                down = dict(self.down)
            for node, ready in down.items():
                try:
                    conditions = self.kube.request("GET", f"/api/v1/nodes/{node}")["status"].get("conditions", [])
                    if any(c.get("type") == "Ready" and c.get("status") != "False" for c in conditions):
                        self._report(node, {**ready, "lastHeartbeatTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
                        self.rewrites += 1
                except (OSError, ApiError, KeyError) as err:
                    if not self.stop.is_set():
                        print(f"[bench] keeping {node} NotReady: {err}", flush=True)


def settled_jobs(rec: Record, pods: int, quiet: float, timeout: float) -> set[str]:
    """Wait up to ``timeout`` for every job to have its ``pods`` pods Running and a status
    mark that has not moved for ``quiet`` seconds (so that nothing of an earlier fault is
    credited to the next); the jobs so settled."""
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        with rec.lock:
            running: dict[str, int] = {}
            for p in rec.pods.values():
                if p["phase"] == "Running" and p["job"] is not None:
                    running[p["job"]] = running.get(p["job"], 0) + 1
            jobs = set(rec.created)
            quiet_ones = {j for j in jobs if not rec.marks.get(j) or now - rec.marks[j][-1][0] >= quiet}
        ready = {j for j in jobs if running.get(j, 0) >= pods} & quiet_ones
        if ready == jobs or now > deadline:
            return ready
        time.sleep(0.2)


def run_node_kills(kube: Kube, c: Controller, rec: Record, count: int, timeout: float,
                   stop: threading.Event) -> dict[str, Any]:
    """``count`` nodes holding running workers made NotReady (``NodesDown``), one after
    the other, each once the jobs have settled (``settled_jobs``) and once every job with
    a worker there was answered or timed out. Per settled job with a worker there, from
    the report: ``node_to_status`` (its status records the failure) and
    ``node_to_replacement`` (a new worker of that job in the watch). The nodes stay down:
    the bed has spares."""
    rng = random.Random(11)
    out: dict[str, list[float]] = {"status": [], "replacement": []}
    missed = {k: 0 for k in out}
    nodes = NodesDown(kube, stop)
    for n in range(count):
        settled = settled_jobs(rec, WORKERS + c.extra_pods, 2.0, timeout)
        by_node = {node: jobs for node, jobs in rec.running_workers_by_node().items() if node not in nodes.nodes()}
        if not by_node:
            print(f"[{c.name}] only {n} of {count} node kills: no node holds a running worker", flush=True)
            break
        node = rng.choice(sorted(by_node))
        hit = {job: uids for job, uids in by_node[node].items() if job in settled}
        with rec.lock:
            beside = {p["job"] for p in rec.pods.values() if not p["worker"] and p["job"] in hit
                      and (p["pod"].get("spec") or {}).get("nodeName") == node}
        before = {job: rec.mark_now(job) for job in hit}
        t0 = nodes.take_down(node)
        print(f"[{c.name}]   {node} NotReady: {sum(len(u) for u in by_node[node].values())} workers of "
              f"{len(by_node[node])} job(s) there, {len(by_node[node]) - len(hit)} of them left out (not settled), "
              f"{len(beside)} with another of their pods there (ours: the rendezvous store; Kubeflow: the master)", flush=True)
        answers: dict[str, dict[str, float | None]] = {}
        while True:
            for job, killed in hit.items():
                answers[job] = {"status": rec.mark_after(job, t0, before[job]),
                                "replacement": rec.replacement_after(job, t0, killed)}
            if all(None not in a.values() for a in answers.values()) or time.monotonic() > t0 + timeout:
                break
            time.sleep(0.05)
        for got in answers.values():
            tally(got, t0, timeout, out, missed)
    if nodes.rewrites:
        print(f"[{c.name}]   a NotReady node's Ready was written back {nodes.rewrites} time(s) and put back", flush=True)
    return {"latencies": out, "missed": missed}


def post_ranks(rec: Record, stop: threading.Event) -> None:
    """Every 2 s, tell the stand-in pods each running worker's rank (its slot in its job)."""
    while not stop.wait(2.0):
        ranks = rec.ranks()
        if not ranks:
            continue
        try:
            answer = urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{HEALTH_PORT}/ranks", data=json.dumps(ranks).encode(), method="POST"), timeout=5).read()
            if answer.decode().split()[0] != str(len(ranks)):
                print(f"[bench] the stand-in pods took {answer!r} of {len(ranks)} ranks", flush=True)
        except (OSError, http.client.HTTPException) as err:
            if not stop.is_set():
                print(f"[bench] posting ranks to the stand-in pods failed: {err}", flush=True)


def probe_pages() -> int:
    """Metrics pages the stand-in pods have served so far (``_standin_pods.py``)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{HEALTH_PORT}/requests", timeout=5).read().decode()
    return sum(int(line.split()[1]) for line in text.splitlines())


def measure(c: Controller, args: Any, logs: Path, probe_cap: int | None = None) -> dict[str, Any]:
    pods_per_job = WORKERS + c.extra_pods
    # A spare for each node lost, and never so few nodes that the lost ones are a
    # disrupted zone (more than 2 and 55 %: the node lifecycle controller and our operator
    # would then hold every pod; kwok's nodes have no zone, so they are all one).
    nodes = max(math.ceil(args.jobs * pods_per_job * 1.25 / PODS_PER_NODE) + args.node_kills, 2 * args.node_kills + 1)
    bed = Bed(nodes, logs)
    print(f"[{c.name}] bed: fresh local cluster, {nodes} kwok nodes"
          + (f", PROBE_PODS_PER_PASS={probe_cap}" if probe_cap is not None else ""), flush=True)
    stop = threading.Event()
    try:
        kube = bed.up()
        proc = start_ours(bed, kube, probe_cap) if c is OURS else start_kubeflow(bed, kube)
        rec = Record(c)
        watch_in_thread(kube, f"/api/v1/namespaces/{NS}/pods", rec.on_pod, stop)
        if c is OURS:
            threading.Thread(target=post_ranks, args=(rec, stop), daemon=True).start()
        watch_in_thread(kube, c.collection, rec.on_job, stop)
        began = create_all(kube, c, rec, args.jobs)
        print(f"[{c.name}] {args.jobs} jobs created in {time.monotonic() - began:.1f}s", flush=True)
        want = args.jobs * pods_per_job
        last = [0.0]

        def all_running() -> bool:
            n = rec.running()
            if time.monotonic() - last[0] > 15:
                print(f"[{c.name}]   {n}/{want} pods Running", flush=True)
                last[0] = time.monotonic()
            return n >= want

        wait(all_running, args.ramp_timeout, f"{want} pods Running", every=0.2)
        all_running_s = time.monotonic() - began
        first = [rec.first_pod[j] - rec.created[j] for j in rec.created if j in rec.first_pod]
        print(f"[{c.name}] every pod Running {all_running_s:.1f}s after the first create; steady state for {args.steady:.0f}s",
              flush=True)
        time.sleep(min(10.0, args.steady))  # the ramp's stragglers settle
        h0, cpu0, pages0, api0, t0 = histograms(c), cpu_seconds(proc.pid), probe_pages(), api_requests(kube), time.monotonic()
        events0 = job_events(kube, c.kind)
        time.sleep(args.steady)
        h1, cpu1, pages1, api1, t1 = histograms(c), cpu_seconds(proc.pid), probe_pages(), api_requests(kube), time.monotonic()
        events1 = job_events(kube, c.kind)
        steady = {k: minus(h1[k], h0[k]) for k in h1}
        cores, rss = (cpu1 - cpu0) / (t1 - t0), rss_mb(proc.pid)
        print(f"[{c.name}] {args.kills} kills, one every {args.kill_every:.1f}s", flush=True)
        kills = run_kills(kube, c, rec, args.kills, args.kill_every, args.kill_timeout)
        h2, api2, t2 = histograms(c), api_requests(kube), time.monotonic()
        events2 = job_events(kube, c.kind)
        during = {k: minus(h2[k], h1[k]) for k in h2}
        steady_api, kills_api = controller_requests(c, api1, api0), controller_requests(c, api2, api1)
        print(f"[{c.name}] API requests in the steady state: {steady_api}", flush=True)
        print(f"[{c.name}] Events so far, by reason: {events_by_reason(kube)}", flush=True)
        print(f"[{c.name}] API requests during the kills: {kills_api}", flush=True)
        nodes_lost: dict[str, Any] = {"latencies": {"status": [], "replacement": []}, "missed": {"status": 0, "replacement": 0}}
        if args.node_kills:
            print(f"[{c.name}] {args.node_kills} nodes NotReady, one after the other", flush=True)
            nodes_lost = run_node_kills(kube, c, rec, args.node_kills, args.node_kill_timeout, stop)
        if proc.poll() is not None:
            raise RuntimeError(f"{c.name} exited during the run: see {logs}")
        # The largest job object as the API server serves it (what etcd holds, less its framing).
        sizes = [(len(json.dumps(j, separators=(",", ":"))), len(json.dumps(j.get("status") or {}, separators=(",", ":"))))
                 for j in kube.request("GET", c.collection)["items"]]
        lat = kills["latencies"]
        out = {
            "jobs": args.jobs, "pods": want, "all_running_s": all_running_s,
            "create_to_first_pod_p50_s": pct(first, 0.5), "create_to_first_pod_p99_s": pct(first, 0.99),
            "kills": kills["kills"],
            **{f"kill_to_{k}_p50_s": pct(v, 0.5) for k, v in lat.items()},
            **{f"kill_to_{k}_p99_s": pct(v, 0.99) for k, v in lat.items()},
            **{f"kill_to_{k}_unanswered": n for k, n in kills["missed"].items()},
            "reconcile_p50_s": quantile(steady["reconcile"], 0.5), "reconcile_p99_s": quantile(steady["reconcile"], 0.99),
            "queue_p99_s": quantile(steady["queue"], 0.99),
            "passes_per_s": (steady["reconcile"][-1][1] / (t1 - t0)) if steady["reconcile"] else None,
            "reconcile_during_kills_p99_s": quantile(during["reconcile"], 0.99),
            "queue_during_kills_p99_s": quantile(during["queue"], 0.99),
            "rss_mb": rss, "cpu_cores": cores, "probe_requests_per_s": (pages1 - pages0) / (t1 - t0),
            "api_writes_per_s": sum(steady_api["writes"].values()) / (t1 - t0),
            "api_reads_per_s": sum(steady_api["reads"].values()) / (t1 - t0),
            # The kills' window lasts as long as their answers take: its writes as counted,
            # and per kill less what the steady state's rate would have written meanwhile
            # (0 when that rate was no steady state: Kubeflow still creating Services).
            "api_writes_during_kills": sum(kills_api["writes"].values()), "kills_window_s": t2 - t1,
            "job_events_per_s": (events1 - events0) / (t1 - t0), "job_events_per_kill": (events2 - events1) / max(1, kills["kills"]),
            "api_writes_per_kill": max(0.0, sum(kills_api["writes"].values()) - sum(steady_api["writes"].values())
                                       * (t2 - t1) / (t1 - t0)) / max(1, kills["kills"]),
            **{f"node_to_{k}_p50_s": pct(v, 0.5) for k, v in nodes_lost["latencies"].items()},
            **{f"node_to_{k}_p99_s": pct(v, 0.99) for k, v in nodes_lost["latencies"].items()},
            **{f"node_to_{k}_unanswered": n for k, n in nodes_lost["missed"].items()},
            "node_kill_samples": len(nodes_lost["latencies"]["status"]),
            "object_bytes_max": max(s[0] for s in sizes), "status_bytes_max": max(s[1] for s in sizes),
        }
        if "event_to_action" in during:
            out["event_to_action_p50_s"] = quantile(during["event_to_action"], 0.5)
            out["event_to_action_p99_s"] = quantile(during["event_to_action"], 0.99)
            out["event_to_action_steady_p99_s"] = quantile(steady["event_to_action"], 0.99)
        for key, value in out.items():
            print(f"[{c.name}]   {key} = {value if not isinstance(value, float) else round(value, 4)}", flush=True)
        return out
    finally:
        stop.set()
        bed.down()


def main() -> None:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=None, help="jobs per controller (default 500, quick 30)")
    p.add_argument("--kills", type=int, default=None, help="worker pods failed per controller (default 40, quick 8)")
    p.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    p.add_argument("--kill-timeout", type=float, default=120.0, help="seconds a kill's answer is waited for")
    p.add_argument("--node-kills", type=int, default=None, help="nodes made NotReady per controller (default 3, quick 1)")
    p.add_argument("--node-kill-timeout", type=float, default=120.0, help="seconds a node kill's answers are waited for")
    p.add_argument("--steady", type=float, default=None, help="seconds of steady state measured (default 60, quick 20)")
    p.add_argument("--ramp-timeout", type=float, default=1200.0)
    p.add_argument("--no-peer", action="store_true", help="skip Kubeflow's training-operator")
    p.add_argument("--probe-pods-per-pass", default="",
                   help="comma-separated values of our LLMTRAIN_OPERATOR_PROBE_PODS_PER_PASS, one run of ours each on a "
                        "fresh bed (e.g. 0,64: every worker at every pass against the default cap); default: the operator's "
                        "default, one run")
    p.add_argument("--workers", type=int, default=2,
                   help="workers per job, 2..1024 (default 2: example 01's, elastic 1..2; any other number a fixed size)")
    args = p.parse_args()
    if not 2 <= args.workers <= 1024:
        p.error("--workers must be 2..1024")
    global WORKERS
    WORKERS = args.workers
    args.jobs = args.jobs or (30 if args.quick else 500)
    args.kills = args.kills or (8 if args.quick else 40)
    args.node_kills = (1 if args.quick else 3) if args.node_kills is None else args.node_kills
    if args.node_kills < 0:
        p.error("--node-kills must be 0 or more")
    args.steady = args.steady or (20.0 if args.quick else 60.0)
    logs = ROOT / ".cache" / "operator-scale"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    print(f"logs in {logs}", flush=True)
    caps = [int(v) for v in args.probe_pods_per_pass.split(",") if v.strip()]
    if any(v < 0 for v in caps):
        p.error("--probe-pods-per-pass values must be 0 or more")
    # The last value is the headline run; the others are run first, each on its own bed.
    others = {cap: measure(OURS, args, logs, cap) for cap in caps[:-1]}
    ours = measure(OURS, args, logs, caps[-1] if caps else None)
    peer = {} if args.no_peer else measure(KUBEFLOW, args, logs)

    def r(v: Any) -> Any:
        return round(v, 4) if isinstance(v, float) else ("na" if v is None else v)

    keys = ("kill_to_status_p50_s", "kill_to_status_p99_s", "kill_to_delete_p99_s", "kill_to_replacement_p99_s",
            "kill_to_status_unanswered", "node_to_status_p50_s", "node_to_status_p99_s", "node_to_replacement_p99_s",
            "node_to_status_unanswered", "node_to_replacement_unanswered", "node_kill_samples", "create_to_first_pod_p99_s",
            "all_running_s", "reconcile_p99_s", "queue_p99_s", "rss_mb", "cpu_cores", "api_writes_per_s", "api_reads_per_s",
            "api_writes_per_kill", "api_writes_during_kills", "kills_window_s", "job_events_per_s", "job_events_per_kill",
            "object_bytes_max",
            "status_bytes_max")
    compared = ("probe_requests_per_s", "reconcile_p50_s", "reconcile_p99_s", "cpu_cores", "kill_to_status_p50_s",
                "kill_to_status_p99_s", "event_to_action_p99_s")
    extra: dict[str, Any] = {}
    for cap, run in others.items():
        extra.update({f"cap{cap}_{k}": r(run.get(k)) for k in compared})
        extra.update({f"cap{cap}_over_ours_{k}": r(run[k] / ours[k]) for k in compared if run.get(k) and ours.get(k)})
    result(jobs=args.jobs, workers=args.workers, **{k: r(ours.get(k)) for k in keys},
           event_to_action_p99_s=r(ours.get("event_to_action_p99_s")),
           probe_requests_per_s=r(ours.get("probe_requests_per_s")), **extra,
           **{f"kubeflow_{k}": r(peer.get(k)) for k in keys if peer})


if __name__ == "__main__":
    main()
