"""Names, labels and paths of a job's children. Pure and stable: a restarted operator
derives the same names, so it adopts what it created before."""

from __future__ import annotations

from llmtrain_contract.names import RDZV_PORT

from ..api.observed import LABEL_GENERATION, LABEL_INCARNATION, LABEL_JOB, LABEL_KEPT, LABEL_ROLE, LABEL_SLOT, ROLE_STORE, ROLE_WORKER

CONFIG_MOUNT = "/etc/llmtrain"
CONFIG_FILE = "config.yaml"
RUN_DIR = "/run/llmtrain"
LOCAL_TIER_MOUNT = "/ckpt/local"
SHARED_TIER_MOUNT = "/ckpt/shared"
PYTHON = "python"
"""The interpreter inside the trainer image (the image puts the venv first on PATH)."""
RUNTIME_MOUNT = "/opt/llmtrain"
"""Where a ``trainer.command`` pod's init container copies the launcher, the script runner
and the store (``llmtrain_trainer.launch.bundle``), for a user image without this project."""
RUNTIME_VOLUME = "llmtrain-runtime"
RUNTIME_INIT_CONTAINER = "llmtrain-runtime"


def worker_pod(job: str, slot: int, incarnation: int = 0) -> str:
    """A slot's first pod is ``<job>-worker-<slot>``; each replacement gets a name of its
    own (``-<incarnation>``), so a failed pod can be kept with its log beside it."""
    return f"{job}-worker-{slot}" + (f"-{incarnation}" if incarnation else "")


def worker_host(job: str, slot: int) -> str:
    """The slot's host name, the same for every incarnation of its pod (its DNS name)."""
    return f"{job}-worker-{slot}"


def workers_service(job: str) -> str:
    """Headless Service: gives each worker a DNS name ``<host>.<job>-workers`` (``worker_host``)."""
    return f"{job}-workers"


def store_pod(job: str) -> str:
    return f"{job}-rdzv"


def store_service(job: str) -> str:
    """Headless too: resolves straight to the store pod, no kube-proxy needed."""
    return f"{job}-rdzv"


def config_map(job: str) -> str:
    return f"{job}-config"


def network_policy(job: str) -> str:
    """Who may reach the job's pods (``manifests.network_policy``)."""
    return f"{job}-isolation"


def shared_sub_path(job: str, namespace: str) -> str:
    """The shared tier's folder in its volume when ``subPath`` is not given."""
    return f"{namespace}/{job}"


def s3_prefix(job: str, namespace: str) -> str:
    """The S3 tier's key prefix when ``prefix`` is not given."""
    return f"llmtrain/{namespace}/{job}"


def rdzv_endpoint(job: str, namespace: str) -> str:
    return f"{store_service(job)}.{namespace}.svc:{RDZV_PORT}"


def job_labels(job: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "llmtrain", "app.kubernetes.io/managed-by": "llmtrain-operator", LABEL_JOB: job}


TRAINER_CONTAINER = "trainer"
"""The worker pod's container that runs the launcher, torchrun and the ranks."""


def worker_selector(job: str) -> str:
    """The job's worker pods as a label selector string (``status.selector``: the scale
    subresource's, which an autoscaler reads); not the failed pods kept for their logs."""
    return f"{LABEL_JOB}={job},{LABEL_ROLE}={ROLE_WORKER},!{LABEL_KEPT}"


def worker_labels(job: str, slot: int, generation: int, incarnation: int = 0) -> dict[str, str]:
    return {**job_labels(job), LABEL_ROLE: ROLE_WORKER, LABEL_SLOT: str(slot), LABEL_GENERATION: str(generation),
            LABEL_INCARNATION: str(incarnation)}


def store_labels(job: str) -> dict[str, str]:
    return {**job_labels(job), LABEL_ROLE: ROLE_STORE}
