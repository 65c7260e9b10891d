"""Scaled dot-product attention with one signature and several implementations.

Layout: every array is (batch, seq, heads, head_dim), "BTNH", the layout
`jax.nn.dot_product_attention` uses. Queries have length T, keys/values length S
(S >= T for a KV-cache decode step). Keys and values may have fewer heads K than
the N query heads (grouped-query attention, N a multiple of K): query head n
attends with key/value head n // (N / K), as Llama's `repeat_kv` lays them out.

Masking semantics (shared by every implementation):

* Positions. Key j sits at position j (0 ... S-1), query t at position t. A
  decode step with a KV cache, whose queries sit elsewhere, passes ``causal=False``
  and its own ``mask`` (`TransformerLM.extend` builds it from each row's positions).
* causal: query at position i may attend key j iff ``j <= i``.
* window (sliding window, needs causal): query i may attend key j iff
  ``i - window <= j <= i``, i.e. it sees at most ``window`` *previous* keys plus
  itself (keys max(0, i-window) ... i, at most window+1 of them), exactly
  torchref's ``causal_mask`` and the `ModelConfig.window` comment. ``window=0``
  attends to itself only; ``window >= S - 1`` is plain causal attention. In
  `jax.nn.dot_product_attention` terms this is ``local_window_size=(window, 0)``
  (its left window counts keys strictly before the query), which JAX hands to
  cuDNN as a sliding-window length of ``window + 1`` (cuDNN counts the query's
  own key too).
* mask: an optional boolean array broadcastable to (batch, heads, T, S);
  True means "may attend". It is AND-ed with the causal/window mask.
  A query row with no visible key gets uniform weights over the masked keys
  (finite, never NaN); causal self-attention never builds such rows.

Implementations (``implementation=``):

* ``"xla"``: the reference. Plain einsums; logits, softmax (row max
  subtracted) in float32; probabilities cast to the value dtype for the second
  matmul. Supports dropout on the attention probabilities.
* ``"cudnn"``: `jax.nn.dot_product_attention(implementation="cudnn")`, the
  fused flash-style kernel. NVIDIA GPU (SM80+), bfloat16/float16, head_dim a
  multiple of 8 (<= 256 on Hopper, 128 before). No attention dropout. Sliding
  windows go through ``local_window_size=(window, 0)`` *with* ``is_causal=True``
  (cuDNN with a window and no causal mask is known to attend to the future).
  An explicit mask, or T != S, goes to cuDNN as a full (1, 1, T, S) boolean mask instead.
* ``"auto"``: ``"cudnn"`` when the inputs qualify (see `cudnn_supported`) and no
  dropout is requested, else ``"xla"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("xla", "cudnn", "auto")

# A large negative logit for masked keys: finite (exp underflows to exactly 0,
# and a fully masked row stays finite instead of NaN).
_MASKED = -1e30


# --------------------------------------------------------------------------- masks


def visibility_mask(q_len: int, k_len: int, *, causal: bool = True, window: int | None = None) -> jax.Array | None:
    """(T, S) boolean: True where query t may see key j. None when everything is visible (not causal, no window)."""
    if window is not None and not causal:
        raise ValueError("a sliding window needs causal=True (window is defined on past keys only)")
    if not causal:
        return None
    q_pos = jnp.arange(q_len)[:, None]  # (T, 1)
    k_pos = jnp.arange(k_len)[None, :]  # (1, S)
    mask = k_pos <= q_pos  # (T, S)
    if window is not None:
        mask = mask & (k_pos >= q_pos - window)  # (T, S)
    return mask


# --------------------------------------------------------------------------- cuDNN availability


def _compute_capability(devices) -> tuple[int, int] | None:
    """(major, minor) of the first NVIDIA GPU among `devices`, or None."""
    for d in devices:
        cc = getattr(d, "compute_capability", None)
        if d.platform == "gpu" and cc:
            major, minor = str(cc).split(".")[:2]
            return int(major), int(minor)
    return None


@functools.cache
def _attached_compute_capability() -> tuple[int, int] | None:
    try:
        return _compute_capability(jax.devices("gpu"))
    except RuntimeError:  # no GPU backend at all
        return None


_TARGET: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("jaxlm_attention_target", default=None)


@contextlib.contextmanager
def compiling_for(devices) -> Iterator[None]:
    """Inside the block the cuDNN guard asks `devices`, the GPUs a step is compiled for (a topology from
    jax.experimental.topologies on a machine without one), instead of the attached devices."""
    token = _TARGET.set(tuple(devices))
    try:
        yield
    finally:
        _TARGET.reset(token)


def _cuda_compute_capability() -> tuple[int, int] | None:
    """The GPU the computation is built for: the target of `compiling_for`, else the attached GPU."""
    target = _TARGET.get()
    return _compute_capability(target) if target is not None else _attached_compute_capability()


def cudnn_problem(dtype, head_dim: int) -> str | None:
    """Why cuDNN fused attention cannot run `dtype` x `head_dim` on the target GPU, or None when it can."""
    cc = _cuda_compute_capability()
    if cc is None:
        return f"needs an NVIDIA GPU with cuDNN, but JAX sees only {jax.default_backend()!r} devices"
    if cc < (8, 0) or jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16) or head_dim % 8 \
            or head_dim > (256 if cc >= (9, 0) else 128):
        return (f"cannot run dtype {jnp.dtype(dtype)}, head_dim {head_dim} on compute capability {cc}: it needs "
                "bfloat16/float16, head_dim a multiple of 8 (<= 256 on Hopper, <= 128 before) and SM80+")
    return None


def cudnn_supported(q: jax.Array, k: jax.Array | None = None) -> bool:
    """True when cuDNN fused attention can run these inputs on this machine."""
    return (k is None or k.dtype == q.dtype) and cudnn_problem(q.dtype, q.shape[-1]) is None


def _check_cudnn(q: jax.Array, k: jax.Array) -> None:
    problem = cudnn_problem(q.dtype, q.shape[-1])
    if problem is None and k.dtype == q.dtype:
        return
    error = RuntimeError if _cuda_compute_capability() is None else ValueError
    raise error(f"attention implementation 'cudnn' {problem or 'needs q and k of one dtype'}; "
                "use implementation='xla' (the reference) or 'auto' (cuDNN where available, else XLA).")


# --------------------------------------------------------------------------- implementations


def _attention_xla(q, k, v, mask, dropout_rate, dropout_rng):
    """Reference attention. q (B,T,N,H), k/v (B,S,K,H), mask broadcastable to (B,N,T,S) or None."""
    scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
    # Heads-major operands put the batch axes (B, N) first, which XLA's CPU dot
    # handles several times faster than the BTNH layout (same arithmetic).
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))  # (B, N|K, T|S, H)
    B, N, T, H = q.shape
    K, S = k.shape[1], k.shape[2]
    if K == N:
        logits = jnp.einsum("BNTH,BNSH->BNTS", q, k, preferred_element_type=jnp.float32)  # (B, N, T, S)
    else:  # grouped-query: the G = N / K query heads of a group share one key head, without copying the keys
        q = q.reshape(B, K, N // K, T, H)  # (B, K, G, T, H)
        logits = jnp.einsum("BKGTH,BKSH->BKGTS", q, k, preferred_element_type=jnp.float32).reshape(B, N, T, S)
    logits = logits.astype(jnp.float32) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, _MASKED)  # (B, N, T, S)
    # softmax: subtract the row max first; the max gets no gradient (softmax does not depend on it), which
    # spares the backward pass the argmax mask and its sum over every (B, N, T, S) score.
    logits = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    weights = jnp.exp(logits)
    probs = weights / jnp.sum(weights, axis=-1, keepdims=True)  # (B, N, T, S), float32
    if dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    if K == N:
        out = jnp.einsum("BNTS,BNSH->BNTH", probs.astype(v.dtype), v)  # (B, N, T, H)
    else:
        probs = probs.reshape(B, K, N // K, T, S).astype(v.dtype)  # (B, K, G, T, S)
        out = jnp.einsum("BKGTS,BKSH->BKGTH", probs, v).reshape(B, N, T, H)  # (B, N, T, H)
    return jnp.swapaxes(out, 1, 2)  # (B, T, N, H)


def _attention_cudnn(q, k, v, *, causal, window, mask):
    T, S = q.shape[1], k.shape[1]
    if mask is None and T == S:
        # The fast path: cuDNN's own causal mask (skips masked blocks), window WITH is_causal.
        local = (window, 0) if window is not None else None
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=causal, local_window_size=local, implementation="cudnn"
        )
    # Explicit mask: one full-length boolean mask (cuDNN wants full T and S axes).
    full = visibility_mask(T, S, causal=causal, window=window)
    if full is None:
        full = jnp.ones((T, S), bool)
    full = full[None, None]  # (1, 1, T, S)
    if mask is not None:
        full = full & mask  # (B or 1, N or 1, T, S): T and S stay full length
    return jax.nn.dot_product_attention(q, k, v, mask=full, implementation="cudnn")


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    implementation: str = "xla",
    causal: bool = True,
    window: int | None = None,
    mask: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> jax.Array:
    """softmax(q k^T / sqrt(head_dim) + mask) v on (batch, seq, heads, head_dim) arrays.

    q: (B, T, N, H); k, v: (B, S, K, H) with S >= T and N a multiple of K; returns (B, T, N, H) in v's dtype.
    See the module docstring for the exact causal / window / mask semantics.
    Dropout on the attention probabilities is applied iff ``dropout_rate > 0``
    (pass 0 at evaluation time); it then needs ``dropout_rng`` and the XLA path.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {implementation!r}; known: {', '.join(IMPLEMENTATIONS)}")
    if q.ndim != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] \
            or k.ndim != 4 or q.shape[2] % k.shape[2]:
        raise ValueError(f"expected q (B,T,N,H) and k, v (B,S,K,H) with K dividing N; got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    if window is not None and window < 0:
        raise ValueError(f"window must be >= 0 or None, got {window}")
    if window is not None and not causal:
        raise ValueError("a sliding window needs causal=True (it is defined on past keys only)")
    if dropout_rate > 0.0 and dropout_rng is None:
        raise ValueError("attention dropout_rate > 0 needs a dropout_rng key")
    if mask is not None and mask.dtype != jnp.bool_:
        raise ValueError(f"mask must be boolean (True = may attend), got {mask.dtype}")

    if implementation == "auto":
        implementation = "cudnn" if dropout_rate == 0.0 and cudnn_supported(q, k) else "xla"
    if implementation == "cudnn":
        _check_cudnn(q, k)
        if dropout_rate > 0.0:
            raise ValueError(
                "cuDNN attention here has no attention-probability dropout; use implementation='xla' "
                "or 'auto' (which falls back to XLA when dropout is on), or set dropout to 0"
            )
        return _attention_cudnn(q, k, v, causal=causal, window=window, mask=mask)

    full = visibility_mask(q.shape[1], k.shape[1], causal=causal, window=window)
    if mask is not None:
        full = mask if full is None else full & mask  # broadcasts to (B, N, T, S)
    return _attention_xla(q, k, v, full, dropout_rate, dropout_rng)
