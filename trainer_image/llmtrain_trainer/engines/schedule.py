"""Learning-rate schedule as a pure function of the step.

A function of the step, not a stateful scheduler object, so a resume at any step (and
any world size) gets exactly the same learning rate without restoring extra state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from llmtrain_contract.config import OptimizerConfig

if TYPE_CHECKING:  # this module is torch-free at run time
    import torch


def lr_at(step: int, cfg: OptimizerConfig, max_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    if cfg.schedule == "linear":
        return cfg.lr + (cfg.min_lr - cfg.lr) * progress
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def param_groups(model, weight_decay: float) -> list[dict]:
    """Decay matrices (weights, embeddings), not biases or LayerNorm gains (GPT-2 practice)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    seen: set[int] = set()
    for param in model.parameters():
        if not param.requires_grad or id(param) in seen:  # tied weights appear twice
            continue
        seen.add(id(param))
        (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
