"""The configured tiers, fastest first, each behind the ``Tier`` protocol.

The one place that turns a tier's configuration (``llmtrain_contract.config``'s
``CheckpointTierConfig``, rendered by the operator) into a tier object: the trainer
builds its tiers here, and so does every tool that reads a job's checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llmtrain_contract.config import CheckpointTierConfig

from .directory import DirTier
from .s3 import S3Tier
from .tier import Tier


def build_tier(spec: CheckpointTierConfig) -> Tier:
    """The job-wide tiers (``shared``, ``s3``) store pieces by content, once per job
    (``pieces.py``); tier 1 (``local``) keeps whole files, written straight from the
    arena by direct I/O while training waits on nothing but the disk."""
    by_content = spec.name != "local"
    if spec.uri.startswith("s3://"):
        return S3Tier(spec.name, spec.uri, keep=spec.keep, interval_steps=spec.interval_steps, endpoint=spec.endpoint,
                      region=spec.region, path_style=spec.path_style, content_addressed=by_content)
    return DirTier(spec.name, Path(spec.uri), keep=spec.keep, interval_steps=spec.interval_steps,
                   content_addressed=by_content)


def build_tiers(specs: Sequence[CheckpointTierConfig]) -> list[Tier]:
    """Tier 1 must be a directory (node-local disk): the save path writes it first."""
    tiers = [build_tier(spec) for spec in specs]
    if tiers and not isinstance(tiers[0], DirTier):
        raise ValueError(f"tier 1 ({tiers[0].name}) must be a directory (node-local disk), not {tiers[0].kind}")
    return tiers
