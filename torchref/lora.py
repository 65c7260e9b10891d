"""LoRA for the reference model: y = x W^T + (alpha / r) dropout(x) A^T B^T, base frozen, B zero at the start.

Parameter names extend the base's: `layers.0.attn.q_proj.lora_a` (r, d_in) and `.lora_b` (d_out, r),
next to the frozen `layers.0.attn.q_proj.weight`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torchref.model import Linear

ATTENTION = ("q_proj", "k_proj", "v_proj", "output_proj")
FEED_FORWARD = ("w1", "w2", "w3")


class LoRALinear(nn.Module):
    def __init__(self, base: Linear, rank: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        d_out, d_in = base.weight.shape
        self.weight = base.weight
        self.weight.requires_grad_(False)
        bound = 1.0 / math.sqrt(d_in)
        self.lora_a = nn.Parameter(torch.empty(rank, d_in, device=base.weight.device).uniform_(-bound, bound))
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank, device=base.weight.device))
        self.scale = alpha / rank
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + self.scale * (self.drop(x) @ self.lora_a.T) @ self.lora_b.T

    def merged(self) -> Linear:
        """A plain Linear with W + (alpha / r) B A."""
        out = Linear(self.weight.shape[1], self.weight.shape[0], device=self.weight.device)
        with torch.no_grad():
            out.weight.copy_(self.weight + self.scale * self.lora_b @ self.lora_a)
        return out


def _slots(model: nn.Module, targets):
    for block in model.layers:
        for parent, names in ((block.attn, ATTENTION), (block.ffn, FEED_FORWARD)):
            for name in names:
                if name in targets and hasattr(parent, name):
                    yield parent, name


def apply_lora(model: nn.Module, rank: int, alpha: float, targets=ATTENTION + FEED_FORWARD, dropout: float = 0.0):
    """Freeze every parameter of `model` and add adapters to the target Linears (in place); returns the model."""
    for p in model.parameters():
        p.requires_grad_(False)
    for parent, name in list(_slots(model, targets)):
        setattr(parent, name, LoRALinear(getattr(parent, name), rank, alpha, dropout))
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (in place); returns the model."""
    for parent, name in list(_slots(model, ATTENTION + FEED_FORWARD)):
        layer = getattr(parent, name)
        if isinstance(layer, LoRALinear):
            setattr(parent, name, layer.merged())
    return model
