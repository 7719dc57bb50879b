"""The engine of a strategy: the one place that chooses it."""

from __future__ import annotations

from llmtrain_trainer.engines.base import EngineClass
from llmtrain_trainer.engines.ddp import DDPEngine


def engine_class(kind: str) -> EngineClass:
    """DeepSpeed is imported only when chosen: it is heavy, and a DDP job never needs it."""
    if kind == "deepspeed":
        from llmtrain_trainer.engines.deepspeed import DeepSpeedEngine  # noqa: PLC0415 - heavy

        return DeepSpeedEngine
    return DDPEngine
