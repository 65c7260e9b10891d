"""The GPipe pipeline over the mesh's ``pipeline`` axis: scanned layers split into stages (`shard_map` + `ppermute`)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx


def pipeline_stages(axis: str = "pipeline") -> int:
    """Size of the mesh's pipeline axis under the current mesh (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    return 1 if mesh.empty or axis not in mesh.shape else mesh.shape[axis]


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle share: each stage works M of the M + P - 1 ticks."""
    return (stages - 1) / (microbatches + stages - 1)


def pipeline(module: nnx.Module, fn: Callable, x: jax.Array, xs: Any = None, *, microbatches: int,
             axis: str = "pipeline") -> jax.Array:
    """`scan`'s result for the carry x (B, ...), computed by a GPipe schedule over mesh axis `axis`.

    The stacked layers' leading axis is split over `axis` (stage s holds its L/P layers);
    the batch is cut into `microbatches` (rows j, j+M, ... form micro-batch j, so every
    device keeps its rows). In M + P - 1 ticks stage 0 takes micro-batch t, every stage
    runs its layers on what it holds and `ppermute` hands the result one stage on; the
    last stage's outputs, summed over `axis` (zeros elsewhere), give every stage the batch.
    Reverse-mode autodiff of the loop is GPipe's backward pass (ppermute reversed). The layers'
    own state is read, never written: config.py refuses LoRA adapter dropout with a pipeline.
    `xs`: per-layer random keys (dropout); micro-batch m runs with each key folded with m, so
    rows of different micro-batches draw different masks, as they would in one batch.
    """
    graphdef, state = nnx.split(module)
    M, B = microbatches, x.shape[0]
    mb = x.reshape(B // M, M, *x.shape[1:]).swapaxes(0, 1)  # (M, B/M, ...)
    keyed = xs is not None
    xs = xs if keyed else jnp.zeros((jax.tree.leaves(state)[0].shape[0],), jnp.int32)  # (L,) placeholder

    def stage(layer_state, h, stage_xs):  # this stage's L/P layers on h (B/M, ...)
        def body(c, inp):
            s, x_i = inp
            return fn(nnx.merge(graphdef, s), c, x_i if keyed else None)

        return jax.lax.scan(body, h, (layer_state, stage_xs))[0]

    def gpipe(layer_state, stage_xs, mb):
        P, i = jax.lax.axis_size(axis), jax.lax.axis_index(axis)
        shift = [(j, (j + 1) % P) for j in range(P)]

        def tick(carry, t):
            held, out = carry  # (B/M, ...), (M, B/M, ...)
            m = jnp.clip(t - i, 0, M - 1)  # the micro-batch this stage holds at tick t
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(stage_xs, m) if keyed else stage_xs  # (L/P,)
            y = stage(layer_state, jnp.where(i == 0, mb[jnp.minimum(t, M - 1)], held), keys)
            done = jnp.maximum(t - (P - 1), 0)  # the micro-batch the last stage finishes at tick t
            keep = (i == P - 1) & (t >= P - 1)
            out = jax.lax.dynamic_update_index_in_dim(out, jnp.where(keep, y, out[done]), done, 0)
            return (jax.lax.ppermute(y, axis, shift), out), None

        init = jax.lax.pcast((jnp.zeros_like(mb[0]), jnp.zeros_like(mb)), (axis,), to="varying")  # per-stage values
        (_, out), _ = jax.lax.scan(tick, init, jnp.arange(M + P - 1))
        return jax.lax.psum(out, axis)  # (M, B/M, ...): nonzero only on the last stage before the sum

    spec = jax.sharding.PartitionSpec(axis)
    run = jax.shard_map(gpipe, in_specs=(spec, spec, jax.sharding.PartitionSpec()),
                        out_specs=jax.sharding.PartitionSpec(), axis_names={axis})
    out = run(state, xs, mb)  # (M, B/M, ...)
    return out.swapaxes(0, 1).reshape(x.shape)
