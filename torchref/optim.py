"""Loss, AdamW, the warmup-cosine schedule and global-norm clipping (docs/spec.md, "Loss, optimizer, schedule")."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over all positions of logsumexp(logits) - logits[target], in float32, max subtracted."""
    logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    lse = shifted.exp().sum(dim=-1).log()
    picked = shifted.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return (lse - picked).mean()


def lr_cosine_schedule(t: int, lr_max: float, lr_min: float, warmup: int, cosine_end: int) -> float:
    """Linear warmup to lr_max over `warmup` steps, cosine down to lr_min at `cosine_end`, then flat."""
    if t < warmup:
        return t / warmup * lr_max
    if t > cosine_end:
        return lr_min
    if cosine_end == warmup:
        return lr_max
    progress = (t - warmup) / (cosine_end - warmup)
    return lr_min + 0.5 * (1 + math.cos(math.pi * progress)) * (lr_max - lr_min)


@torch.no_grad()
def clip_grad_norm(parameters: Iterable[torch.nn.Parameter], max_norm: float, eps: float = 1e-6) -> float:
    """Scale all gradients in place by max_norm / (||g|| + eps) when the global L2 norm exceeds max_norm."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.sqrt(sum(g.float().pow(2).sum() for g in grads)).item()
    if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (norm + eps))
    return norm


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay, in PyTorch's order: decay by lr*wd, then the bias-corrected step."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid AdamW hyper-parameters: lr={lr}, betas={betas}, eps={eps}, wd={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                alpha = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
                p.mul_(1 - lr * wd)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-alpha)
        return loss
