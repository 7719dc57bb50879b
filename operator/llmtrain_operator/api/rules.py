"""The job's cross-field rules, in one table: every model's ``RULES`` with the path where
that model sits in an ``LLMTrainJob``. The tests check each rule against the model (the
error names ``<path>.<field>`` and carries the rule's message) and, where the server can
check it, against a real API server (the same message); docs/api.md lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmtrain_contract.config import DataConfig, LoraConfig, OptimizerConfig, StrategyConfig, TrainSpec
from llmtrain_contract.rules import Rule, Ruled

from .spec import AutoCadenceSpec, CheckpointSpec, FaultToleranceSpec, LLMTrainJobSpec, ReplicasSpec, TrainerSpec

MODELS: tuple[tuple[str, type[Ruled]], ...] = (
    ("spec", LLMTrainJobSpec),
    ("spec.trainer", TrainerSpec),
    ("spec.replicas", ReplicasSpec),
    ("spec.checkpoint", CheckpointSpec),
    ("spec.checkpoint.auto", AutoCadenceSpec),
    ("spec.faultTolerance", FaultToleranceSpec),
    ("spec.trainer.builtin", TrainSpec),
    ("spec.trainer.builtin.data", DataConfig),
    ("spec.trainer.builtin.optimizer", OptimizerConfig),
    ("spec.trainer.builtin.strategy", StrategyConfig),
    ("spec.trainer.builtin.lora", LoraConfig),
)
"""Where each model with rules sits in a job (its rules' fields are relative to it)."""


@dataclass(frozen=True)
class PlacedRule:
    path: str
    """Where the rule's model sits, e.g. ``spec.replicas``."""
    rule: Rule

    @property
    def field(self) -> str:
        """The full path its error names, e.g. ``spec.replicas.min``."""
        return f"{self.path}.{self.rule.field}"

    def example(self) -> dict[str, Any]:
        """The rule's breaking example as dotted paths from the job's root."""
        return {f"{self.path}.{k}": v for k, v in self.rule.example.items()}


def table() -> list[PlacedRule]:
    return [PlacedRule(path, rule) for path, model in MODELS for rule in model.RULES]
