"""Rematerialisation: what each block keeps for the backward pass, applied in one place (`wrap`).

``compute.remat`` names a policy; `ComputeConfig.remat_policy` says which one runs (``none``
under scanned layers runs as ``dots_saveable``, the reason is in its docstring):

========================  ==========================================  ================================
``compute.remat``         unrolled layers keep, per block              scanned layers keep, per layer
========================  ==========================================  ================================
``none``                  everything the backward needs (XLA fuses     the matmul outputs (as
                          the cheap elementwise work into it)          ``dots_saveable``)
``full``                  only the block input                         only the layer input
``dots_saveable``         the matmul outputs                           the matmul outputs
``offload``               the matmul outputs, in host memory           the same
========================  ==========================================  ================================

Whatever is not kept is recomputed from the block input in the backward pass. `wrap` applies the
policy to the one per-layer function every layout runs (the unrolled loop, the `lax.scan` body, each
pipeline stage's scan), so the three cannot disagree; `jaxlm/analysis/memory.py` prices the same
`remat_policy`.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

from jaxlm.core.config import ComputeConfig


def _offload_policy():
    # Save matmul outputs to pinned host memory instead of recomputing them. Works on GPU/TPU backends
    # that expose a "pinned_host" memory kind; the CPU backend exposes one too (tested).
    return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")


# name -> jax.checkpoint policy factory; None: no remat at all.
POLICIES: dict[str, Callable[[], Any] | None] = {
    "none": None,
    "full": lambda: jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": lambda: jax.checkpoint_policies.dots_saveable,
    "offload": _offload_policy,
}


def check(name: str) -> None:
    if name not in POLICIES:
        raise ValueError(f"unknown remat policy {name!r}; known: {', '.join(POLICIES)}")


def wrap(fn: Callable, compute: ComputeConfig) -> Callable:
    """fn(layer, carry, x_i) rematerialised per layer under `compute.remat_policy`.

    In a scan body XLA cannot hoist the recomputation out of the loop, so common-subexpression
    elimination is left on there (prevent_cse=False); unrolled it is prevented, as jax advises.
    """
    make = POLICIES[compute.remat_policy]
    if make is None:
        return fn
    return nnx.remat(fn, policy=make(), prevent_cse=not compute.scan_layers)
