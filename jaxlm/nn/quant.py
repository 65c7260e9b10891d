"""Quantisation numerics and the quantisation-aware Linear.

* QLoRA's frozen base: blockwise absmax NF4 (4-bit NormalFloat, the QLoRA paper's 16 levels) or int8.
  Written here rather than with qwix's "nf4": two codes are packed per uint8, so checkpoints hold
  plain uint8 arrays and the stored bytes are the real 4 bits per weight.
* QAT: `QATLinear`, the kind `LinearKinds` (jaxlm/nn/model.py) builds for every block projection when
  ``qat.*`` bits are set, fake-quantises its weight (per output channel) and its input (per token)
  with qwix's symmetric absmax quantiser, straight-through gradients. A layer kind rather than qwix's
  QatProvider (which rewrites every dot it intercepts at trace time): the output head stays float32
  and the parameters keep the plain layer's path.
* PTQ: `quantize_weight` is the same per-channel quantiser, returning the integer weights.

Shapes: W (..., O, I) as stored by `Linear`, with a leading layers axis when the layers are scanned;
blocks run along the input axis I.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import qwix
from flax import nnx

from jaxlm.core.config import QatConfig, quant_block
from jaxlm.nn.layers import Precision, dense, linear_init

# NF4 levels: the quantiles of N(0, 1) normalised to [-1, 1] with an exact 0 (QLoRA paper, appendix E).
NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
], np.float32)  # numpy: importing this module must not start a JAX backend
INT_BITS = {8: jnp.int8, 4: jnp.int4}


def _blocks(w: jax.Array, block: int) -> jax.Array:
    """(..., O, I) -> (..., O, I/b, b) with b = quant_block(I, block)."""
    b = quant_block(w.shape[-1], block)
    return w.reshape(*w.shape[:-1], w.shape[-1] // b, b)


def quantize_blockwise(w: jax.Array, kind: str, block: int) -> tuple[jax.Array, jax.Array]:
    """(codes, scales): nf4 codes packed two per uint8 (..., O, nb, b/2), or int8 (..., O, nb, b); absmax
    (..., O, nb, 1); nb = I / b."""
    if kind == "nf4" and (b := quant_block(w.shape[-1], block)) % 2:
        raise ValueError(f"nf4 packs two codes per byte: the block must be even, got {b}")
    wb = _blocks(w.astype(jnp.float32), block)  # (..., O, nb, block)
    absmax = jnp.max(jnp.abs(wb), axis=-1, keepdims=True)  # (..., O, nb, 1)
    safe = jnp.where(absmax > 0, absmax, 1.0)
    if kind == "int8":
        return jnp.round(wb / safe * 127).astype(jnp.int8), absmax
    idx = jnp.argmin(jnp.abs((wb / safe)[..., None] - jnp.asarray(NF4)), axis=-1)  # (..., O, nb, block)
    idx = idx.astype(jnp.uint8)
    return idx[..., 0::2] | (idx[..., 1::2] << 4), absmax  # (..., O, nb, block/2)


def dequantize_blockwise(codes: jax.Array, scales: jax.Array, kind: str, shape: tuple[int, int]) -> jax.Array:
    """The float32 (..., O, I) weight back from `quantize_blockwise`; `shape` is (O, I)."""
    if kind == "int8":
        wb = codes.astype(jnp.float32) / 127 * scales  # (..., O, nb, block)
    else:
        idx = jnp.stack((codes & 0xF, codes >> 4), axis=-1).reshape(*codes.shape[:-1], -1)  # (..., O, nb, block)
        wb = jnp.asarray(NF4)[idx] * scales
    return wb.reshape(*codes.shape[:-3], *shape)


class Frozen(nnx.Variable):
    """A frozen, non-float model constant (quantised base weights): never trained, never in nnx.Param."""


# --------------------------------------------------------------------------- QAT and PTQ


def quantize_weight(w: jax.Array, bits: int) -> qwix.QArray:
    """Symmetric absmax integer weights, one scale per output channel (row of the (..., O, I) weight)."""
    return qwix.quantize(w, INT_BITS[bits], channelwise_axes=tuple(range(w.ndim - 1)))


def dequantize_weight(q: qwix.QArray) -> jax.Array:
    """The float (..., O, I) weight an integer one stands for: qvalue * scale."""
    return qwix.dequantize(q)


def fake_quant(x: jax.Array, bits: int, channel_axes: tuple[int, ...]) -> jax.Array:
    """Quantise-dequantise with one scale per index of `channel_axes`; the gradient passes straight through."""
    q = qwix.dequantize(qwix.quantize(x, INT_BITS[bits], channelwise_axes=channel_axes)).astype(x.dtype)
    return x + jax.lax.stop_gradient(q - x)


class QATLinear(nnx.Module):
    """`Linear` with fake-quantised weights (per output channel) and inputs (per token); the same `weight` Param."""

    def __init__(self, d_in: int, d_out: int, axes: tuple[str, str], cfg: QatConfig, *, precision: Precision,
                 rngs: nnx.Rngs):
        self.weight = nnx.Param(linear_init(d_in, d_out, precision, rngs), logical=axes)
        self.precision = precision
        self.weight_bits, self.activation_bits = cfg.weight_bits, cfg.activation_bits

    def __call__(self, x: jax.Array) -> jax.Array:
        w = self.weight[...]  # (O, I) float32
        if self.weight_bits:
            w = fake_quant(w, self.weight_bits, (0,))
        x = self.precision.cast(x)  # (..., I)
        if self.activation_bits:
            x = fake_quant(x, self.activation_bits, tuple(range(x.ndim - 1)))
        return dense(x, self.precision.cast(w))  # (..., O)
