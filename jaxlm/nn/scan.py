"""Layers stacked on a leading ``layers`` axis and run by `lax.scan` (``compute.scan_layers``).

Unrolled, XLA compiles num_layers copies of the block; scanned, it compiles one body
and loops, so compile time stops growing with depth. The stacked module is the block
itself with every variable given a leading axis of num_layers (path
``layers/attn/q_proj/weight``, shape (L, d_out, d_in), logical axes ("layers", ...)):
`stack` builds it from separately initialised blocks (so both layouts start from the
same numbers), `unstack` takes it apart again, and `relayout` moves a whole model
between the two (runs of either layout load into either).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

LAYERS = "layers"


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def stack(modules: list[nnx.Module]) -> nnx.Module:
    """Modules of one structure -> one module whose variables hold them stacked on axis 0."""
    graphdef, *_ = nnx.split(modules[0])
    states = [nnx.split(m)[1] for m in modules]

    def one(*vs):
        logical = vs[0].get_metadata().get("logical")
        extra = {} if logical is None else {"logical": (LAYERS, *logical)}
        return vs[0].replace(jnp.stack([v[...] for v in vs]), **extra)

    return nnx.merge(graphdef, jax.tree.map(one, *states, is_leaf=_is_var))


def unstack(module: nnx.Module, n: int) -> list[nnx.Module]:
    """The inverse of `stack`: n modules, the i-th holding slice i of every variable."""
    graphdef, state = nnx.split(module)

    def take(i):
        def one(v):
            logical = v.get_metadata().get("logical")
            extra = {} if logical is None else {"logical": tuple(logical[1:])}
            return v.replace(v[...][i], **extra)

        return nnx.merge(graphdef, jax.tree.map(one, state, is_leaf=_is_var))

    return [take(i) for i in range(n)]


def relayout(model: nnx.Module, scanned: bool) -> None:
    """Put `model.layers` (a TransformerLM's blocks) in the stacked (`scanned`) or the list layout, in place."""
    unrolled = isinstance(model.layers, nnx.List)
    if unrolled and scanned:
        model.layers = stack(list(model.layers))
    elif not unrolled and not scanned:
        model.layers = nnx.List(unstack(model.layers, model.cfg.num_layers))


def scan(module: nnx.Module, fn: Callable, carry: Any, xs: Any = None, *, advance_rngs: bool = False):
    """carry, ys = lax.scan over the stacked layers: fn(layer_i, carry, xs_i) -> (carry, y_i).

    advance_rngs (training): what the layers advanced of their own RNG streams (LoRA's adapter
    dropout) is written back to `module`, as the unrolled loop does. Off, the layers are only read,
    so `module` may come from outside the current trace (a decoding loop).
    """
    graphdef, state = nnx.split(module)

    def body(c, inp):
        layer_state, x_i = inp
        layer = nnx.merge(graphdef, layer_state)
        c, y = fn(layer, c, x_i)
        return c, (y, nnx.state(layer, nnx.RngState))

    carry, (ys, rng) = jax.lax.scan(body, carry, (state, xs))
    if advance_rngs and jax.tree.leaves(rng):
        nnx.update(module, rng)
    return carry, ys
