"""A one-job stand-in for the cluster: worker "pods" are local process trees.

The planner's actions are applied to processes: creating a worker pod starts
``launcher -> torchrun -> trainer`` for that slot; deleting it sends SIGTERM (or
SIGKILL when forced) to its process group. Observations are built back from the
processes (exit codes, the launcher's termination message) and the trainers' metrics
endpoints, as the operator builds them from the API.

Each slot is its own "node": its own run dir and node-local checkpoint tier, so a
replacement starts with an empty local disk exactly like a new pod on a new node.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, UTC
from pathlib import Path
from typing import Any

from llmtrain_contract.command import script_program, store_command, torchrun_args, trainer_program, worker_command
from llmtrain_contract.cadence import CADENCE_FILE
from llmtrain_contract.names import RDZV_LEASE_PORT_OFFSET, Env
from llmtrain_contract.ports import free_ports

from ..api.job import LLMTrainJob
from ..api.observed import (
    LABEL_GENERATION, LABEL_INCARNATION, LABEL_ROLE, LABEL_SLOT, ROLE_STORE, ROLE_WORKER, ConfigMapView, NodeView, Observed, PodView,
    TrainerProbe,
)
from ..api.vocabulary import PodPhase
from ..planner import CreateObject, DeleteJob, DeletePod, KeepPod, ReplaceObject
from ..planner.environment import worker_env
from ..planner.manifests import TORCHRUN_MAX_RESTARTS
from ..planner.render import config_text, tier_paths, trainer_config
from ..probe import combine, memory_of, peer_waits_of, scrape, scrape_launcher, trainer_url
from ..silence import Silences

PY = sys.executable


def resolve_env(entries: list[dict[str, Any]], fields: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Kubernetes EnvVars to a process environment: downward-API fields from ``fields``;
    a Secret or ConfigMap reference from this process's own environment when it has the
    variable (e.g. exported AWS credentials), else skipped. Returns (env, skipped)."""
    env: dict[str, str] = {}
    skipped: list[str] = []
    for entry in entries:
        name, source = entry["name"], entry.get("valueFrom")
        if source is None:
            env[name] = str(entry.get("value", ""))
        elif "fieldRef" in source and source["fieldRef"].get("fieldPath") in fields:
            env[name] = fields[source["fieldRef"]["fieldPath"]]
        elif name in os.environ:
            env[name] = os.environ[name]
        else:
            skipped.append(name)
    return env, skipped


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), deepest first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        out.append(child)
        stack.extend(children.get(child, []))
    return out[::-1]


@dataclass
class LocalPod:
    name: str
    role: str
    slot: int | None
    generation: int
    proc: subprocess.Popen
    created: datetime
    folder: Path
    deleting: bool = False
    kill_at: float | None = None
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    health_port: int | None = None
    """The launcher's /healthz and /metrics (its failed attempts), on loopback."""
    incarnation: int = 0
    kept: PodView | None = None
    """Its view when the planner kept it for its log (``KeepPod``): the slot's folder is
    the next pod's now, the log (``<name>.log``) stays this pod's."""

    def view(self) -> PodView:
        if self.kept is not None:
            return replace(self.kept, deleting=self.deleting)
        code = self.proc.poll()
        termination: dict[str, Any] = {}
        term = self.folder / "termination-log"
        if code is not None and term.exists():
            try:
                termination = json.loads(term.read_text())
            except ValueError:
                termination = {}
        exit_code = None if code is None else (128 - code if code < 0 else code)
        phase = PodPhase.RUNNING if code is None else (PodPhase.SUCCEEDED if code == 0 else PodPhase.FAILED)
        return PodView(
            name=self.name, role=self.role, slot=self.slot, generation=self.generation, phase=phase, uid=self.uid,
            node=f"local-{self.slot}" if self.slot is not None else "local", ready=False, deleting=self.deleting,
            created=self.created, exit_code=exit_code, reason="Error" if code else None, termination=termination,
            incarnation=self.incarnation,
        )


@dataclass
class LocalCluster:
    job: LLMTrainJob
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    pods: dict[str, LocalPod] = field(default_factory=dict)
    objects: set[str] = field(default_factory=set)
    store_port: int | None = None
    warnings: list[str] = field(default_factory=list)
    configmap: dict[str, Any] | None = None
    """The job's ConfigMap as last created or replaced."""
    silences: Silences = field(default_factory=Silences)
    """Each running "node"'s launcher's unanswered probes in a row (a frozen one is replaced
    on its peers' reports, as in a cluster: ``policies/frozen_pods.py``)."""
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    """The run's token, in the store's and every worker's environment as a job's Secret
    puts it in its pods (``planner/tokens.py``): the rendezvous is signed here too."""

    # ------------------------------------------------------------------ paths

    def slot_dir(self, slot: int) -> Path:
        return self.workdir / f"node-{slot}"

    def _tier_paths(self, slot: int) -> dict[str, str]:
        paths = {"local": str(self.slot_dir(slot) / "ckpt")}
        if self.job.spec.checkpoint.shared is not None:
            paths["shared"] = str(self.workdir / "shared")
        if self.job.spec.checkpoint.s3 is not None:
            paths["s3"] = tier_paths(self.job)["s3"]  # S3 is S3 wherever the job runs
        return paths

    # ------------------------------------------------------------------ apply

    def apply(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, (CreateObject, ReplaceObject)) and action.manifest["kind"] == "ConfigMap":
                self._share_config(action.manifest)
            if isinstance(action, CreateObject):
                manifest = action.manifest
                if manifest["kind"] != "Pod":
                    self.objects.add(f"{manifest['kind']}/{manifest['metadata']['name']}")
                elif manifest["metadata"]["labels"].get(LABEL_ROLE) == ROLE_STORE:
                    self._start_store(manifest["metadata"]["name"])
                else:
                    labels = manifest["metadata"]["labels"]
                    self._start_worker(manifest["metadata"]["name"], int(labels[LABEL_SLOT]), int(labels[LABEL_GENERATION]),
                                       int(labels.get(LABEL_INCARNATION, "0")))
            elif isinstance(action, DeletePod):
                self.delete(action.name, force=action.force)
            elif isinstance(action, KeepPod):
                self.keep(action.name)
            elif isinstance(action, (ReplaceObject, DeleteJob)):
                pass  # configs are rendered per process start; the job itself lives in memory

    def _share_config(self, manifest: dict[str, Any]) -> None:
        """What the kubelet does with a mounted ConfigMap: the failure history
        (``cadence.json``) reaches every running node; the trainer config itself is
        rendered per process start."""
        self.configmap = manifest
        text = manifest.get("data", {}).get(CADENCE_FILE)
        if text is None:
            return
        for folder in self.workdir.glob("node-*"):
            self._write_cadence(folder, text)

    @staticmethod
    def _write_cadence(folder: Path, text: str) -> None:
        tmp = folder / f".{CADENCE_FILE}.tmp"
        tmp.write_text(text)
        tmp.replace(folder / CADENCE_FILE)

    def _spawn(self, name: str, role: str, slot: int | None, generation: int, cmd: list[str], env: dict[str, str],
               health_port: int | None = None) -> None:
        folder = self.slot_dir(slot) if slot is not None else self.workdir / "store"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "termination-log").unlink(missing_ok=True)
        log = (self.workdir / f"{name}.log").open("a")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}, start_new_session=True)
        log.close()
        self.pods[name] = LocalPod(name, role, slot, generation, proc, datetime.now(UTC), folder, health_port=health_port)

    def _start_store(self, name: str) -> None:
        self.store_port = free_ports(1 + RDZV_LEASE_PORT_OFFSET)  # the store's and its leases'
        self._spawn(name, ROLE_STORE, None, 0, store_command(PY, self.store_port, "127.0.0.1"), {Env.RDZV_TOKEN: self.token})

    def _start_worker(self, name: str, slot: int, generation: int, incarnation: int = 0) -> None:
        spec = self.job.spec
        folder = self.slot_dir(slot)
        run_dir = folder / "run"
        for stale in run_dir.glob("metrics-local-rank-*.json"):
            stale.unlink()  # a previous process's port must not make the new one look ready
        # A new pod's run dir is a fresh emptyDir: the exit records of the slot's earlier
        # pod must not be read as this one's failed attempts.
        shutil.rmtree(run_dir / "exit", ignore_errors=True)
        shutil.rmtree(run_dir / "progress", ignore_errors=True)
        flags = torchrun_args(
            nnodes_min=spec.replicas.min, nnodes_max=spec.replicas.max, nproc_per_node=spec.procs_per_node,
            rdzv_endpoint=f"127.0.0.1:{self.store_port}", rdzv_id=self.job.metadata.name,
            max_restarts=TORCHRUN_MAX_RESTARTS, join_timeout_seconds=300, last_call_seconds=1,
        )
        if spec.trainer.builtin is not None:
            cfg = trainer_config(self.job, self._tier_paths(slot), run_dir=str(run_dir), metrics_host="127.0.0.1")
            cfg.metrics.port = 0  # every local "node" shares one host: pick free ports
            config = folder / "config.yaml"
            folder.mkdir(parents=True, exist_ok=True)
            config.write_text(config_text(cfg))
            cadence = (self.configmap or {}).get("data", {}).get(CADENCE_FILE)
            if cadence is not None:
                self._write_cadence(folder, cadence)
            program = trainer_program(str(config))
        else:
            program = script_program(spec.trainer.command or [], spec.trainer.args)
        # The launcher serves its failed attempts, as in a pod: the planner charges an
        # in-place restart from its count, before the restarted trainer is up.
        health_port = free_ports()
        cmd = worker_command(PY, str(run_dir), flags, program, str(folder / "termination-log"), health_port, "127.0.0.1")
        self._spawn(name, ROLE_WORKER, slot, generation, cmd, self.worker_environment(name, slot), health_port)
        self.pods[name].incarnation = incarnation

    def worker_environment(self, name: str, slot: int) -> dict[str, str]:
        """The pod's environment (``planner.environment.worker_env``, the same function
        the pod manifests use), its references resolved as the kubelet would, plus the
        local run's own (where fired test faults are remembered, ``--inject``)."""
        entries = worker_env(self.job, self._tier_paths(slot), str(self.slot_dir(slot) / "run"))
        fields = {"metadata.name": name, "metadata.namespace": self.job.metadata.namespace or "default", "status.podIP": "127.0.0.1"}
        env, skipped = resolve_env(entries, fields)
        for var in skipped:
            note = f"{var} is not set: llmtrain run has no Secrets or ConfigMaps; export it to pass it on"
            if note not in self.warnings:
                self.warnings.append(note)
        return {**env, Env.RDZV_TOKEN: self.token, Env.FAULT_STATE_DIR: str(self.workdir / "faults"), **self.env}

    def delete(self, name: str, force: bool = False) -> None:
        pod = self.pods.get(name)
        if pod is None or pod.deleting:
            return
        pod.deleting = True
        if pod.proc.poll() is None:
            self._signal(pod, signal.SIGKILL if force else signal.SIGTERM)
            grace = 0 if force else self.job.spec.checkpoint.sigterm_budget_seconds + 15
            pod.kill_at = time.monotonic() + grace

    def keep(self, name: str) -> None:
        """A failed pod kept for its log: its processes have ended (only an ended pod is
        kept); what the planner saw of it stays, and its log file with it."""
        pod = self.pods.get(name)
        if pod is None or pod.kept is not None or pod.proc.poll() is None:
            return
        pod.kept = replace(pod.view(), kept=True)

    def kill_node(self, slot: int, freeze: bool = False) -> str | None:
        """Fault injection: the node dies with everything on it (SIGKILL, no grace), or with
        ``freeze`` every process on it stops (SIGSTOP), as when a node's kernel stalls."""
        for pod in self.pods.values():
            if pod.slot == slot and pod.proc.poll() is None and not pod.deleting:
                self._signal(pod, signal.SIGSTOP if freeze else signal.SIGKILL)
                return pod.name
        return None

    @staticmethod
    def _signal(pod: LocalPod, sig: int) -> None:
        """SIGTERM goes to the pod's first process only (the launcher forwards it, as
        PID 1 of a container would). SIGKILL and SIGSTOP take the whole tree: torchrun starts
        its workers in sessions of their own, so a process-group kill would miss them."""
        whole = sig in (signal.SIGKILL, signal.SIGSTOP)
        targets = [*descendants(pod.proc.pid), pod.proc.pid] if whole else [pod.proc.pid]
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ observe

    def observe(self) -> Observed:
        for name, pod in list(self.pods.items()):
            if pod.deleting:
                if pod.proc.poll() is None and pod.kill_at is not None and time.monotonic() > pod.kill_at:
                    self._signal(pod, signal.SIGKILL)
                if pod.proc.poll() is not None:
                    del self.pods[name]  # the pod object is gone once its processes are
        views, trainers, launchers = [], {}, {}
        for pod in self.pods.values():
            view = pod.view()
            if pod.role == ROLE_WORKER and view.phase == PodPhase.RUNNING:
                probe = self._probe(pod)
                if probe is not None:
                    trainers[pod.name] = probe
                report = scrape_launcher(f"http://127.0.0.1:{pod.health_port}/metrics", timeout=1.0) if pod.health_port else None
                if report is not None:
                    launchers[pod.name] = report
                # Ready as the pod's readiness probe has it (manifests.readiness_probe): the
                # trainer's metrics answer, or for a user's script, its workers run.
                script = self.job.spec.trainer.builtin is None
                if (report is not None and report.workers_running) if script else probe is not None:
                    view = PodView(**{**view.__dict__, "ready": True})
            views.append(view)
        nodes = {f"local-{s}": NodeView(f"local-{s}", "True", None) for s in range(self.job.spec.replicas.max)}
        # The store's own "node": a store on a missing Node counts as lost and is recreated.
        nodes["local"] = NodeView("local", "True", None)
        services = frozenset(o.split("/", 1)[1] for o in self.objects if o.startswith("Service/"))
        configmaps = {o.split("/", 1)[1]: ConfigMapView.from_annotations(self.configmap["metadata"].get("annotations"))
                      for o in self.objects if o.startswith("ConfigMap/") and self.configmap is not None}
        probes, attempts, rejected = combine(trainers, launchers)
        running = [v for v in views if v.role == ROLE_WORKER and v.phase == PodPhase.RUNNING and self.pods[v.name].health_port]
        return Observed(pods=tuple(views), nodes=nodes, services=services, configmaps=configmaps, probes=probes,
                        launcher_attempts=attempts, launcher_memory=memory_of(launchers), peer_waits=peer_waits_of(launchers),
                        silent=self.silences.track(self.job.metadata.name, running, launchers), rejected_values=rejected)

    def _probe(self, pod: LocalPod) -> TrainerProbe | None:
        info = pod.folder / "run" / "metrics-local-rank-0.json"
        try:
            endpoint = json.loads(info.read_text())
        except (OSError, ValueError):
            return None
        return scrape(trainer_url(endpoint["host"], endpoint["port"]), timeout=1.0)

    def shutdown(self) -> None:
        for pod in self.pods.values():
            if pod.proc.poll() is None:
                self._signal(pod, signal.SIGKILL)
        for pod in self.pods.values():
            try:
                pod.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
