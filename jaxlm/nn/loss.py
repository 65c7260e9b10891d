"""The language-model loss per position: from whole logits, or block by block without ever holding them.

`token_nll` is docs/spec.md's cross-entropy at each position (float32, max subtracted).
`blockwise` computes the output projection and that same cross-entropy in blocks of positions
(``compute.loss_chunk``): a block is the same few positions of every row, so the batch stays
split over data-parallel devices, and each block's logits are recomputed in the backward pass
instead of being kept. At a 50,257-token vocabulary the whole logits of a batch of 128 x 256
tokens are 6.6 GB in float32, more than the rest of a small model's step (docs/techniques/loss-chunking.md).

Why `lax.map` over `jax.checkpoint`ed blocks rather than a `jax.custom_vjp`: JAX derives the
backward from the forward's own code, so the bfloat16 casts, tied weights, sharding constraints
and LoRA/QAT layers need no hand-written gradient to keep in step with them.

Shapes: B batch, T sequence, D d_model, V vocab, n blocks, c positions per block.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """logsumexp(logits) - logits[target] at each position, float32: (..., V), (...) -> (...)."""
    logits = logits.astype(jnp.float32)  # (..., V)
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))  # (..., 1)
    lse = jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1)) + m[..., 0]  # (...,)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]  # (...,)
    return lse - target_logit


def token_terms(logits: jax.Array, targets: jax.Array, accuracy: bool) -> tuple[jax.Array, jax.Array | None]:
    """(cross-entropy, argmax == target or None) at each position of (..., V) logits."""
    correct = jnp.argmax(logits, axis=-1) == targets if accuracy else None
    return token_nll(logits, targets), correct


def blockwise(x: jax.Array, targets: jax.Array, project: Callable[[jax.Array], jax.Array], positions: int,
              accuracy: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """Per-position cross-entropy (B, T) float32 (and correctness (B, T) bool), `positions` per row at a time.

    x (B, T, D): the final norm's output; project: (B, c, D) -> logits (B, c, V), the model's own head.
    T is padded up to whole blocks; the padding's terms are computed and dropped.
    """
    B, T, D = x.shape
    n = -(-T // positions)
    pad = n * positions - T
    xs = jnp.pad(x, ((0, 0), (0, pad), (0, 0))).reshape(B, n, positions, D).swapaxes(0, 1)  # (n, B, c, D)
    ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(B, n, positions).swapaxes(0, 1)  # (n, B, c)

    def block(xt):
        return token_terms(project(xt[0]), xt[1], accuracy)  # (B, c), (B, c) or None

    nll, correct = jax.lax.map(jax.checkpoint(block, prevent_cse=False), (xs, ts))  # (n, B, c) each

    def unblock(a):
        return None if a is None else a.swapaxes(0, 1).reshape(B, n * positions)[:, :T]  # (B, T)

    return unblock(nll), unblock(correct)
