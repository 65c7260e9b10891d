"""LoRA and QLoRA: the adapted linear layer kind, its merge into plain weights, what a LoRA state holds.

`LoRALinear` is the kind `LinearKinds` (jaxlm/nn/model.py) builds for every target projection
when ``lora.rank`` > 0, in either layer layout:

    y = x W^T + (alpha / r) dropout(x) A^T B^T        A (r, I) uniform +-1/sqrt(I), B (O, r) zeros

so step 0 computes exactly the base model. A and B are `nnx.LoRAParam`; the train state
trains only those when a model has any (`jaxlm.training.step.split_model`), so the base gets no
gradient and no optimizer state. The base keeps the plain layer's path (``.../q_proj/weight``)
when it stays float32; with ``lora.base = "nf4" | "int8"`` (QLoRA) it is stored as blockwise
codes + absmax scales (`jaxlm/nn/quant.py`) and dequantised at every use.

The layer is ours rather than qwix's `LoraProvider`, which intercepts the einsum at trace time and
names its parameters after the op (``weight_lora_a``, A stored (I, r)): ours keep the paths that
checkpoints, the conversion to torchref and the merge read.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlm.core.config import LoraConfig
from jaxlm.nn import quant
from jaxlm.nn.layers import Linear, Precision, dense, linear_init
from jaxlm.nn.scan import LAYERS


class LoRALinear(nnx.Module):
    """A frozen base weight (float32, or nf4 / int8 codes) plus the trainable low-rank update (alpha / r) B A.

    Every array may carry a leading layers axis (scanned layers): the methods below work on either.
    """

    def __init__(self, d_in: int, d_out: int, axes: tuple[str, str], cfg: LoraConfig, *, precision: Precision,
                 rngs: nnx.Rngs):
        w = linear_init(d_in, d_out, precision, rngs)  # the plain layer's draw: same base as without LoRA
        self.precision, self.shape, self.axes = precision, (d_out, d_in), axes
        self.kind, self.block = cfg.base, cfg.block_size
        if cfg.base == "float32":
            self.weight = nnx.Param(w, logical=axes)
        else:
            codes, scales = quant.quantize_blockwise(w, cfg.base, cfg.block_size)
            self.codes, self.scales = quant.Frozen(codes), quant.Frozen(scales)
        bound = 1.0 / math.sqrt(d_in)
        self.lora_a = nnx.LoRAParam(jax.random.uniform(rngs.adapters(), (cfg.rank, d_in), jnp.float32, -bound, bound))
        self.lora_b = nnx.LoRAParam(jnp.zeros((d_out, cfg.rank), jnp.float32))
        self.scale = cfg.alpha / cfg.rank
        self.dropout = nnx.Dropout(cfg.dropout, deterministic=True, rngs=rngs["adapters"]) if cfg.dropout > 0 else None

    def base_weight(self) -> jax.Array:
        """The frozen (..., O, I) weight in float32 (dequantised for QLoRA)."""
        if self.kind == "float32":
            return self.weight[...]
        return quant.dequantize_blockwise(self.codes[...], self.scales[...], self.kind, self.shape)

    def set_base(self, w: jax.Array) -> None:
        """Store `w` (..., O, I) as the frozen base, quantised for QLoRA (train.init_from)."""
        if self.kind == "float32":
            self.weight[...] = w
        else:
            codes, scales = quant.quantize_blockwise(w, self.kind, self.block)
            self.codes[...], self.scales[...] = codes, scales

    def delta(self) -> jax.Array:
        """(alpha / r) B A: the (..., O, I) update the adapters add to the base weight."""
        return self.scale * self.lora_b[...] @ self.lora_a[...]

    def merged(self) -> Linear:
        """The plain layer holding W + (alpha / r) B A in float32."""
        w = self.base_weight() + self.delta()  # (..., O, I)
        plain = nnx.eval_shape(lambda: Linear(1, 1, precision=self.precision, rngs=nnx.Rngs(0)))
        plain.weight = nnx.Param(w, logical=(LAYERS, *self.axes) if w.ndim == 3 else self.axes)
        return plain

    def __call__(self, x: jax.Array) -> jax.Array:
        cast = self.precision.cast
        x = cast(x)  # (..., I)
        y = dense(x, cast(jax.lax.stop_gradient(self.base_weight())))  # (..., O)
        xd = self.dropout(x) if self.dropout is not None else x
        h = dense(xd, cast(self.lora_a[...]))  # (..., r)
        return y + self.scale * dense(h, cast(self.lora_b[...]))  # (..., O)


def _adapted(model: nnx.Module) -> list[tuple[tuple, LoRALinear]]:
    return [(path, m) for path, m in nnx.iter_graph(model) if isinstance(m, LoRALinear)]


def set_base(model: nnx.Module, base: nnx.State) -> None:
    """Give the model the Params `base` of a plain model of the same layer layout (QLoRA layers quantise theirs)."""
    weights = dict(nnx.to_flat_state(base))
    for path, layer in _adapted(model):
        if layer.kind != "float32":
            layer.set_base(weights.pop((*path, "weight"))[...])
    nnx.update(model, nnx.from_flat_state(weights))


def merge(model: nnx.Module) -> None:
    """Fold every adapter into its base in place: each LoRALinear becomes a plain Linear with W + (alpha / r) B A."""
    for path, layer in _adapted(model):
        parent = model
        for key in path[:-1]:
            parent = parent[key] if isinstance(key, int) else getattr(parent, key)
        setattr(parent, path[-1], layer.merged())


def has_adapters(model: nnx.Module) -> bool:
    return bool(jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def _bytes(tree) -> int:
    return sum(int(np.prod(a.shape)) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def memory_summary(params, opt_state, non_trainable: nnx.State) -> dict[str, float]:
    """Counts and bytes of what a train state holds: trainable and frozen parameters, gradients, optimizer state.

    A gradient is one float32 per trainable parameter; frozen weights are the Params outside the
    trainable set plus the quantised bases (codes and scales), in the bytes they are stored in.
    """
    frozen = jax.tree.leaves(nnx.filter_state(non_trainable, nnx.Param)) if jax.tree.leaves(params) else []
    bases = jax.tree.leaves(nnx.filter_state(non_trainable, quant.Frozen))  # quantised bases: codes and scales
    codes = [a for a in bases if a.dtype in (jnp.uint8, jnp.int8)]
    scales = [a for a in bases if a.dtype == jnp.float32]
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
