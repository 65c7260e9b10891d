"""The language-model loss per position: from whole logits, or block by block without ever holding them.

`token_nll` is docs/spec.md's cross-entropy at each position (float32, max subtracted).
`blockwise_mean` computes the output projection and that same loss in blocks of positions
(``compute.loss_chunk``): a block is the same few positions of every row, so the batch stays
split over data-parallel devices. At a 50,257-token vocabulary the whole float32 logits of a
batch of 128 x 256 tokens are 6.6 GB, more than the rest of a small model's train step
(docs/techniques/loss-chunking.md).

Why a `jax.custom_vjp` that finishes each block's gradients in the forward pass (as Liger
Kernel's fused linear cross-entropy does) rather than `jax.checkpoint` per block: the loss ends
the graph, so its cotangent is one scalar and the gradients can be formed while the block's logits
exist; recomputing them in the backward pass costs a fourth head matmul (+24 % FLOPs per step
at the configuration above). Each block's gradients still come from `jax.vjp` of the model's own
projection and of `token_nll`, so casts, tied weights and sharding constraints need no hand-written rule.

Every loss entry point is here: `lm_loss` (training), `lm_terms` (evaluation), `cross_entropy` and
`token_accuracy` on whole logits; and the one rule for the block size, `block_positions`.

Shapes: B batch, T sequence, D d_model, V vocab, n blocks, c positions per block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp

from jaxlm.core.config import ComputeConfig

if TYPE_CHECKING:
    from jaxlm.nn.model import TransformerLM

Project = Callable[[jax.Array, jax.Array], jax.Array]  # (x (B, c, D), head weight (V, D)) -> logits (B, c, V)

# --------------------------------------------------------------------------- the block size

AUTO_CHUNK, AUTO_CHUNK_VOCAB = 1024, 32000  # compute.loss_chunk unset: 1024 tokens from this vocabulary on, else 0


def chunk_tokens(compute: ComputeConfig, vocab_size: int) -> int:
    """compute.loss_chunk with its unset default resolved for this vocabulary (0: whole logits). Unset, blocks
    from a 32,000-token vocabulary on: there the float32 logits are a large share of a step's memory, at no cost
    in CPU step time (docs/techniques/loss-chunking.md)."""
    if compute.loss_chunk is not None:
        return compute.loss_chunk
    return AUTO_CHUNK if vocab_size >= AUTO_CHUNK_VOCAB else 0


def block_positions(compute: ComputeConfig, vocab_size: int, batch: int, seq: int) -> int:
    """Positions of every row per block of the loss (seq: one block, the whole logits): the fewest blocks of at
    most `chunk_tokens` tokens, at least one position of each row (a chunk smaller than the batch is raised to
    one position per row), evened out to pad the least."""
    chunk = chunk_tokens(compute, vocab_size)
    if not chunk or chunk >= batch * seq:
        return seq
    blocks = -(-seq // max(1, chunk // batch))
    return -(-seq // blocks)


# --------------------------------------------------------------------------- per position


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


# --------------------------------------------------------------------------- in blocks


def _blocks(a: jax.Array, positions: int) -> jax.Array:
    """(B, T, ...) -> (n, B, c, ...): T padded with zeros to n whole blocks of c positions."""
    B, T = a.shape[:2]
    n = -(-T // positions)
    pad = [(0, 0), (0, n * positions - T)] + [(0, 0)] * (a.ndim - 2)
    return jnp.pad(a, pad).reshape(B, n, positions, *a.shape[2:]).swapaxes(0, 1)


def _unblock(a: jax.Array, T: int) -> jax.Array:
    """(n, B, c, ...) -> (B, T, ...), the padding dropped."""
    n, B, c = a.shape[:3]
    return a.swapaxes(0, 1).reshape(B, n * c, *a.shape[3:])[:, :T]


def blockwise(x: jax.Array, w: jax.Array, targets: jax.Array, project: Project, positions: int,
              accuracy: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """Per-position cross-entropy (B, T) float32 (and argmax == target (B, T)), `positions` of every row at a
    time: evaluation. x (B, T, D) is the final norm's output; to differentiate use `blockwise_mean`."""
    def block(xt):
        return token_terms(project(xt[0], w), xt[1], accuracy)  # (B, c), (B, c) or None

    nll, correct = jax.lax.map(block, (_blocks(x, positions), _blocks(targets, positions)))  # (n, B, c) each
    T = x.shape[1]
    return _unblock(nll, T), None if correct is None else _unblock(correct, T)


def blockwise_mean(x: jax.Array, w: jax.Array, targets: jax.Array, project: Project, positions: int) -> jax.Array:
    """Mean cross-entropy over all B x T positions, float32, computed `positions` of every row at a time; its
    gradients (w.r.t. x and the head weight w) are formed block by block in the forward pass."""
    T = x.shape[1]

    @jax.custom_vjp
    def mean_nll(x, w):
        return jnp.mean(blockwise(x, w, targets, project, positions)[0])

    def forward(x, w):
        B = x.shape[0]
        xs, ts = _blocks(x, positions), _blocks(targets, positions)  # (n, B, c, D), (n, B, c)
        real = _blocks(jnp.ones((B, T), jnp.float32), positions) / (B * T)  # d mean / d nll: 0 on the padding

        def block(dw, xtr):
            xb, tb, rb = xtr
            logits, project_vjp = jax.vjp(project, xb, w)  # (B, c, V)
            nll, nll_vjp = jax.vjp(lambda z: token_nll(z, tb), logits)  # (B, c)
            dxb, dwb = project_vjp(nll_vjp(rb)[0])  # (B, c, D), (V, D)
            return dw + dwb, (nll, dxb)

        dw, (nll, dx) = jax.lax.scan(block, jnp.zeros_like(w), (xs, ts, real))
        return jnp.mean(_unblock(nll, T)), (_unblock(dx, T), dw)

    def backward(grads, g):
        dx, dw = grads
        return (g * dx).astype(dx.dtype), g * dw

    mean_nll.defvjp(forward, backward)
    return mean_nll(x, w)


# --------------------------------------------------------------------------- the model's loss


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean over all positions of logsumexp(logits) - logits[target], in float32 (stable: max subtracted)."""
    return jnp.mean(token_nll(logits, targets))


def token_accuracy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean of argmax(logits) == target, float32."""
    return jnp.mean((jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32))


def _final(model: TransformerLM, tokens: jax.Array, deterministic: bool) -> tuple[jax.Array, int]:
    """The final norm's output (B, T, D) and the positions per block of the loss (T: the whole logits at once)."""
    B, T = tokens.shape
    x = model.final_norm(model.hidden(tokens, deterministic=deterministic))  # (B, T, D)
    return x, block_positions(model.compute, model.cfg.vocab_size, B, T)


def lm_loss(model: TransformerLM, tokens: jax.Array, targets: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """Float32 mean cross-entropy of the model's next-token predictions. With ``compute.loss_chunk`` the head
    and the loss run in blocks (`blockwise_mean`) and the whole logits (B, T, V) never exist: the same function."""
    x, positions = _final(model, tokens, deterministic)
    if positions < tokens.shape[1]:
        return blockwise_mean(x, model.head_weight(), targets, model.project, positions)
    return cross_entropy(model.project(x), targets)


def lm_terms(model: TransformerLM, tokens: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Evaluation, no dropout: the cross-entropy (B, T) float32 and argmax == target (B, T) at every position
    (in blocks with compute.loss_chunk)."""
    x, positions = _final(model, tokens, True)
    if positions < tokens.shape[1]:
        return blockwise(x, model.head_weight(), targets, model.project, positions, accuracy=True)
    return token_terms(model.project(x), targets, accuracy=True)
