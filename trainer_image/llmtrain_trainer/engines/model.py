"""A decoder-only transformer (GPT-2 style), sized by the presets in ``config.py``.

Deliberately plain: pre-LayerNorm blocks, causal self-attention through
``scaled_dot_product_attention``, GELU MLP, tied input/output embeddings. The loss is a
mean over tokens, so micro-batch losses scale cleanly under gradient accumulation.

Fine-tuning (``freeze``, ``lora``): LoRA adapters are attached to the built model, and
frozen parameters get ``requires_grad=False``; the parameter names are the contract's
(``llmtrain_contract.config.parameter_names``).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - torch's own convention
from torch import nn
from torch.utils.checkpoint import checkpoint as activation_checkpoint

from llmtrain_contract.config import LoraConfig, ModelShape, TrainerConfig, frozen_names

log = logging.getLogger("llmtrain.trainer")


class CausalSelfAttention(nn.Module):
    def __init__(self, shape: ModelShape, dropout: float):
        super().__init__()
        self.n_head = shape.n_head
        self.qkv = nn.Linear(shape.n_embd, 3 * shape.n_embd)
        self.proj = nn.Linear(shape.n_embd, shape.n_embd)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, embd = x.shape
        q, k, v = self.qkv(x).split(embd, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, embd // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, embd))


class Block(nn.Module):
    def __init__(self, shape: ModelShape, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(shape.n_embd)
        self.attn = CausalSelfAttention(shape, dropout)
        self.ln2 = nn.LayerNorm(shape.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(shape.n_embd, 4 * shape.n_embd),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * shape.n_embd, shape.n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, shape: ModelShape, dropout: float = 0.0, activation_checkpointing: bool = False):
        super().__init__()
        self.shape = shape
        self.activation_checkpointing = activation_checkpointing
        self.wte = nn.Embedding(shape.vocab_size, shape.n_embd)
        self.wpe = nn.Embedding(shape.block_size, shape.n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(shape, dropout) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.n_embd)
        self.head = nn.Linear(shape.n_embd, shape.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        # GPT-2's scaled init of residual projections keeps the residual stream's variance
        # independent of depth.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * shape.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over all positions."""
        _, seq = tokens.shape
        pos = torch.arange(seq, device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(pos))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = activation_checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


LORA_SEED_SALT = 0x10BA
"""Mixed into the job's seed for the adapters' generator: a stream of its own, so that
attaching adapters draws nothing from the one that initialised the base model."""


class LoRALinear(nn.Module):
    """A linear layer with a low-rank adapter: ``W x + b + scale * B (A x)``.

    It holds the layer's own ``weight`` and ``bias`` (the same tensors, under the same
    names: ``initFrom``, the checkpoint and the export see the base model's names) and
    the adapters ``lora_a`` (rank x in) and ``lora_b`` (out x rank)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator):
        super().__init__()
        self.weight = base.weight
        self.bias = base.bias
        self.scale = alpha / rank
        # A as nn.Linear's (and the reference LoRA code's) default: Kaiming-uniform with
        # a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)). B is zero, so B (A x) is exactly
        # zero and step 0 computes the base model's outputs bit for bit.
        bound = 1.0 / math.sqrt(base.in_features)
        draw = torch.rand(rank, base.in_features, generator=generator, device="cpu") * (2 * bound) - bound
        self.lora_a = nn.Parameter(draw.to(device=base.weight.device, dtype=base.weight.dtype))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device, dtype=base.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(F.linear(x, self.lora_a), self.lora_b)


def add_lora(model: GPT, lora: LoraConfig, seed: int) -> None:
    """Replace each targeted attention projection by a ``LoRALinear`` around its weights.
    The adapters come from a generator of their own (``LORA_SEED_SALT``), drawn on the CPU
    in the model's order: the same on every rank and every restart."""
    generator = torch.Generator().manual_seed(seed ^ LORA_SEED_SALT)
    for block in model.blocks:
        attn = block.attn
        assert isinstance(attn, CausalSelfAttention)
        for target in lora.targets:
            base = getattr(attn, target)
            assert isinstance(base, nn.Linear)
            setattr(attn, target, LoRALinear(base, lora.rank, lora.alpha, generator))


def apply_freeze(model: nn.Module, cfg: TrainerConfig) -> list[str]:
    """``requires_grad=False`` on the parameters ``freeze`` (and ``lora``) freeze; their
    names. Checked against the model's own names (raises ``FreezeError``, naming a
    pattern that matches none), as the config was against the preset's."""
    params = dict(model.named_parameters())
    frozen = frozen_names(list(params), cfg.freeze or [], cfg.lora is not None)
    for name in frozen:
        params[name].requires_grad_(False)
    return frozen


def build_model(shape: ModelShape, dropout: float, activation_checkpointing: bool, seed: int) -> GPT:
    """Build with a seeded init, independent of the global RNG, so that every rank and
    every restart starts from identical weights before any checkpoint is loaded."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return GPT(shape, dropout=dropout, activation_checkpointing=activation_checkpointing)
    finally:
        torch.random.set_rng_state(state)


def make_model(cfg: TrainerConfig) -> GPT:
    """The seeded model, or (``initFrom``) the file's weights in it, with its adapters
    (``lora``) and its frozen parameters marked (``freeze``), before any engine wraps it:
    DeepSpeed copies its master weights from the model at ``initialize``."""
    shape = cfg.model.shape(cfg.data.seq_len)
    model = build_model(shape, cfg.model.dropout, cfg.model.activation_checkpointing, cfg.seed)
    if cfg.lora is not None:
        add_lora(model, cfg.lora, cfg.seed)  # before initFrom: a file may hold adapters too
    apply_freeze(model, cfg)
    if cfg.init_from:
        from llmtrain_trainer.engines.init_weights import load_or_defer  # noqa: PLC0415 - only a job that asks

        count = load_or_defer(model, Path(cfg.init_from))
        if count is not None and os.environ.get("RANK", "0") == "0":
            log.info("initialised %d parameters from %s (initFrom)", count, cfg.init_from)
    return model
