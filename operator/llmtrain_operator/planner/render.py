"""Render the trainer's config file from a job spec (pure)."""

from __future__ import annotations

import hashlib

import yaml
from llmtrain_contract.config import TrainerConfig

from ..api.job import LLMTrainJob
from . import names


def tier_paths(job: LLMTrainJob) -> dict[str, str]:
    """Where each tier lives *inside the pod* (the local runner maps them elsewhere)."""
    ns = job.metadata.namespace or "default"
    ckpt = job.spec.checkpoint
    paths = {"local": names.LOCAL_TIER_MOUNT}
    if ckpt.shared is not None:
        paths["shared"] = names.SHARED_TIER_MOUNT
    if ckpt.s3 is not None:
        prefix = ckpt.s3.prefix or f"llmtrain/{ns}/{job.metadata.name}"
        paths["s3"] = f"s3://{ckpt.s3.bucket}/{prefix}"
    return paths


def trainer_config(job: LLMTrainJob, paths: dict[str, str] | None = None, run_dir: str = names.RUN_DIR,
                   metrics_host: str = "$POD_IP") -> TrainerConfig:
    """The config the built-in trainer reads. ``paths`` overrides the tier locations."""
    spec = job.spec
    if spec.trainer.builtin is None:
        raise ValueError("only the built-in trainer has a trainer config")
    paths = paths or tier_paths(job)
    ckpt = spec.checkpoint
    tiers = []
    if ckpt.enabled:
        tiers.append({"name": "local", "uri": paths["local"], "keep": ckpt.local.keep, "everyCheckpoints": 1})
        for name, tier in (("shared", ckpt.shared), ("s3", ckpt.s3)):
            if tier is None:
                continue
            every = (tier.interval_steps or ckpt.interval_steps) // ckpt.interval_steps
            entry = {"name": name, "uri": paths[name], "keep": tier.keep, "everyCheckpoints": every}
            if name == "s3":
                entry.update({"endpoint": tier.endpoint, "region": tier.region})
            tiers.append(entry)
    wire = {
        **spec.trainer.builtin.to_wire(),
        "jobName": job.metadata.name,
        "runDir": run_dir,
        "checkpoint": {
            "intervalSteps": ckpt.interval_steps,
            "tiers": tiers,
            "allowFreshStart": ckpt.allow_fresh_start,
            "sigtermBudgetSeconds": ckpt.sigterm_budget_seconds,
        },
        "faultTolerance": {
            "hangTimeoutSeconds": spec.fault_tolerance.hang_timeout_seconds,
            "collectiveTimeoutSeconds": spec.fault_tolerance.collective_timeout_seconds,
        },
        "metrics": {"host": metrics_host, "port": spec.metrics.port},
    }
    return TrainerConfig.model_validate(wire)


def config_text(cfg: TrainerConfig) -> str:
    return yaml.safe_dump(cfg.to_wire(), sort_keys=True)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
