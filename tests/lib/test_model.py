"""jaxlm.nn.model on CPU: RoPE, shapes, causality, precision, dropout, remat, scanned layers, names and init
(attention itself: test_attention.py).

Prime-ish sizes (d_model 48, 4 heads of 12, vocab 97, seq 13) so a swapped axis
cannot pass by accident.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.nn import remat as remat_lib
from jaxlm.nn.layers import RotaryEmbedding, apply_rope
from jaxlm.nn.loss import cross_entropy
from jaxlm.nn.model import TransformerLM

V, D, N, L, T, CTX = 97, 48, 4, 2, 13, 16
H = D // N


def small_cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=V, context_length=CTX, d_model=D, num_layers=L, num_heads=N)
    return ModelConfig(**{**base, **kw})


def tokens(batch=2, seq=T, seed=1):
    return jax.random.randint(jax.random.key(seed), (batch, seq), 0, V)


def lm_loss(model, tok, *, deterministic=True):
    """Next-token cross-entropy of tok (B, T+1): the train step's loss."""
    return cross_entropy(model(tok[:, :-1], deterministic=deterministic), tok[:, 1:])


# --------------------------------------------------------------------------- RoPE


def test_rope_position_zero_identity_norm_and_relative():
    rope = RotaryEmbedding(H, CTX, 10000.0)
    x = jax.random.normal(jax.random.key(0), (1, 1, N, H))
    cos, sin = rope(jnp.array([0]))
    np.testing.assert_allclose(apply_rope(x, cos, sin), x, atol=0)
    xs = jax.random.normal(jax.random.key(1), (1, T, N, H))
    rot = apply_rope(xs, *rope(jnp.arange(T)))
    np.testing.assert_allclose(jnp.linalg.norm(rot, axis=-1), jnp.linalg.norm(xs, axis=-1), rtol=1e-5)

    q, k = jax.random.normal(jax.random.key(2), (2, 1, 1, H))

    def score(pq, pk):
        return jnp.sum(apply_rope(q[None], *rope(jnp.array([pq]))) * apply_rope(k[None], *rope(jnp.array([pk]))))

    for shift in (1, 5):
        np.testing.assert_allclose(score(3, 1), score(3 + shift, 1 + shift), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(score(2, 7), score(2 + shift, 7 + shift), rtol=1e-5, atol=1e-5)


def test_rope_interleaved_pairs_and_angle():
    rope = RotaryEmbedding(H, CTX, 10000.0)
    x = jnp.zeros((1, 1, 1, H)).at[..., 2].set(1.0)  # pair k=1, first component
    p = 5
    out = apply_rope(x, *rope(jnp.array([p])))[0, 0, 0]
    angle = p * 10000.0 ** (-2 * 1 / H)
    expected = np.zeros(H)
    expected[2], expected[3] = np.cos(angle), np.sin(angle)
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_model_positions_are_honoured():
    model = TransformerLM(small_cfg(), rngs=nnx.Rngs(0))
    tok = tokens(seq=8)
    base = model(tok)
    np.testing.assert_array_equal(model(tok, jnp.arange(8)), base)
    # RoPE sees relative positions only: a constant shift leaves the logits unchanged
    np.testing.assert_allclose(model(tok, jnp.arange(8) + 5), base, atol=2e-4)
    # but a different arrangement changes them
    assert not np.allclose(model(tok, jnp.arange(8)[::-1] + 3), base, atol=1e-3)


# --------------------------------------------------------------------------- model


def test_shapes_and_dtypes():
    model = TransformerLM(small_cfg(), rngs=nnx.Rngs(0))
    logits = model(tokens())
    assert logits.shape == (2, T, V) and logits.dtype == jnp.float32
    with pytest.raises(ValueError, match="context_length"):
        model(tokens(seq=CTX + 1))


@pytest.mark.parametrize(
    "norm,rope,ffn", list(itertools.product(["pre", "post", "none"], [True, False], ["swiglu", "silu"]))
)
def test_causality_for_every_variant(norm, rope, ffn):
    model = TransformerLM(small_cfg(norm=norm, rope=rope, ffn=ffn, window=None), rngs=nnx.Rngs(0))
    tok = tokens()
    p = 7
    changed = tok.at[:, p].set((tok[:, p] + 1) % V)
    a, b = model(tok), model(changed)
    np.testing.assert_allclose(a[:, :p], b[:, :p], atol=1e-6, rtol=0)
    assert not np.allclose(a[:, p:], b[:, p:])


def test_sliding_window_model_only_sees_window():
    w = 3
    model = TransformerLM(small_cfg(num_layers=1, window=w), rngs=nnx.Rngs(0))
    tok = tokens()
    changed = tok.at[:, 2].set((tok[:, 2] + 1) % V)
    a, b = model(tok), model(changed)
    # with one layer, position i sees tokens i-w ... i only: positions > 2 + w are unaffected
    np.testing.assert_allclose(a[:, 2 + w + 1 :], b[:, 2 + w + 1 :], atol=1e-6, rtol=0)
    assert not np.allclose(a[:, 2 + w], b[:, 2 + w])


def test_bf16_compute_close_to_f32():
    """bfloat16 compute (float32 params, norms, softmax) vs float32: logits within 0.05 abs.

    bf16 keeps 8 significant bits (relative error ~4e-3 per rounding); with
    logits up to ~3 after two layers the observed max deviation is ~0.02 (seeds
    0-2), so 0.05 leaves 2.5x headroom. The float32 loss agrees to 1e-2 relative.
    """
    cfg = small_cfg()
    f32 = TransformerLM(cfg, rngs=nnx.Rngs(0))
    bf16 = TransformerLM(cfg, ComputeConfig(dtype="bfloat16"), rngs=nnx.Rngs(0))
    tok = tokens()
    a, b = f32(tok), bf16(tok)
    assert b.dtype == jnp.bfloat16
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nnx.state(bf16, nnx.Param)))
    np.testing.assert_allclose(b.astype(jnp.float32), a, atol=0.05)
    la, lb = cross_entropy(a, tok), cross_entropy(b, tok)
    assert lb.dtype == jnp.float32
    np.testing.assert_allclose(lb, la, rtol=1e-2)


def test_dropout_train_only_and_reproducible():
    tok = tokens()
    plain = TransformerLM(small_cfg(), rngs=nnx.Rngs(0))(tok)
    model = TransformerLM(small_cfg(dropout=0.3), rngs=nnx.Rngs(0))
    # same initial parameters whatever the dropout rate; deterministic=True ignores dropout
    np.testing.assert_array_equal(model(tok), plain)
    np.testing.assert_array_equal(model(tok, deterministic=True), plain)
    t1 = model(tok, deterministic=False)
    t2 = model(tok, deterministic=False)
    assert not np.allclose(t1, plain) and not np.allclose(t1, t2)  # the stream advances per call
    again = TransformerLM(small_cfg(dropout=0.3), rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(again(tok, deterministic=False), t1)  # reproducible for a fixed seed
    # also under jit with remat
    rem = TransformerLM(small_cfg(dropout=0.3), ComputeConfig(remat="full"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(nnx.jit(lambda m: m(tok, deterministic=False))(rem), t1, atol=1e-5)


def _flat_layers(model, grads_or_model, num_layers):
    """{(layer, path): array} of the block parameters, unrolled or stacked alike."""
    out = {}
    for path, v in nnx.to_flat_state(nnx.state(grads_or_model, nnx.Param)):
        if path[0] != "layers":
            out[path] = np.asarray(v[...])
        elif isinstance(path[1], int):
            out[(path[1],) + path[2:]] = np.asarray(v[...])
        else:
            out.update({(i,) + path[1:]: np.asarray(v[...][i]) for i in range(num_layers)})
    return out


def _layer_grads(cfg, tok, compute, deterministic=True):
    """(loss, {(layer, path): gradient}) of a fresh nnx.Rngs(0) model run with `compute`."""
    model = TransformerLM(cfg, compute, rngs=nnx.Rngs(0))
    loss, grads = nnx.jit(nnx.value_and_grad(lambda m: lm_loss(m, tok, deterministic=deterministic)))(model)
    return loss, _flat_layers(model, grads, cfg.num_layers)


@pytest.fixture(scope="module")
def plain_grads():
    """The loss and gradients of the unrolled 3-layer model without remat, that every policy must give."""
    return _layer_grads(small_cfg(num_layers=3), tokens(seq=T + 1), ComputeConfig())


@pytest.mark.parametrize("scanned", [False, True])
@pytest.mark.parametrize("policy", list(remat_lib.POLICIES))
def test_remat_policies_give_the_same_gradients_in_both_layouts(policy, scanned, plain_grads):
    """Every compute.remat policy, unrolled and scanned: the loss and gradients of the unrolled model without remat."""
    cfg, tok = small_cfg(num_layers=3), tokens(seq=T + 1)
    l0, g0 = plain_grads
    l1, g1 = _layer_grads(cfg, tok, ComputeConfig(remat=policy, scan_layers=scanned))
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    assert g0.keys() == g1.keys()
    for k in g0:
        np.testing.assert_allclose(g1[k], g0[k], atol=1e-6, err_msg=str(k))


def test_scanned_layers_match_unrolled_with_dropout():
    """compute.scan_layers: the same initial numbers (stacked on a layers axis), dropout masks, loss and gradients."""
    cfg, tok = small_cfg(num_layers=3, dropout=0.2), tokens(seq=T + 1)
    models = [TransformerLM(cfg, ComputeConfig(scan_layers=s), rngs=nnx.Rngs(0)) for s in (False, True)]
    assert models[1].layers.attn.q_proj.weight.shape == (3, D, D)
    p0, p1 = (_flat_layers(m, m, 3) for m in models)
    assert p0.keys() == p1.keys() and all(np.array_equal(p0[k], p1[k]) for k in p0)
    (l0, g0), (l1, g1) = (_layer_grads(cfg, tok, ComputeConfig(scan_layers=s), deterministic=False)
                          for s in (False, True))
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for k in g0:
        np.testing.assert_allclose(g1[k], g0[k], atol=1e-6, err_msg=str(k))


def test_scanned_layers_kv_cache_matches_unrolled():
    cfg, tok = small_cfg(num_layers=3), tokens(seq=8)
    outs = []
    for scan in (False, True):
        model = TransformerLM(cfg, ComputeConfig(scan_layers=scan), rngs=nnx.Rngs(0))
        cache = model.init_cache(2, 12)
        logits, cache = model.extend(tok[:, :6], cache, jnp.zeros(2, jnp.int32))
        step, cache = model.extend(tok[:, 6:7], cache, jnp.full(2, 6, jnp.int32))
        outs.append((logits, step, cache.layers[2][0]))
    for a, b in zip(*outs):
        np.testing.assert_allclose(b, a, atol=1e-5)


# --------------------------------------------------------------------------- names, shapes, init


def spec_table(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """docs/spec.md#parameters, written out: PyTorch name -> shape."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    table = {"token_embeddings.weight": (v, d)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        if cfg.norm != "none":
            table[p + "ln1.weight"] = (d,)
            table[p + "ln2.weight"] = (d,)
        for name in ("q_proj", "k_proj", "v_proj", "output_proj"):
            table[p + f"attn.{name}.weight"] = (d, d)
        table[p + "ffn.w1.weight"] = (f, d)
        table[p + "ffn.w2.weight"] = (d, f)
        if cfg.ffn == "swiglu":
            table[p + "ffn.w3.weight"] = (f, d)
    if cfg.norm != "none":
        table["ln_final.weight"] = (d,)
    if not cfg.tie_embeddings:
        table["lm_head.weight"] = (v, d)
    return table


def jax_table(model) -> dict[str, tuple[int, ...]]:
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {".".join(str(k) for k in path): tuple(var.shape) for path, var in flat}


@pytest.mark.parametrize(
    "kw", [{}, {"tie_embeddings": True}, {"norm": "none"}, {"ffn": "silu"}, {"norm": "post", "dropout": 0.1}]
)
def test_parameter_names_and_shapes_match_spec(kw):
    cfg = small_cfg(**kw)
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    assert jax_table(model) == spec_table(cfg)


def test_init_statistics():
    cfg = ModelConfig(vocab_size=1009, context_length=8, d_model=96, num_layers=1, num_heads=4, d_ff=256)
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    emb = np.asarray(model.token_embeddings.weight[...])
    assert abs(emb.std() - 0.986) < 0.02 and np.abs(emb).max() <= 3.0  # std of N(0,1) cut at +-3 is 0.986
    w1 = np.asarray(model.layers[0].ffn.w1.weight[...])
    std = np.sqrt(2 / (96 + 256))
    assert np.abs(w1).max() <= 3 * std + 1e-6
    np.testing.assert_allclose(w1.std(), 0.986 * std, rtol=0.05)
    np.testing.assert_array_equal(model.layers[0].ln1.weight[...], np.ones(96))
