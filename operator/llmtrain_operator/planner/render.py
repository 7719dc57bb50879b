"""Render the trainer's config file from a job spec (pure)."""

from __future__ import annotations

import hashlib
from typing import Any

import yaml
from llmtrain_contract.config import TrainerConfig

from ..api.job import LLMTrainJob
from ..api.spec import AUTO, AutoCadenceSpec, S3TierSpec
from . import names


def tier_paths(job: LLMTrainJob) -> dict[str, str]:
    """Where each tier lives *inside the pod* (the local runner maps them elsewhere)."""
    ns = job.metadata.namespace or "default"
    ckpt = job.spec.checkpoint
    paths = {"local": names.LOCAL_TIER_MOUNT}
    if ckpt.shared is not None:
        paths["shared"] = names.SHARED_TIER_MOUNT
    if ckpt.s3 is not None:
        prefix = ckpt.s3.prefix or names.s3_prefix(job.metadata.name, ns)
        paths["s3"] = f"s3://{ckpt.s3.bucket}/{prefix}"
    return paths


def tiers_wire(job: LLMTrainJob, paths: dict[str, str]) -> list[dict[str, Any]]:
    """The job's checkpoint tiers as the trainer's config lists them (``checkpoint.tiers``;
    a script job's ``LLMTRAIN_CHECKPOINT_TIERS``); none with checkpoints off."""
    ckpt = job.spec.checkpoint
    if not ckpt.enabled:
        return []
    tiers: list[dict[str, Any]] = [{"name": "local", "uri": paths["local"], "keep": ckpt.local.keep}]
    for name, tier in (("shared", ckpt.shared), ("s3", ckpt.s3)):
        if tier is None:
            continue
        entry = {"name": name, "uri": paths[name], "keep": tier.keep, "intervalSteps": tier.interval_steps or 0}
        if isinstance(tier, S3TierSpec):
            entry.update({"endpoint": tier.endpoint, "region": tier.region, "pathStyle": tier.force_path_style})
        tiers.append(entry)
    return tiers


def trainer_config(job: LLMTrainJob, paths: dict[str, str] | None = None, run_dir: str = names.RUN_DIR,
                   metrics_host: str = "$POD_IP") -> TrainerConfig:
    """The config the built-in trainer reads. ``paths`` overrides the tier locations."""
    spec = job.spec
    if spec.trainer.builtin is None:
        raise ValueError("only the built-in trainer has a trainer config")
    paths = paths or tier_paths(job)
    ckpt = spec.checkpoint
    tiers = tiers_wire(job, paths)
    if ckpt.interval_steps == AUTO:
        auto = ckpt.auto or AutoCadenceSpec()
        cadence = {"intervalSteps": auto.initial_steps, "auto": auto.model_dump(by_alias=True)}
    else:
        cadence = {"intervalSteps": ckpt.interval_steps}
    wire = {
        **spec.trainer.builtin.to_wire(),
        "jobName": job.metadata.name,
        "jobUid": job.metadata.uid or "",
        "runDir": run_dir,
        "checkpoint": {
            **cadence,
            "tiers": tiers,
            "allowFreshStart": ckpt.allow_fresh_start,
            "sigtermBudgetSeconds": ckpt.sigterm_budget_seconds,
        },
        "faultTolerance": {
            "hangTimeoutSeconds": spec.fault_tolerance.hang_timeout_seconds,
            "collectiveTimeoutSeconds": spec.fault_tolerance.collective_timeout_seconds,
            "inProcessHealing": spec.fault_tolerance.in_process_healing,
            "numerics": spec.fault_tolerance.numerics.model_dump(mode="json", by_alias=True),
            "stragglers": spec.fault_tolerance.stragglers.model_dump(mode="json", by_alias=True, exclude={"action"}),
        },
        "metrics": {"host": metrics_host, "port": spec.metrics.port},
    }
    return TrainerConfig.model_validate(wire)


def config_text(cfg: TrainerConfig) -> str:
    return yaml.safe_dump(cfg.to_wire(), sort_keys=True)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
