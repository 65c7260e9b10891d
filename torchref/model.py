"""The reference Transformer LM in PyTorch (docs/spec.md), written bottom-up.

Parameter names are exactly the specification's (`layers.0.attn.q_proj.weight`, ...),
weights are stored (d_out, d_in), and there are no biases, so a parameter tree of
the same names maps onto `state_dict()` by name alone. Everything here favours
clarity over speed; the one fused path (`fused_attention=True`) uses
`F.scaled_dot_product_attention` so benchmarks can compare against torch's best kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """The architecture: the same field names and defaults as the specification's options."""

    vocab_size: int = 10000
    context_length: int = 256
    d_model: int = 512
    num_layers: int = 4
    num_heads: int = 16
    d_ff: int | None = None  # None: about 8/3 d_model rounded to a multiple of 64 (swiglu), 4 d_model (silu)
    rope_theta: float = 10000.0
    norm: Literal["pre", "post", "none"] = "pre"
    rope: bool = True
    ffn: Literal["swiglu", "silu"] = "swiglu"
    tie_embeddings: bool = False
    dropout: float = 0.0
    eps: float = 1e-5
    window: int | None = None  # each query sees itself and at most `window` previous keys

    def __post_init__(self):
        if self.d_ff is None:
            d_ff = 4 * self.d_model if self.ffn == "silu" else max(64, round(8 * self.d_model / 3 / 64) * 64)
            object.__setattr__(self, "d_ff", d_ff)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


def trunc_normal_(t: torch.Tensor, std: float) -> torch.Tensor:
    return nn.init.trunc_normal_(t, mean=0.0, std=std, a=-3 * std, b=3 * std)


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Numerically stable: subtract the max along `dim` before exponentiating."""
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def causal_mask(q_len: int, k_len: int, window: int | None = None, device=None) -> torch.Tensor:
    """(q_len, k_len) bool, True = may attend. Queries are the last q_len positions.

    Query i sees key j when j <= i and, with a window, i - j <= window (so at most
    `window` previous keys plus itself).
    """
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    mask = j <= i
    if window is not None:
        mask &= (i - j) <= window
    return mask


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k) + mask) V over any leading axes; mask True = may attend."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., q, k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = softmax(scores.float(), dim=-1).to(v.dtype)
    if dropout > 0 and training:
        probs = F.dropout(probs, dropout, training=True)
    return probs @ v  # (..., q, d_v)


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=device, dtype=dtype))
        trunc_normal_(self.weight, math.sqrt(2.0 / (d_in + d_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, device=None, dtype=None, std: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, device=device, dtype=dtype))
        trunc_normal_(self.weight, std)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return y.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotates pairs (x[2k], x[2k+1]) at position p by p * theta^(-2k/d_k); tables are not parameters."""

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device=None):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, d_k, 2, device=device, dtype=torch.float64) / d_k)  # (d_k/2,)
        angles = torch.arange(max_seq_len, device=device, dtype=torch.float64)[:, None] * inv_freq  # (S, d_k/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[token_positions], self.sin[token_positions]  # (..., seq, d_k/2)
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (..., seq, d_k/2, 2)
        return out.flatten(-2).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)
        self.w3 = Linear(d_model, d_ff, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))


class SiLUFFN(nn.Module):
    """The ablation's ungated feed-forward: w2(silu(w1 x))."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device, dtype)
        self.w2 = Linear(d_ff, d_model, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu(self.w1(x)))


class LayerCache:
    """One layer's keys (after RoPE) and values, (batch, heads, seq, d_k), grown by concatenation."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat((self.k, k), dim=-2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=-2)
        return self.k, self.v


class KVCache:
    """The reference KV cache for generation: a LayerCache per block. Simple, not preallocated."""

    def __init__(self, num_layers: int):
        self.layers = [LayerCache() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length


class MultiHeadSelfAttention(nn.Module):
    """Causal self-attention; RoPE on queries and keys when `rope` is given."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        rope: RotaryEmbedding | None = None,
        window: int | None = None,
        dropout: float = 0.0,
        fused: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.num_heads, self.window, self.dropout, self.fused = num_heads, window, dropout, fused
        self.q_proj = Linear(d_model, d_model, device, dtype)
        self.k_proj = Linear(d_model, d_model, device, dtype)
        self.v_proj = Linear(d_model, d_model, device, dtype)
        self.output_proj = Linear(d_model, d_model, device, dtype)
        self.rope = rope

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (..., S, D) -> (..., H, S, D/H)
        return x.unflatten(-1, (self.num_heads, -1)).transpose(-3, -2)

    def forward(
        self, x: torch.Tensor, token_positions: torch.Tensor | None = None, kv_cache: LayerCache | None = None
    ) -> torch.Tensor:
        """kv_cache: the new tokens follow the cached ones (positions continue from its length)."""
        seq = x.shape[-2]
        past = 0 if kv_cache is None else kv_cache.length
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        if self.rope is not None:
            if token_positions is None:
                token_positions = torch.arange(past, past + seq, device=x.device)
            pos = token_positions.unsqueeze(-2)  # broadcast over the head axis
            q, k = self.rope(q, pos), self.rope(k, pos)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (..., H, past + seq, D/H)
            mask = causal_mask(seq, k.shape[-2], self.window, x.device)  # queries are the last `seq` keys
            if self.fused:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                out = scaled_dot_product_attention(q, k, v, mask)
        elif self.fused:
            mask = None if self.window is None else causal_mask(seq, seq, self.window, x.device)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=self.dropout if self.training else 0.0
            )
        else:
            mask = causal_mask(seq, seq, self.window, x.device)
            out = scaled_dot_product_attention(q, k, v, mask, self.dropout, self.training)  # (..., H, S, D/H)
        return self.output_proj(out.transpose(-3, -2).flatten(-2))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding | None, fused_attention: bool = False, device=None,
                 dtype=None):
        super().__init__()
        self.norm = cfg.norm
        has_norm = cfg.norm != "none"
        self.ln1 = RMSNorm(cfg.d_model, cfg.eps, device, dtype) if has_norm else nn.Identity()
        self.ln2 = RMSNorm(cfg.d_model, cfg.eps, device, dtype) if has_norm else nn.Identity()
        self.attn = MultiHeadSelfAttention(
            cfg.d_model, cfg.num_heads, rope, cfg.window, cfg.dropout, fused_attention, device, dtype
        )
        ffn_cls = SwiGLU if cfg.ffn == "swiglu" else SiLUFFN
        self.ffn = ffn_cls(cfg.d_model, cfg.d_ff, device, dtype)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, token_positions: torch.Tensor | None = None, kv_cache: LayerCache | None = None
    ) -> torch.Tensor:
        if self.norm == "post":
            h = self.ln1(x + self.drop(self.attn(x, token_positions, kv_cache)))
            return self.ln2(h + self.drop(self.ffn(h)))
        h = x + self.drop(self.attn(self.ln1(x), token_positions, kv_cache))
        return h + self.drop(self.ffn(self.ln2(h)))


class TransformerLM(nn.Module):
    """Embeddings -> blocks -> ln_final (absent when norm='none') -> lm_head.

    fused_attention: use `F.scaled_dot_product_attention` (torch's fused kernels) instead of
    the explicit softmax(Q K^T) V; the same function up to rounding.
    """

    def __init__(self, cfg: ModelConfig, device=None, dtype=None, fused_attention: bool = False):
        super().__init__()
        self.cfg = cfg
        rope = RotaryEmbedding(cfg.rope_theta, cfg.head_dim, cfg.context_length, device) if cfg.rope else None
        # A tied embedding is also the output head: std 0.5 / sqrt(d_model) keeps the first logits small (docs/spec.md).
        std = 0.5 / math.sqrt(cfg.d_model) if cfg.tie_embeddings else 1.0
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, device, dtype, std)
        self.layers = nn.ModuleList(
            TransformerBlock(cfg, rope, fused_attention, device, dtype) for _ in range(cfg.num_layers)
        )
        self.ln_final = RMSNorm(cfg.d_model, cfg.eps, device, dtype) if cfg.norm != "none" else nn.Identity()
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, device, dtype)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_embeddings.weight

    def forward(
        self, in_indices: torch.Tensor, token_positions: torch.Tensor | None = None, kv_cache: KVCache | None = None
    ) -> torch.Tensor:
        """(batch, seq) token ids -> (batch, seq, vocab) unnormalised logits.

        kv_cache: the tokens continue the cached sequence (positions default to
        cache length ... cache length + seq - 1); the cache is extended in place.
        """
        past = 0 if kv_cache is None else kv_cache.length
        if past + in_indices.shape[-1] > self.cfg.context_length:
            raise ValueError(
                f"sequence length {past + in_indices.shape[-1]} exceeds context_length {self.cfg.context_length}"
            )
        x = self.token_embeddings(in_indices)  # (B, S, D)
        for i, layer in enumerate(self.layers):
            x = layer(x, token_positions, None if kv_cache is None else kv_cache.layers[i])
        return self.lm_head(self.ln_final(x))  # (B, S, V)

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.token_embeddings.weight.numel() if non_embedding else n
