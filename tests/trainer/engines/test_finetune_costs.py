"""What a fine-tune's step costs, counted by torch on the CPU against the config-only
figures the operator and the trainer use (``llmtrain_contract.params``): the trained
parameter count, the FLOPs of a forward and backward pass (``FlopCounterMode``, with
attention in its math form so that torch counts it), and the activations autograd
saves (``saved_tensors_hooks``) relative to a run that trains every weight."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from llmtrain_contract import flops, memplan, params
from llmtrain_contract.config import TrainerConfig
from llmtrain_trainer.engines.model import make_model
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

SEQ, BATCH = 64, 2
CASES: dict[str, dict[str, Any]] = {
    "full": {},
    "embeddings": {"freeze": ["wte.weight", "wpe.weight"]},
    "first-blocks": {"freeze": ["wte.weight", "wpe.weight", "blocks.[0-1].*"]},
    "mid-block": {"freeze": ["wte.weight", "wpe.weight", "blocks.0.*", "blocks.1.ln1.*", "blocks.1.attn.qkv.*"]},
    "mlps": {"freeze": ["blocks.*.mlp.*"]},
    "biases-only": {"freeze": ["*.weight"]},
    "last-layernorm": {"freeze": ["wte.weight", "wpe.weight", "blocks.*"]},
    "lora": {"lora": {"rank": 8}},
    "lora-proj": {"lora": {"rank": 4, "targets": ["proj"]}},
    "lora-and-base-qkv": {"lora": {"rank": 8}, "freeze": ["wte.weight", "wpe.weight", "blocks.0.ln1.*"]},
    "proj-frozen": {"freeze": ["blocks.*.attn.proj.*"]},
    "wte-only": {"freeze": ["wpe.weight", "blocks.*", "ln_f.*"]},
    "lora-full-rank": {"lora": {"rank": 192}},
    "lora-full-rank-and-mlps": {"lora": {"rank": 192}, "freeze": ["wte.weight", "wpe.weight", "blocks.*.attn.*"]},
    "lora-and-mlps": {"lora": {"rank": 4}, "freeze": ["wte.weight", "wpe.weight", "blocks.*.attn.*", "blocks.[0-2].mlp.*"]},
}


def _cfg(extra: dict[str, Any]) -> TrainerConfig:
    return TrainerConfig.model_validate({"model": {"preset": "tiny"}, "data": {"seqLen": SEQ}, "microBatchSize": BATCH,
                                         "globalBatchSize": BATCH, **extra})


def _tokens(cfg: TrainerConfig) -> torch.Tensor:
    vocab = cfg.model.shape(SEQ).vocab_size
    return torch.randint(0, vocab, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("case", list(CASES))
def test_the_trained_parameters_and_flops_are_what_torch_counts(case):
    cfg = _cfg(CASES[case])
    model = make_model(cfg)
    training = params.of_spec(cfg)
    unique = {id(p): p for p in model.parameters()}.values()
    assert training.total == sum(p.numel() for p in unique)
    assert training.trained == sum(p.numel() for p in unique if p.requires_grad)
    tokens = _tokens(cfg)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens, tokens).backward()
    assert flops.flops_per_token(cfg.model.shape(SEQ), SEQ, training) == counter.get_total_flops() / tokens.numel()
    if case == "full":
        assert flops.flops_per_token(cfg.model.shape(SEQ), SEQ, training) == flops.flops_per_token(cfg.model.shape(SEQ), SEQ)
    elif "lora" not in CASES[case]:  # adapters add matrices: at a high rank, more than full training's
        assert flops.flops_per_token(cfg.model.shape(SEQ), SEQ, training) < flops.flops_per_token(cfg.model.shape(SEQ), SEQ)


def _saved_bytes(cfg: TrainerConfig) -> int:
    """Bytes autograd saves for the backward pass, parameters (saved by reference) left out."""
    model = make_model(cfg)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = _tokens(cfg)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, tokens)
    return sum(saved.values())


def test_the_saved_activations_follow_the_blocks_and_layers_that_train():
    # What every case saves beyond a run whose blocks save nothing (only the head trains
    # its final LayerNorm: the logits' share), against the plan's blocks' worth.
    head_only = _saved_bytes(_cfg({"freeze": ["wte.weight", "wpe.weight", "blocks.*"]}))
    full = _saved_bytes(_cfg({})) - head_only
    shape = _cfg({}).model.shape(SEQ)
    for case, extra in CASES.items():
        training = params.of_spec(_cfg(extra))
        measured = (_saved_bytes(_cfg(extra)) - head_only) / full * shape.n_layer
        assert training.saved_blocks() == pytest.approx(measured, rel=0.03), case


def test_a_lora_plan_counts_optimizer_state_and_gradients_of_the_adapters_only():
    lora = _cfg({"lora": {"rank": 8}})
    model = make_model(lora)
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    job = memplan.from_config(lora, world_size=1)
    assert job.training is not None and job.training.trained == adapters
    assert memplan.plan(job).terms["optimizer state"] == 8 * adapters
    assert memplan.plan(job).terms["weights"] == 4 * sum(p.numel() for p in model.parameters())
