"""jaxlm.nn.attention on CPU against a float64 reference: causal rows, masks, sliding windows, decode steps,
dropout, and cuDNN's refusal without a GPU (its match with XLA on one).

Prime-ish sizes (d_model 48, 4 heads of 12, seq 13) so a swapped axis cannot pass by accident.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.nn.attention import attention, cudnn_supported, visibility_mask

N, H, T = 4, 12, 13  # heads, head size, sequence length


def qkv(B=2, Tq=T, S=T, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(kq, (B, Tq, N, H), dtype),
        jax.random.normal(kk, (B, S, N, H), dtype),
        jax.random.normal(kv, (B, S, N, H), dtype),
    )


def causal_rows(first: int, S: int, window=None) -> np.ndarray:
    """(S - first, S) bool: the causal (and window) rows of queries at positions first ... S-1."""
    i, j = np.arange(first, S)[:, None], np.arange(S)[None, :]
    return (j <= i) & ((i - j <= window) if window is not None else True)


def numpy_attention(q, k, v, mask, keep=None, rate=0.0):
    """float64 reference: softmax(q k^T / sqrt(H) masked) v, BTNH layout; mask (T, S) True = attend;
    keep (B, N, T, S): the probabilities dropout keeps (scaled by 1 / (1 - rate)), the rest set to 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if keep is not None:
        p = np.where(keep, p / (1.0 - rate), 0.0)
    return np.einsum("bnts,bsnh->btnh", p, v)


@pytest.mark.parametrize("window", [None, 0, 3])
@pytest.mark.parametrize("first", [0, 5])
def test_xla_attention_matches_float64_reference(window, first):
    """Causal (first = 0), and the last queries against every key with their position mask (a chunked step)."""
    Tq = T - first
    q, k, v = qkv(Tq=Tq, S=T)
    mask = causal_rows(first, T, window)
    out = attention(q, k, v, window=window) if first == 0 else attention(q, k, v, causal=False, mask=jnp.asarray(mask))
    np.testing.assert_allclose(out, numpy_attention(q, k, v, mask), atol=2e-6, rtol=1e-5)


def test_arbitrary_boolean_mask_matches_reference():
    q, k, v = qkv()
    mask = jax.random.bernoulli(jax.random.key(3), 0.6, (T, T)) | jnp.eye(T, dtype=bool)
    out = attention(q, k, v, causal=False, mask=mask)
    np.testing.assert_allclose(out, numpy_attention(q, k, v, np.asarray(mask)), atol=2e-6, rtol=1e-5)
    # causal AND mask
    out = attention(q, k, v, causal=True, mask=mask)
    both = np.asarray(mask) & np.tril(np.ones((T, T), bool))
    np.testing.assert_allclose(out, numpy_attention(q, k, v, both), atol=2e-6, rtol=1e-5)


def test_decode_step_rows_equal_full_attention():
    """A query block at positions p.. against keys 0..p+len equals those rows of the full pass."""
    q, k, v = qkv()
    full = attention(q, k, v, window=4)
    for p in (0, 6, T - 1):
        rows = jnp.asarray(causal_rows(p, p + 1, window=4)[-1:])  # (1, p + 1): query p's row
        step = attention(q[:, p : p + 1], k[:, : p + 1], v[:, : p + 1], causal=False, mask=rows)
        np.testing.assert_allclose(step, full[:, p : p + 1], atol=1e-6)
    # keys longer than needed (a preallocated cache): future slots are masked out by position
    step = attention(q[:, 6:7], k, v, causal=False, mask=jnp.asarray(causal_rows(6, T, window=4)[:1]))
    np.testing.assert_allclose(step, full[:, 6:7], atol=1e-6)


def test_window_at_least_seq_equals_plain_causal_exactly():
    q, k, v = qkv()
    plain = attention(q, k, v)
    for window in (T - 1, T, 10 * T):
        np.testing.assert_array_equal(attention(q, k, v, window=window), plain)


@pytest.mark.parametrize("window", [0, 1, 4, T - 2])
def test_window_equals_banded_mask_and_jax_local_window(window):
    q, k, v = qkv()
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    band = jnp.asarray((j <= i) & (i - j <= window))  # query i sees keys i-window ... i
    out = attention(q, k, v, window=window)
    np.testing.assert_array_equal(out, attention(q, k, v, causal=False, mask=band))
    np.testing.assert_array_equal(visibility_mask(T, T, window=window), band)
    # the mapping handed to cuDNN: local_window_size=(window, 0) together with is_causal=True
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(window, 0), implementation="xla")
    np.testing.assert_allclose(out, ref, atol=2e-6)


def test_window_without_causal_is_rejected():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="causal"):
        attention(q, k, v, causal=False, window=3)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU error message")
def test_cudnn_raises_clear_error_without_gpu():
    q, k, v = qkv(dtype=jnp.bfloat16, B=1)
    with pytest.raises(RuntimeError, match="NVIDIA GPU.*'xla'.*'auto'"):
        attention(q, k, v, implementation="cudnn")
    # auto falls back to the XLA reference here
    np.testing.assert_array_equal(attention(q, k, v, implementation="auto"), attention(q, k, v))


@pytest.mark.skipif(
    not cudnn_supported(jnp.zeros((1, 1, 1, 64), jnp.bfloat16)), reason="needs an NVIDIA GPU (SM80+) with cuDNN"
)
@pytest.mark.parametrize("window", [None, 0, 5, 100])
def test_cudnn_matches_xla_on_gpu(window):
    """Guards the local_window_size=(window, 0) mapping: a cuDNN window that lost causality would see future keys."""
    B, S, NH, HD = 2, 128, 4, 64
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk_, (B, S, NH, HD), jnp.bfloat16) for kk_ in (kq, kk, kv))
    ref = attention(q, k, v, window=window).astype(jnp.float32)
    out = attention(q, k, v, window=window, implementation="cudnn").astype(jnp.float32)
    np.testing.assert_allclose(out, ref, atol=2e-2)  # bf16 inputs and outputs: ~2 bf16 ulps at |x| ~ 1
    # a decode step (keys longer than queries, its own mask) goes through the explicit-mask path
    step = attention(q[:, 40:41], k, v, causal=False, mask=jnp.asarray(causal_rows(40, S, window)[:1]),
                     implementation="cudnn")
    np.testing.assert_allclose(step.astype(jnp.float32), ref[:, 40:41], atol=2e-2)


def test_attention_dropout():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="dropout_rng"):
        attention(q, k, v, dropout_rate=0.5)
    a = attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(0))
    b = attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(0))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, attention(q, k, v))
    # the mask is the key's Bernoulli draw over (B, N, T, S); dropped probabilities are those of the full softmax
    B, T_, N, _ = q.shape
    keep = np.asarray(jax.random.bernoulli(jax.random.key(0), 0.5, (B, N, T_, T_)))
    expected = numpy_attention(q, k, v, np.tril(np.ones((T_, T_), bool)), keep, 0.5)
    np.testing.assert_allclose(a, expected, atol=5e-6, rtol=1e-5)


