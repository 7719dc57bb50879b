"""The DDP engine's optimizer: AdamW or SGD whose state lives in an arena, so that a
step can be computed into a spare arena while a checkpoint is written from the live one
(``ddp.py``, "Zero-copy snapshots")."""

from __future__ import annotations

import math
from typing import Any

import torch
from llmtrain_contract.config import OptimizerConfig

from llmtrain_trainer.state.arena import Arena


class ArenaOptimizer:
    """AdamW (decoupled weight decay) or SGD with momentum, whose state lives in an
    arena and which can compute a step into another arena (``step(into=...)``).

    The arithmetic is torch's single-tensor AdamW / SGD, operation for operation; the
    out-of-place form (``torch.mul(..., out=)``, ``torch.lerp(..., out=)``) runs the same
    kernels as the in-place one, so both give the same bits."""

    def __init__(self, cfg: OptimizerConfig, named: list[tuple[str, torch.nn.Parameter]], groups: list[dict[str, Any]]):
        self.cfg = cfg
        self.named = named
        self.weight_decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
        self.steps = 0
        self.lr = cfg.lr
        self.momentum_started = False

    def state_names(self) -> list[str]:
        return ["exp_avg", "exp_avg_sq"] if self.cfg.name == "adamw" else ["momentum"]

    @torch.no_grad()
    def step(self, arena: Arena, into: Arena | None = None) -> None:
        """One step from the state in ``arena`` into ``into`` (default: in place)."""
        out = into or arena
        self.steps += 1
        adam = self.cfg.name == "adamw"
        b1, b2, eps, lr = self.cfg.beta1, self.cfg.beta2, 1e-8, self.lr
        if adam:
            step_size = lr / (1 - b1 ** self.steps)
            bc2_sqrt = math.sqrt(1 - b2 ** self.steps)
        for name, param in self.named:
            grad = param.grad
            p, p_out = arena.views[f"param/{name}"], out.views[f"param/{name}"]
            wd = self.weight_decay[id(param)]
            if grad is None:
                if into is not None:
                    p_out.copy_(p)
                    for s in self.state_names():
                        out.views[f"{s}/{name}"].copy_(arena.views[f"{s}/{name}"])
                continue
            if adam:
                m, v = arena.views[f"exp_avg/{name}"], arena.views[f"exp_avg_sq/{name}"]
                m_out, v_out = out.views[f"exp_avg/{name}"], out.views[f"exp_avg_sq/{name}"]
                torch.mul(p, 1 - lr * wd, out=p_out)
                torch.lerp(m, grad, 1 - b1, out=m_out)
                torch.mul(v, b2, out=v_out)
                v_out.addcmul_(grad, grad, value=1 - b2)
                denom = (v_out.sqrt() / bc2_sqrt).add_(eps)
                p_out.addcdiv_(m_out, denom, value=-step_size)
            else:
                buf, buf_out = arena.views[f"momentum/{name}"], out.views[f"momentum/{name}"]
                g = grad.add(p, alpha=wd) if wd else grad
                if self.momentum_started:
                    torch.mul(buf, self.cfg.beta1, out=buf_out)
                    buf_out.add_(g)
                else:
                    buf_out.copy_(g)
                torch.add(p, buf_out, alpha=-lr, out=p_out)
        self.momentum_started = True

    @torch.no_grad()
    def step_fused(self, views: dict[str, torch.Tensor]) -> None:
        """AdamW on a GPU, in place: torch's fused kernel (one launch per weight-decay
        group, where the loop above launches six kernels per tensor). The same update
        rule; not bitwise the same as the loop, so a run keeps one path (the device
        decides it, and a resumed run on a GPU takes this one again)."""
        assert self.cfg.name == "adamw"
        self.steps += 1
        groups: dict[float, list[tuple[str, torch.Tensor]]] = {}
        for name, param in self.named:
            if param.grad is not None:
                groups.setdefault(self.weight_decay[id(param)], []).append((name, param.grad))
        b1, b2 = self.cfg.beta1, self.cfg.beta2
        for wd, members in groups.items():
            names = [n for n, _ in members]
            params = [views[f"param/{n}"] for n in names]
            step = torch.full((), float(self.steps), dtype=torch.float32, device=params[0].device)
            torch._fused_adamw_(  # the kernel torch.optim.AdamW(fused=True) calls
                params, [grad for _, grad in members],
                [views[f"exp_avg/{n}"] for n in names], [views[f"exp_avg_sq/{n}"] for n in names],
                [], [step] * len(names), lr=self.lr, beta1=b1, beta2=b2, weight_decay=wd, eps=1e-8,
                amsgrad=False, maximize=False)

    def meta(self) -> dict[str, Any]:
        return {"optimizer": self.cfg.name, "steps": self.steps, "momentum_started": self.momentum_started}

    def restore(self, meta: dict[str, Any]) -> None:
        if meta.get("optimizer") != self.cfg.name:
            raise ValueError(f"the checkpoint's optimizer is {meta.get('optimizer')!r}, this run uses {self.cfg.name!r}")
        self.steps = int(meta["steps"])
        self.momentum_started = bool(meta.get("momentum_started", True))
