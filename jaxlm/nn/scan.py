"""Layers stacked on a leading ``layers`` axis and run by `lax.scan` (``compute.scan_layers``).

Unrolled, XLA compiles num_layers copies of the block; scanned, it compiles one body
and loops, so compile time stops growing with depth. The stacked module is the block
itself with every variable given a leading axis of num_layers (path
``layers/attn/q_proj/weight``, shape (L, d_out, d_in), logical axes ("layers", ...)):
`stack` builds it from separately initialised blocks (so both layouts start from the
same numbers) and `unstack` takes it apart again (torch conversion, tests).
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


def scan(module: nnx.Module, fn: Callable, carry: Any, xs: Any = None, policy: Any = None):
    """carry, ys = lax.scan over the stacked layers: fn(layer_i, carry, xs_i) -> (carry, y_i).

    `policy` (a jax.checkpoint policy) rematerialises inside the body, i.e. per layer.
    The layers are read, never written (no mutable state inside a block).
    """
    graphdef, state = nnx.split(module)

    def body(c, inp):
        layer_state, x_i = inp
        return fn(nnx.merge(graphdef, layer_state), c, x_i)

    if policy is not None:
        body = jax.checkpoint(body, policy=policy, prevent_cse=False)
    return jax.lax.scan(body, carry, (state, xs))
