"""The DeepSpeed config the trainer derives: no op is ever compiled on a job's path (torch's
AdamW, fused on a GPU), and ``dtype: auto`` means bf16 on a GPU that has it."""

from __future__ import annotations

import torch
from llmtrain_contract.config import TrainerConfig
from llmtrain_trainer.engines.deepspeed import deepspeed_config


def config(**overrides):
    return TrainerConfig.model_validate({"strategy": {"kind": "deepspeed", "zeroStage": 2}, "globalBatchSize": 8,
                                         "microBatchSize": 2, **overrides})


def test_on_cpu_torch_adamw_in_fp32():
    ds = deepspeed_config(config(), world_size=2, load_universal=False)
    assert ds["optimizer"]["type"] == "AdamW" and ds["optimizer"]["params"]["torch_adam"] is True
    assert "fused" not in ds["optimizer"]["params"] and "bf16" not in ds
    assert ds["gradient_accumulation_steps"] == 2


def test_on_a_gpu_the_fused_torch_kernel_and_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    ds = deepspeed_config(config(), world_size=1, load_universal=False)
    assert ds["optimizer"]["params"]["torch_adam"] is True and ds["optimizer"]["params"]["fused"] is True
    assert ds["bf16"] == {"enabled": True}
    fp32 = deepspeed_config(config(model={"dtype": "float32"}), world_size=1, load_universal=False)
    assert "bf16" not in fp32


def test_a_users_optimizer_section_still_wins(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    cfg = config(strategy={"kind": "deepspeed", "zeroStage": 1,
                           "deepspeedConfig": {"optimizer": {"type": "AdamW", "params": {"torch_adam": False}}}})
    ds = deepspeed_config(cfg, world_size=1, load_universal=False)
    assert ds["optimizer"]["params"]["torch_adam"] is False  # the user's choice (FusedAdam, compiled on first use)
    assert "fused" not in ds["optimizer"]["params"]  # FusedAdam would refuse the keyword
    assert "bf16" not in ds  # auto on a GPU without bf16
    lamb = config(strategy={"kind": "deepspeed", "zeroStage": 1,
                            "deepspeedConfig": {"optimizer": {"type": "Lamb", "params": {"lr": 0.001}}}})
    params = deepspeed_config(lamb, world_size=1, load_universal=False)["optimizer"]["params"]
    assert "fused" not in params and "torch_adam" not in params
