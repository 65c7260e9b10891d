"""LoRA and QLoRA adapters on the model's Linear layers, and their merge into plain weights.

A target `Linear` (W stored (O, I)) is swapped in place for a `LoRALinear`:

    y = x W^T + (alpha / r) dropout(x) A^T B^T        A (r, I) uniform +-1/sqrt(I), B (O, r) zeros

so step 0 computes exactly the base model. A and B are `nnx.LoRAParam`; the train state
trains only those when a model has any (`jaxlm.step.split_model`), so the base gets no
gradient and no optimizer state. The base keeps its path (``.../q_proj/weight``) when it
stays float32; with ``lora.base = "nf4" | "int8"`` (QLoRA) it is stored as blockwise
codes + absmax scales (`jaxlm.quant`) and dequantised at every use.

The layers are ours rather than qwix's `LoraProvider` (which intercepts the einsum at
trace time): a module swap keeps the parameter paths that checkpoints, conversion to
torchref and the merge read.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlm.core.config import LoraConfig
from jaxlm.nn import quant
from jaxlm.nn.layers import dense
from jaxlm.nn.model import Linear


class LoRALinear(nnx.Module):
    """A frozen base weight (float32, or nf4 / int8 codes) plus the trainable low-rank update (alpha / r) B A."""

    def __init__(self, base: Linear, cfg: LoraConfig, rngs: nnx.Rngs):
        d_out, d_in = base.weight.shape
        self.precision, self.shape, self.kind = base.precision, (d_out, d_in), cfg.base
        if cfg.base == "float32":
            self.weight = base.weight
        else:
            codes, scales = quant.quantize_blockwise(base.weight[...], cfg.base, cfg.block_size)
            self.codes, self.scales = quant.Frozen(codes), quant.Frozen(scales)
        bound = 1.0 / math.sqrt(d_in)
        self.lora_a = nnx.LoRAParam(jax.random.uniform(rngs.params(), (cfg.rank, d_in), jnp.float32, -bound, bound))
        self.lora_b = nnx.LoRAParam(jnp.zeros((d_out, cfg.rank), jnp.float32))
        self.scale = cfg.alpha / cfg.rank
        self.dropout = nnx.Dropout(cfg.dropout, deterministic=True, rngs=rngs) if cfg.dropout > 0 else None

    def base_weight(self) -> jax.Array:
        """The frozen (O, I) weight in float32 (dequantised for QLoRA)."""
        if self.kind == "float32":
            return self.weight[...]
        return quant.dequantize_blockwise(self.codes[...], self.scales[...], self.kind, self.shape)

    def delta(self) -> jax.Array:
        """(alpha / r) B A: the (O, I) update the adapters add to the base weight."""
        return self.scale * self.lora_b[...] @ self.lora_a[...]

    def __call__(self, x: jax.Array) -> jax.Array:
        cast = self.precision.cast
        x = cast(x)  # (..., I)
        y = dense(x, cast(jax.lax.stop_gradient(self.base_weight())))  # (..., O)
        xd = self.dropout(x) if self.dropout is not None else x
        h = dense(xd, cast(self.lora_a[...]))  # (..., r)
        return y + self.scale * dense(h, cast(self.lora_b[...]))  # (..., O)


def _slots(model: nnx.Module, targets) -> list:
    return [(parent, name) for parent, name in quant.linear_slots(model) if name in targets]


def apply(model: nnx.Module, cfg: LoraConfig, rngs: nnx.Rngs) -> None:
    """Swap the target Linears for LoRALinears in place; nothing when lora.rank is 0."""
    if not cfg.rank:
        return
    for parent, name in _slots(model, cfg.targets):
        setattr(parent, name, LoRALinear(getattr(parent, name), cfg, rngs))


def merge(model: nnx.Module) -> None:
    """Fold every adapter into its base in place: LoRALinear -> Linear with W + (alpha / r) B A (float32)."""
    for parent, name in quant.linear_slots(model):
        layer = getattr(parent, name)
        if isinstance(layer, LoRALinear):
            plain = nnx.eval_shape(lambda: Linear(1, 1, precision=layer.precision, rngs=nnx.Rngs(0)))
            plain.weight = nnx.Param(layer.base_weight() + layer.delta())
            setattr(parent, name, plain)


def has_adapters(model: nnx.Module) -> bool:
    return bool(jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def _bytes(tree) -> int:
    return sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def memory_summary(params, opt_state, rest: nnx.State) -> dict[str, float]:
    """Counts and bytes of what a train state holds: trainable and frozen parameters, gradients, optimizer state.

    A gradient is one float32 per trainable parameter; frozen weights are the Params outside the
    trainable set plus the quantised bases (codes and scales), in the bytes they are stored in.
    """
    frozen = jax.tree.leaves(nnx.filter_state(rest, nnx.Param)) if jax.tree.leaves(params) else []
    codes = [a for a in jax.tree.leaves(nnx.filter_state(rest, quant.Frozen)) if a.dtype in (jnp.uint8, jnp.int8)]
    scales = [a for a in jax.tree.leaves(nnx.filter_state(rest, quant.Frozen)) if a.dtype == jnp.float32]
    n_quantised = sum(int(np.prod(a.shape)) * (2 if a.dtype == jnp.uint8 else 1) for a in codes)  # 2 nf4 per byte
    n_frozen = sum(int(np.prod(a.shape)) for a in frozen) + n_quantised
    frozen_bytes = _bytes(frozen) + _bytes(codes) + _bytes(scales)
    return {
        "trainable_params": sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params)),
        "frozen_params": n_frozen,
        "grad_bytes": _bytes(params),
        "optimizer_bytes": _bytes(opt_state),
        "frozen_bytes": frozen_bytes,
        "frozen_bytes_per_param": frozen_bytes / n_frozen if n_frozen else 0.0,
        "quantised_bytes_per_param": (_bytes(codes) + _bytes(scales)) / n_quantised if n_quantised else 0.0,
    }
