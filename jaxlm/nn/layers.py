"""The building blocks of the Transformer LM (docs/spec.md), each a small Flax NNX module.

Weights are stored (d_out, d_in) like torch, with no biases, so parity's conversion is a
table of names. Each parameter carries the logical names of its axes (``logical=``), which
`jaxlm/core/sharding.py`'s rules table maps to mesh axes. `Precision` is the bf16 policy: parameters
float32, cast to the compute dtype at use inside `Linear` and `Embedding`; RMSNorm and RoPE
compute in float32.

Shapes: B batch, T sequence, D d_model, N heads, H head_dim, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlm.core.config import ComputeConfig
from jaxlm.core.sharding import constrain

# --------------------------------------------------------------------------- precision


@dataclasses.dataclass(frozen=True)
class Precision:
    """Parameters live in `param` dtype; `cast` moves them (and activations) to `compute` at use."""

    compute: Any = jnp.float32
    param: Any = jnp.float32

    def cast(self, x: jax.Array) -> jax.Array:
        return x.astype(self.compute)

    @classmethod
    def from_config(cls, compute: ComputeConfig) -> "Precision":
        return cls(compute=jnp.dtype(compute.dtype))


def truncated_normal(key: jax.Array, shape: tuple[int, ...], std: float, dtype=jnp.float32) -> jax.Array:
    """Normal(0, std) cut at +-3 std (the init of docs/spec.md, torch's trunc_normal_(std, -3std, 3std))."""
    return std * jax.random.truncated_normal(key, -3.0, 3.0, shape, dtype)


class Buffer(nnx.Variable):
    """A non-trainable constant (RoPE tables): in the model state, not in nnx.Param."""


# --------------------------------------------------------------------------- layers


def dense(x: jax.Array, w: jax.Array) -> jax.Array:
    """x (..., I) @ w.T for w stored (O, I) -> (..., O), the leading axes flattened to one token axis.

    Why flatten: the weight gradient then contracts one token axis, which XLA:CPU's dot reads in
    place; with (B, T) both contracted it first writes the activation gradient transposed, which
    cost about 10 % of a CPU train step (more with scanned layers, whose fused slices slow that copy).
    """
    y = jnp.einsum("ki,oi->ko", x.reshape(-1, x.shape[-1]), w)  # (B*T, O)
    return y.reshape(*x.shape[:-1], w.shape[0])  # (..., O)


def linear_init(d_in: int, d_out: int, precision: Precision, rngs: nnx.Rngs) -> jax.Array:
    """A fresh (d_out, d_in) weight, std sqrt(2 / (d_in + d_out)): drawn the same by every linear kind."""
    return truncated_normal(rngs.params(), (d_out, d_in), math.sqrt(2.0 / (d_in + d_out)), precision.param)


def tied_embedding_std(d_model: int) -> float:
    """The initial std of an embedding that is also the output head (docs/spec.md).

    At std 1 (the untied embedding's) every logit sums d_model unit terms and the input token's own logit is about
    d_model: the first loss is about d_model nats instead of ln(vocab). GPT-2 and nanoGPT tie at std 0.02, logits
    of std 0.02 sqrt(d_model) (0.4 at 384 wide, 1.0 at 2,560); 0.5 / sqrt(d_model) holds them at 0.5 at every
    width, about 0.1 nats above ln(vocab).
    """
    return 0.5 / math.sqrt(d_model)


class Linear(nnx.Module):
    """y = x @ W.T with W stored (d_out, d_in), no bias."""

    def __init__(self, d_in: int, d_out: int, *, axes: tuple[str, str] | None = None,
                 precision: Precision = Precision(), rngs: nnx.Rngs):
        w = linear_init(d_in, d_out, precision, rngs)
        self.weight = nnx.Param(w, logical=axes)  # logical names of (d_out, d_in) for jaxlm/core/sharding.py
        self.precision = precision

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.precision.cast(self.weight[...])  # (out, in)
        return dense(self.precision.cast(x), w)  # (..., out)


class Embedding(nnx.Module):
    """Token id -> row of `weight` (vocab, d_model), drawn with std `std` (1 unless it is also the output head)."""

    def __init__(self, vocab_size: int, d_model: int, *, std: float = 1.0, precision: Precision = Precision(),
                 rngs: nnx.Rngs):
        w = truncated_normal(rngs.params(), (vocab_size, d_model), std, precision.param)
        self.weight = nnx.Param(w, logical=("vocab", "embed"))
        self.precision = precision

    def __call__(self, ids: jax.Array) -> jax.Array:
        return self.precision.cast(jnp.take(self.weight[...], ids, axis=0))  # (..., D)


class RMSNorm(nnx.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in float32, cast back to x's dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        self.weight = nnx.Param(jnp.ones((d_model,), jnp.float32), logical=("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)  # (..., D)
        rms = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)  # (..., 1)
        return (x32 * rms * self.weight[...].astype(jnp.float32)).astype(x.dtype)


def llama3_frequencies(inv_freq: np.ndarray, scaling) -> np.ndarray:
    """Llama 3.1's RoPE scaling of the frequencies (H/2,): wavelengths longer than original_context /
    low_freq_factor slow down by `factor`, shorter than original_context / high_freq_factor stay, and the
    band between interpolates smoothly (Meta's llama-models `apply_scaling`, transformers' "llama3" rope_type)."""
    factor, low, high, context = scaling
    wavelen = 2 * math.pi / inv_freq  # (H/2,)
    smooth = (context / wavelen - low) / (high - low)  # (H/2,)
    mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return np.where(wavelen < context / high, inv_freq, np.where(wavelen > context / low, inv_freq / factor, mid))


class RotaryEmbedding(nnx.Module):
    """RoPE tables: pair k at position p rotates by p * theta^(-2k/H) (interleaved pairs); `scaling`: the
    Llama 3 frequency scaling [factor, low_freq_factor, high_freq_factor, original_context] or None."""

    def __init__(self, head_dim: int, max_len: int, theta: float = 10000.0, scaling=None):
        inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (H/2,)
        if scaling is not None:
            inv_freq = llama3_frequencies(inv_freq, scaling)
        angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]  # (max_len, H/2)
        self.cos = Buffer(jnp.asarray(np.cos(angles), jnp.float32))  # (max_len, H/2)
        self.sin = Buffer(jnp.asarray(np.sin(angles), jnp.float32))  # (max_len, H/2)

    def __call__(self, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """positions (..., T) int -> (cos, sin), each (..., T, H/2) float32."""
        return self.cos[...][positions], self.sin[...][positions]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate (x[2k], x[2k+1]) in place. x (B, T, N, H); cos, sin (B or 1, T, H/2) or (T, H/2)."""
    cos, sin = cos[..., None, :], sin[..., None, :]  # (..., T, 1, H/2): broadcast over heads
    x32 = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)  # (B, T, N, H/2, 2)
    x0, x1 = x32[..., 0], x32[..., 1]  # (B, T, N, H/2)
    out = jnp.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), axis=-1)  # (B, T, N, H/2, 2)
    return out.reshape(x.shape).astype(x.dtype)  # (B, T, N, H)


def silu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)


# What builds a block's projections: linear(name, d_in, d_out, logical axes, rngs) -> a linear layer
# (`LinearKinds` in jaxlm/nn/model.py chooses the kind: plain, LoRA / QLoRA or QAT).
MakeLinear = Callable[[str, int, int, tuple[str, str], nnx.Rngs], nnx.Module]


class SwiGLU(nnx.Module):
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, d_ff: int, *, linear: MakeLinear, rngs: nnx.Rngs):
        self.w1 = linear("w1", d_model, d_ff, ("mlp", "embed"), rngs)
        self.w2 = linear("w2", d_ff, d_model, ("embed", "mlp"), rngs)
        self.w3 = linear("w3", d_model, d_ff, ("mlp", "embed"), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = constrain(silu(self.w1(x)) * self.w3(x), "batch", "seq", "mlp")  # (B, T, F)
        return self.w2(h)  # (B, T, D)


class SiLUFFN(nnx.Module):
    """The ablation's ungated feed-forward: w2(silu(w1 x)) (no w3)."""

    def __init__(self, d_model: int, d_ff: int, *, linear: MakeLinear, rngs: nnx.Rngs):
        self.w1 = linear("w1", d_model, d_ff, ("mlp", "embed"), rngs)
        self.w2 = linear("w2", d_ff, d_model, ("embed", "mlp"), rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.w2(constrain(silu(self.w1(x)), "batch", "seq", "mlp"))  # (B, T, F) -> (B, T, D)


FFNS = {"swiglu": SwiGLU, "silu": SiLUFFN}


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; the identity when `key` is None (evaluation) or rate == 0."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)
