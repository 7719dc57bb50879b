"""The DDP engine's GPU optimizer path (``ArenaOptimizer.step_fused``: torch's fused AdamW
kernel) does the update of the per-tensor loop it replaces, decay groups included."""

from __future__ import annotations

import torch
from llmtrain_contract.config import OptimizerConfig
from llmtrain_trainer.engines.optim import ArenaOptimizer


class Views:
    def __init__(self, views):
        self.views = views


def test_the_fused_kernel_matches_the_loop_over_several_steps():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(7, 5)) for _ in range(4)]
    named = [(f"p{i}", p) for i, p in enumerate(params)]
    groups = [{"params": params[:3], "weight_decay": 0.1}, {"params": params[3:], "weight_decay": 0.0}]
    cfg = OptimizerConfig(lr=1e-2)

    def state():
        views = {f"param/{n}": p.detach().clone() for n, p in named}
        views |= {f"{s}/{n}": torch.zeros_like(p) for s in ("exp_avg", "exp_avg_sq") for n, p in named}
        return views

    looped, fused = state(), state()
    loop_opt, fused_opt = ArenaOptimizer(cfg, named, groups), ArenaOptimizer(cfg, named, groups)
    for step in range(5):
        for p in params:
            p.grad = torch.randn_like(p)
        params[1].grad = None if step == 2 else params[1].grad  # a parameter without a gradient is left alone
        loop_opt.step(Views(looped))
        fused_opt.step_fused(fused)
    assert loop_opt.steps == fused_opt.steps == 5
    worst = max((looped[k] - fused[k]).abs().max().item() for k in looped)
    assert worst < 1e-6, worst
    assert not torch.equal(looped["param/p0"], params[0].detach())  # the state did move
