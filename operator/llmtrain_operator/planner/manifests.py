"""Manifest builders: pure functions from a job to the dicts of its children."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from llmtrain_contract.command import LAUNCHER, STORE, script_program, store_command, torchrun_args, trainer_program, worker_command
from llmtrain_contract.cadence import CADENCE_FILE
from llmtrain_contract.names import (CONFIG_HASH_ANNOTATION, GANG_MIN_AVAILABLE_ANNOTATION, HEALTH_PORT, RDZV_LEASE_PORT_OFFSET,
                                     RDZV_PORT, TERMINATION_LOG, Env)

from ..api.job import API_VERSION, KIND, LLMTrainJob
from ..api.spec import LLMTrainJobSpec
from ..api.observed import CADENCE_ANNOTATION, LABEL_JOB, LABEL_KEPT, LABEL_ROLE, ROLE_WORKER
from ..api.status import CadenceHistory
from ..settings import DEFAULT_RUNTIME_IMAGE
from . import names
from .environment import worker_env
from .isolation import NAMESPACE_LABEL, Isolation
from .render import config_text, content_hash, tier_paths, trainer_config
from .tokens import JobToken

GPU_RESOURCE = "nvidia.com/gpu"


def asks_for_gpus(spec: LLMTrainJobSpec) -> bool:
    """Whether the job's pods request or limit ``nvidia.com/gpu``."""
    res = spec.resources
    return bool(res and GPU_RESOURCE in {**(res.requests or {}), **(res.limits or {})})
TORCHRUN_MAX_RESTARTS = 1_000_000
"""torchrun restarts its worker group on every membership change and after a survivor's
collective fails; the *job-wide* budget is enforced by the operator, not by torchrun."""


TMP_VOLUME: dict[str, Any] = {"name": "tmp", "emptyDir": {}}
TMP_MOUNT: dict[str, Any] = {"name": "tmp", "mountPath": "/tmp"}
"""/tmp, writable under a read-only root: torchrun's log folders, the fork server's
socket, the hang watchdog's stack dumps, DeepSpeed's JIT-built ops."""
TORCH_EXTENSIONS_DIR = "/tmp/torch_extensions"
"""Where DeepSpeed builds its ops at first use when the root is read-only (the images put
them under the home folder, part of the root filesystem)."""

IMAGE_UID = 65532
"""The uid/gid the project's images run as (``Dockerfile``): the group of the pods'
volumes, so that a non-root trainer can write the tiers."""


def security_contexts(job: LLMTrainJob, read_only_root: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod, container) securityContext of the pods the operator creates: Pod Security
    "restricted" (non-root, RuntimeDefault seccomp, no privilege escalation, no
    capabilities). The image's own numeric USER runs; an image that would run as root is
    refused by the kubelet, and the job reports it (``policies/validity.py``).

    ``read_only_root``: the container's root filesystem is read-only, for the code of
    this project, which writes only to its volumes (``/tmp`` among them). A user's script
    may write anywhere (a model cache in its home, say), so its trainer container keeps a
    writable root unless the template says otherwise.

    A ``hostPath`` local tier cannot be restricted (not even "baseline" admits hostPath)
    and the kubelet creates its folder owned by root: such pods run as root, as they must
    to write there. ``podTemplate.spec.securityContext`` and the ``trainer`` container's
    ``securityContext`` in the template override these, for workers and the rendezvous
    store alike."""
    pod: dict[str, Any] = {"runAsNonRoot": True, "fsGroup": IMAGE_UID, "seccompProfile": {"type": "RuntimeDefault"}}
    container: dict[str, Any] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if read_only_root:
        container["readOnlyRootFilesystem"] = True
    if job.spec.checkpoint.enabled and job.spec.checkpoint.local.host_path:
        pod.update(runAsNonRoot=False, runAsUser=0)
    template = job.spec.pod_template.to_wire() if job.spec.pod_template is not None else {}
    spec = template.get("spec") or {}
    trainer: dict[str, Any] = next((c for c in spec.get("containers") or [] if c.get("name") == names.TRAINER_CONTAINER), {})
    return deep_merge(pod, spec.get("securityContext") or {}), deep_merge(container, trainer.get("securityContext") or {})


def owner_reference(job: LLMTrainJob) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.metadata.name,
        "uid": job.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(job: LLMTrainJob, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.metadata.namespace or "default",
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


TOKEN_KEY = "token"
"""The key of the job's token in its Secret."""


def token_secret(job: LLMTrainJob, token: JobToken) -> dict[str, Any]:
    """The job's token (``tokens.py``), for its store's and workers' environment. Immutable:
    nobody changes it under running pods; the garbage collector removes it with the job."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(job, token.secret, names.job_labels(job.metadata.name)),
        "type": "Opaque",
        "immutable": True,
        "stringData": {TOKEN_KEY: token.value},
    }


def token_env(token: JobToken) -> dict[str, Any]:
    """The token as the pods read it: from the job's Secret, which the operator creates in
    every pass that creates a pod, before the pod (``handlers/executor.py``)."""
    return {"name": Env.RDZV_TOKEN, "valueFrom": {"secretKeyRef": {"name": token.secret, "key": TOKEN_KEY}}}


def headless_service(job: LLMTrainJob, name: str, selector: dict[str, str], ports: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, name, names.job_labels(job.metadata.name)),
        "spec": {
            "clusterIP": "None",
            # Workers must resolve each other while still starting (before Ready).
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": n, "port": p, "targetPort": p} for n, p in ports],
        },
    }


def workers_service(job: LLMTrainJob) -> dict[str, Any]:
    selector = {**names.job_labels(job.metadata.name), LABEL_ROLE: ROLE_WORKER}
    return headless_service(job, names.workers_service(job.metadata.name), selector, [("metrics", job.spec.metrics.port)])


def store_service(job: LLMTrainJob) -> dict[str, Any]:
    return headless_service(job, names.store_service(job.metadata.name), names.store_labels(job.metadata.name),
                            [("rdzv", RDZV_PORT), ("rdzv-leases", RDZV_PORT + RDZV_LEASE_PORT_OFFSET)])


def network_policy(job: LLMTrainJob, isolation: Isolation) -> dict[str, Any]:
    """Ingress to every pod of the job (workers and store) from the job's own pods on every
    port (the store and lease ports, rank 0's process-group store, the collectives' ports,
    which gloo and NCCL choose at random), and on the launcher's health port and the
    trainer's metrics port from the operator's pods and the ``metrics_from`` namespaces
    (``isolation.py``). Egress is left open: the tiers (S3, a filesystem's servers) and
    DNS are wherever the cluster has them. The kubelet's probes come from the pod's own
    node, which NetworkPolicy always admits."""
    job_pods = {"matchLabels": {LABEL_JOB: job.metadata.name}}
    readers: list[dict[str, Any]] = [{
        "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: isolation.operator_namespace}},
        "podSelector": {"matchLabels": dict(isolation.operator_labels)},
    }]
    readers += isolation.metrics_peers()
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(job, names.network_policy(job.metadata.name), names.job_labels(job.metadata.name)),
        "spec": {
            "podSelector": job_pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": job_pods}]},
                {"from": readers, "ports": [{"protocol": "TCP", "port": HEALTH_PORT},
                                            {"protocol": "TCP", "port": job.spec.metrics.port}]},
            ],
        },
    }


def config_map(job: LLMTrainJob, history: CadenceHistory | None = None) -> dict[str, Any] | None:
    """The rendered trainer config, and (``intervalSteps: auto``) the job's failure history
    as ``cadence.json``; None for a user script (it has no config file). The kubelet
    refreshes a mounted ConfigMap in running pods, so the trainers see a new history
    without a restart (the config itself is read once, at start)."""
    if job.spec.trainer.builtin is None:
        return None
    text = config_text(trainer_config(job))
    annotations = {CONFIG_HASH_ANNOTATION: content_hash(text)}
    data = {names.CONFIG_FILE: text}
    if history is not None:
        data[CADENCE_FILE] = json.dumps(history.to_wire(), sort_keys=True)
        annotations[CADENCE_ANNOTATION] = str(history.failures)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, names.config_map(job.metadata.name), names.job_labels(job.metadata.name), annotations),
        "data": data,
    }


def uses_runtime_bundle(job: LLMTrainJob) -> bool:
    """A user's script runs in the user's image, which need not have this project: its
    pods run the launcher and the store from an init container's copy."""
    return job.spec.trainer.builtin is None


def runtime_bundle(job: LLMTrainJob, runtime_image: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(init container, volume, mount): ``python -m llmtrain_trainer.launch.bundle`` run in the
    runtime image copies what the pod runs of this project into an emptyDir."""
    _, container_security = security_contexts(job, read_only_root=True)
    mount = {"name": names.RUNTIME_VOLUME, "mountPath": names.RUNTIME_MOUNT}
    init = {
        "name": names.RUNTIME_INIT_CONTAINER,
        "image": runtime_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [names.PYTHON, "-m", "llmtrain_trainer.launch.bundle", names.RUNTIME_MOUNT],
        "volumeMounts": [mount],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": container_security,
    }
    return init, {"name": names.RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}, mount


def _entry(filename: str) -> tuple[str, ...]:
    """How a pod runs a bundled entry point: the copy's path, run by the image's Python."""
    return (f"{names.RUNTIME_MOUNT}/{filename}",)


def _rdzv_id(job: LLMTrainJob) -> str:
    """torchrun's ``--rdzv-id``, and the only rendezvous the job's store holds leases for."""
    return job.metadata.uid or job.metadata.name


def store_pod(job: LLMTrainJob, runtime_image: str = DEFAULT_RUNTIME_IMAGE, token: JobToken | None = None) -> dict[str, Any]:
    """``token``: the job's, which the pod reads from its Secret (``token_env``)."""
    job_name = job.metadata.name
    pod_security, container_security = security_contexts(job, read_only_root=True)
    container: dict[str, Any] = {
        "name": "rendezvous",
        "image": job.spec.image,
        "imagePullPolicy": job.spec.image_pull_policy,
        "command": store_command(names.PYTHON, RDZV_PORT, entry=STORE, run_id=_rdzv_id(job)),
        "ports": [{"name": "rdzv", "containerPort": RDZV_PORT},
                  {"name": "rdzv-leases", "containerPort": RDZV_PORT + RDZV_LEASE_PORT_OFFSET}],
        # A limit: the store's memory is bounded by the job's agents, and an unbounded pod
        # on a shared node is every tenant's risk.
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": container_security,
        "volumeMounts": [dict(TMP_MOUNT)],
    }
    if token is not None:
        container["env"] = [token_env(token)]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(job, names.store_pod(job_name), names.store_labels(job_name)),
        "spec": {
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,  # the store never calls the API server
            "securityContext": pod_security,
            "containers": [container],
            "volumes": [copy.deepcopy(TMP_VOLUME)],
        },
    }
    if uses_runtime_bundle(job):
        init, volume, mount = runtime_bundle(job, runtime_image)
        container["command"] = store_command(names.PYTHON, RDZV_PORT, entry=_entry("rdzv_store.py"), run_id=_rdzv_id(job))
        container["volumeMounts"].append(mount)
        pod["spec"]["initContainers"] = [init]
        pod["spec"]["volumes"].append(volume)
    sched = job.spec.scheduling
    if sched is not None:
        if sched.tolerations:
            pod["spec"]["tolerations"] = [t.to_wire() for t in sched.tolerations]
        if sched.priority_class_name:
            pod["spec"]["priorityClassName"] = sched.priority_class_name
    return pod


def _resources(job: LLMTrainJob) -> dict[str, Any]:
    res = job.spec.resources
    if res is None:
        return {}
    out: dict[str, Any] = {}
    if res.requests:
        out["requests"] = {k: str(v) for k, v in res.requests.items()}
    if res.limits:
        out["limits"] = {k: str(v) for k, v in res.limits.items()}
        # Extended resources must be requested too; copy the GPU limit if it is not.
        if GPU_RESOURCE in res.limits:
            out.setdefault("requests", {}).setdefault(GPU_RESOURCE, str(res.limits[GPU_RESOURCE]))
    return out


def _volumes(job: LLMTrainJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = job.spec
    volumes: list[dict[str, Any]] = [
        {"name": "run", "emptyDir": {}},
        # PyTorch workers exchange tensors through /dev/shm; the runtime default is 64 MiB.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        copy.deepcopy(TMP_VOLUME),
    ]
    mounts: list[dict[str, Any]] = [{"name": "run", "mountPath": names.RUN_DIR}, {"name": "dshm", "mountPath": "/dev/shm"},
                                    dict(TMP_MOUNT)]
    if spec.trainer.builtin is not None:
        volumes.append({"name": "config", "configMap": {"name": names.config_map(job.metadata.name)}})
        mounts.append({"name": "config", "mountPath": names.CONFIG_MOUNT, "readOnly": True})
    ckpt = spec.checkpoint
    if ckpt.enabled:
        ns = job.metadata.namespace or "default"
        if ckpt.local.host_path:
            local = {"hostPath": {"path": f"{ckpt.local.host_path.rstrip('/')}/{ns}/{job.metadata.name}", "type": "DirectoryOrCreate"}}
        else:
            local = {"emptyDir": {"sizeLimit": str(ckpt.local.size_limit)} if ckpt.local.size_limit else {}}
        volumes.append({"name": "ckpt-local", **local})
        mounts.append({"name": "ckpt-local", "mountPath": names.LOCAL_TIER_MOUNT})
        if ckpt.shared is not None:
            volumes.append({"name": "ckpt-shared", "persistentVolumeClaim": {"claimName": ckpt.shared.claim_name}})
            mounts.append({"name": "ckpt-shared", "mountPath": names.SHARED_TIER_MOUNT,
                           "subPath": ckpt.shared.sub_path or names.shared_sub_path(job.metadata.name, ns)})
    return volumes, mounts


def _command(job: LLMTrainJob) -> list[str]:
    spec = job.spec
    ns = job.metadata.namespace or "default"
    flags = torchrun_args(
        nnodes_min=spec.replicas.min, nnodes_max=spec.replicas.max, nproc_per_node=spec.procs_per_node,
        rdzv_endpoint=names.rdzv_endpoint(job.metadata.name, ns), rdzv_id=_rdzv_id(job),
        max_restarts=TORCHRUN_MAX_RESTARTS,
    )
    flags.append("--local-addr=$(POD_IP)")  # peers reach rank 0's store at the pod IP
    if not uses_runtime_bundle(job):
        program = trainer_program(f"{names.CONFIG_MOUNT}/{names.CONFIG_FILE}")
        return worker_command(names.PYTHON, names.RUN_DIR, flags, program, TERMINATION_LOG, HEALTH_PORT, entry=LAUNCHER)
    program = script_program(spec.trainer.command or [], spec.trainer.args, runner=_entry("script.py"))
    return worker_command(names.PYTHON, names.RUN_DIR, flags, program, TERMINATION_LOG, HEALTH_PORT, entry=_entry("launcher.py"))


MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "imagePullSecrets": "name", "volumeMounts": "mountPath", "ports": "containerPort"}
"""Lists merged item by item on this key, as kubectl's strategic merge does for a Pod; a
template adding a volume or a mount keeps the operator's own (config, run dir, tiers)."""


def deep_merge(base: Any, override: Any) -> Any:
    """Maps merge recursively; lists in ``MERGE_KEYS`` merge by their key; other lists
    are replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            merge_key = MERGE_KEYS.get(key)
            if merge_key and isinstance(value, list) and isinstance(out.get(key), list):
                merged = {item.get(merge_key): item for item in out[key]}
                order = [item.get(merge_key) for item in out[key]]
                for item in value:
                    ident = item.get(merge_key)
                    merged[ident] = deep_merge(merged.get(ident, {}), item)
                    if ident not in order:
                        order.append(ident)
                out[key] = [merged[i] for i in order]
            else:
                out[key] = deep_merge(out.get(key), value)
        return out
    return copy.deepcopy(override)


LIVENESS_PERIOD_SECONDS = 2
LIVENESS_KILL_GRACE_SECONDS = 5
LIVENESS_MARGIN_SECONDS = 20
"""How much longer than ``hangTimeoutSeconds`` a frozen launcher answers no liveness probe
before the kubelet kills its container: the second line. A pod frozen whole is replaced
first on its peers' reports (``policies/frozen_pods.py``, about the timeout plus a few
seconds); the margin keeps the two from racing."""


def liveness_probe(job: LLMTrainJob) -> dict[str, Any]:
    """The launcher's /healthz, failing for ``hangTimeoutSeconds`` and a margin: a frozen
    launcher (alone or with its whole pod) is something no process in the pod can report,
    so the kubelet kills the container and the pod fails (when the pod has peers, their
    reports replace it sooner: ``policies/frozen_pods.py``). It answers through in-place restarts and
    rendezvous waits, which the rank-served readiness probe does not."""
    hang = job.spec.fault_tolerance.hang_timeout_seconds
    return {
        "httpGet": {"path": "/healthz", "port": HEALTH_PORT},
        "periodSeconds": LIVENESS_PERIOD_SECONDS,
        "timeoutSeconds": 2,
        "failureThreshold": max(3, -(-(hang + LIVENESS_MARGIN_SECONDS) // LIVENESS_PERIOD_SECONDS)),
        # A frozen process ignores SIGTERM: don't wait the pod's whole checkpoint budget.
        "terminationGracePeriodSeconds": LIVENESS_KILL_GRACE_SECONDS,
    }


def readiness_probe(job: LLMTrainJob) -> dict[str, Any]:
    """The built-in trainer is ready once it joined the group and serves its metrics; a
    user's script serves nothing of ours, so its pod is ready while torchrun's workers
    run (the launcher's ``/readyz``)."""
    if uses_runtime_bundle(job):
        return {"httpGet": {"path": "/readyz", "port": HEALTH_PORT}, "periodSeconds": 2}
    return {"httpGet": {"path": "/metrics", "port": job.spec.metrics.port}, "periodSeconds": 2}


GANG_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""Volcano's: the PodGroup a pod belongs to."""
GANG_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""scheduler-plugins' coscheduling's."""


def kept_pod_patch(uid: str = "") -> dict[str, Any]:
    """The JSON merge patch that keeps an ended worker pod for its log (``KeepPod``): the
    kept label, and out of its gang (a scheduler counting the group's pods must not count
    it). With ``uid``, a precondition: another pod of that name is refused (409)."""
    meta: dict[str, Any] = {"labels": {LABEL_KEPT: "true", GANG_GROUP_LABEL: None},
                            "annotations": {GANG_GROUP_ANNOTATION: None, GANG_MIN_AVAILABLE_ANNOTATION: None}}
    if uid:
        meta["uid"] = uid
    return {"metadata": meta}


def worker_pod(job: LLMTrainJob, slot: int, generation: int, avoid_nodes: Sequence[str] = (),
               runtime_image: str = DEFAULT_RUNTIME_IMAGE, incarnation: int = 0, joining: bool = False,
               token: JobToken | None = None) -> dict[str, Any]:
    """``incarnation``: which of the slot's pods this is (``Observed.next_incarnation``):
    its name and label; the host name is the slot's, whichever pod holds it. ``joining``:
    the job has trained already, so this pod joins it (a replacement, a scale-up): its
    launcher checks its node's network first (``preflightMinMbps``); a job's first pods
    skip it, as their store starts with them and a thousand checks at once would only
    measure the store. ``token``: the job's, which the pod reads from its Secret
    (``token_env``)."""
    spec = job.spec
    job_name = job.metadata.name
    volumes, mounts = _volumes(job)
    init_containers = []
    if uses_runtime_bundle(job):
        init, volume, mount = runtime_bundle(job, runtime_image)
        init_containers.append(init)
        volumes.append(volume)
        mounts.append(mount)
    ports = [{"name": f"metrics-{r}" if r else "metrics", "containerPort": spec.metrics.port + r} for r in range(spec.procs_per_node)]
    ports.append({"name": "health", "containerPort": HEALTH_PORT})
    pod_security, container_security = security_contexts(job, read_only_root=spec.trainer.builtin is not None)
    env = worker_env(job, tier_paths(job), names.RUN_DIR)
    if token is not None:
        env.insert(0, token_env(token))
    if joining and spec.fault_tolerance.preflight_min_mbps > 0:
        env.append({"name": Env.PREFLIGHT_MIN_MBPS, "value": f"{spec.fault_tolerance.preflight_min_mbps:g}"})
    if container_security.get("readOnlyRootFilesystem") and spec.trainer.builtin is not None \
            and spec.trainer.builtin.strategy.kind == "deepspeed" and all(e["name"] != "TORCH_EXTENSIONS_DIR" for e in env):
        env.append({"name": "TORCH_EXTENSIONS_DIR", "value": TORCH_EXTENSIONS_DIR})
    container: dict[str, Any] = {
        "name": names.TRAINER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": _command(job),
        "env": env,
        "ports": ports,
        "volumeMounts": mounts,
        "resources": _resources(job),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "readinessProbe": readiness_probe(job),
        "livenessProbe": liveness_probe(job),
        "securityContext": container_security,
    }
    # Prometheus' kubernetes_sd convention: scrape local rank 0's trainer endpoint.
    annotations: dict[str, str] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.metrics.port)}
    labels = names.worker_labels(job_name, slot, generation, incarnation)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator (and torchrun inside) decide restarts
        "hostname": names.worker_host(job_name, slot),
        "subdomain": names.workers_service(job_name),
        "terminationGracePeriodSeconds": spec.checkpoint.sigterm_budget_seconds + 15,
        # Nothing in a worker calls the API server: no token for a compromised rank to use.
        "automountServiceAccountToken": False,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": volumes,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    sched = spec.scheduling
    affinity: dict[str, Any] = copy.deepcopy(sched.affinity) if sched and sched.affinity else {}
    if sched is not None:
        if sched.node_selector:
            pod_spec["nodeSelector"] = dict(sched.node_selector)
        if sched.tolerations:
            pod_spec["tolerations"] = [t.to_wire() for t in sched.tolerations]
        if sched.priority_class_name:
            pod_spec["priorityClassName"] = sched.priority_class_name
        if sched.scheduler_name:
            pod_spec["schedulerName"] = sched.scheduler_name
        if sched.gang is not None:
            # Hints understood by Volcano and by scheduler-plugins' coscheduling.
            annotations[GANG_GROUP_ANNOTATION] = job_name
            labels[GANG_GROUP_LABEL] = job_name
            annotations[GANG_MIN_AVAILABLE_ANNOTATION] = str(sched.gang.min_available)
    if avoid_nodes:
        term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": sorted(avoid_nodes)}]}
        required = affinity.setdefault("nodeAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = required.setdefault("nodeSelectorTerms", [])
        if terms:
            for existing in terms:
                existing.setdefault("matchExpressions", []).extend(copy.deepcopy(term["matchExpressions"]))
        else:
            terms.append(term)
    if affinity:
        pod_spec["affinity"] = affinity
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(job, names.worker_pod(job_name, slot, incarnation), labels, annotations),
        "spec": pod_spec,
    }
    if spec.pod_template is not None:
        owned = copy.deepcopy(pod)
        pod = deep_merge(pod, spec.pod_template.to_wire())
        # Operator-owned fields win over the template.
        pod["metadata"]["name"] = owned["metadata"]["name"]
        pod["metadata"]["labels"] = {**pod["metadata"].get("labels", {}), **owned["metadata"]["labels"]}
        pod["metadata"]["ownerReferences"] = owned["metadata"]["ownerReferences"]
        trainer = next(c for c in pod["spec"]["containers"] if c["name"] == names.TRAINER_CONTAINER)
        trainer["command"] = container["command"]
        owned_env = {e["name"] for e in container["env"]}
        trainer["env"] = container["env"] + [e for e in trainer.get("env", []) if e["name"] not in owned_env]
        pod["spec"]["restartPolicy"] = "Never"
        template_spec = spec.pod_template.to_wire().get("spec") or {}
        if template_spec.get("serviceAccountName") and "automountServiceAccountToken" not in template_spec:
            # A template that names its own service account means to use it: its token
            # mounts as that account (or its Secret) says, not as our default.
            pod["spec"].pop("automountServiceAccountToken", None)
    return pod
