"""The environment of every worker, built once for pods and for ``llmtrain run``.

The result is a list of Kubernetes ``EnvVar`` dicts: literal values, plus ``valueFrom``
references for what only the pod knows (its name, namespace and IP, from the downward
API) and what lives in a Secret (the S3 credentials). A pod manifest carries the list as
it is; the local runner resolves the references itself (``localrun/cluster.py``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from llmtrain_contract.names import Env

from ..api.job import LLMTrainJob
from .render import tiers_wire


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _secret(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


THREADS = "OMP_NUM_THREADS"
_CPU = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m?)$")


def cpus(quantity: int | str | None) -> float | None:
    """A CPU quantity in cores (``2``, ``1.5``, ``500m``); None for none or a form this
    does not read (an exponent)."""
    match = _CPU.match(str(quantity).strip()) if quantity is not None else None
    if match is None:
        return None
    return float(match.group(1)) / (1000 if match.group(2) else 1)


def threads_per_rank(job: LLMTrainJob) -> int | None:
    """Intra-op threads for each rank: the pod's CPUs (its limit, else its request) over
    its ranks, at least 1; None when the pod names no CPUs.

    torch otherwise starts one thread per CPU of the whole node (a pod's CPU quota is
    not its affinity), so ranks sharing a node oversubscribe its cores and spin against
    each other: two 1-CPU ranks on a 2-core node took 0.27 s a step instead of 0.095 s
    (docs/trainer.md, "Threads")."""
    res = job.spec.resources
    if res is None:
        return None
    cores = cpus((res.limits or {}).get("cpu"))
    if cores is None:
        cores = cpus((res.requests or {}).get("cpu"))
    return None if cores is None else max(1, math.floor(cores / job.spec.procs_per_node))


def worker_env(job: LLMTrainJob, paths: dict[str, str], run_dir: str) -> list[dict[str, Any]]:
    """``paths``: where each checkpoint tier lives for this worker (``render.tier_paths``
    in a pod; folders of the local run's workdir in ``llmtrain run``)."""
    spec = job.spec
    env: list[dict[str, Any]] = [
        _field(Env.POD_NAME, "metadata.name"),
        _field(Env.POD_NAMESPACE, "metadata.namespace"),
        _field(Env.POD_IP, "status.podIP"),
        {"name": Env.JOB, "value": job.metadata.name},
        {"name": Env.RUN_DIR, "value": run_dir},
        {"name": Env.HANG_TIMEOUT_SECONDS, "value": str(spec.fault_tolerance.hang_timeout_seconds)},
        {"name": Env.COLLECTIVE_TIMEOUT_SECONDS, "value": str(spec.fault_tolerance.collective_timeout_seconds)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if spec.trainer.builtin is None:
        # The script runner gives each local rank a file of its own; a script run
        # without it (``--no-python``) shares the pod's (docs/custom-scripts.md).
        env.append({"name": Env.PROGRESS_FILE, "value": f"{run_dir}/progress/pod"})
    if spec.checkpoint.enabled:
        env.append({"name": Env.CHECKPOINT_DIR, "value": paths["local"]})
        if "shared" in paths:
            env.append({"name": Env.SHARED_CHECKPOINT_DIR, "value": paths["shared"]})
        if spec.trainer.builtin is None:
            # The checkpoint API (docs/custom-scripts.md) builds the built-in trainer's tiers from these.
            env += [{"name": Env.CHECKPOINT_TIERS, "value": json.dumps(tiers_wire(job, paths), sort_keys=True)},
                    {"name": Env.JOB_UID, "value": job.metadata.uid or ""}]
    s3 = spec.checkpoint.s3
    if s3 is not None:
        ref = s3.credentials_secret
        env += [
            _secret(Env.AWS_ACCESS_KEY_ID, ref.name, ref.access_key_id_key),
            _secret(Env.AWS_SECRET_ACCESS_KEY, ref.name, ref.secret_access_key_key),
            {"name": Env.S3_URI, "value": paths["s3"]},
        ]
        if s3.endpoint:
            env.append({"name": Env.AWS_ENDPOINT_URL, "value": s3.endpoint})
    threads = threads_per_rank(job)
    if threads is not None and not any(var.name == THREADS for var in spec.env or []):  # the user's own wins
        env.append({"name": THREADS, "value": str(threads)})
    env += [var.to_wire() for var in spec.env or []]
    return env
