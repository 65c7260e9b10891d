"""torchref's layers and LM, through the CS336 adapters, against independent expectations.

The expectations come from torch.nn.functional, float64 formulas written out
here, or analytic properties (RoPE at position 0, norm preservation, relative
positions, causality), never from torchref itself.
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import torchref
from tests import adapters
from torchref import ModelConfig

torch.manual_seed(0)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def test_linear_and_embedding_match_functional():
    w, x = rand(7, 5), rand(3, 4, 5)
    torch.testing.assert_close(adapters.run_linear(5, 7, w, x), F.linear(x, w))
    emb, ids = rand(11, 6), torch.randint(0, 11, (2, 9))
    torch.testing.assert_close(adapters.run_embedding(11, 6, emb, ids), F.embedding(ids, emb))


def test_swiglu_matches_formula():
    w1, w2, w3, x = rand(24, 8), rand(8, 24), rand(24, 8), rand(2, 5, 8)
    expected = F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w3), w2)
    torch.testing.assert_close(adapters.run_swiglu(8, 24, w1, w2, w3, x), expected)


def test_silu_softmax_rmsnorm():
    x = rand(4, 13) * 30  # large values exercise the max subtraction
    torch.testing.assert_close(adapters.run_silu(x), F.silu(x))
    for dim in (0, 1, -1):
        torch.testing.assert_close(adapters.run_softmax(x, dim), F.softmax(x, dim=dim))
    big = torch.tensor([[1000.0, 1000.0, -1000.0]])
    assert torch.isfinite(adapters.run_softmax(big, -1)).all()
    g = rand(13)
    x64 = x.double()
    expected = (x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * g.double()).float()
    torch.testing.assert_close(adapters.run_rmsnorm(13, 1e-5, g, x), expected)
    torch.testing.assert_close(adapters.run_rmsnorm(13, 1e-5, g, x), F.rms_norm(x, (13,), g, eps=1e-5))
    bf = adapters.run_rmsnorm(13, 1e-5, g, x.bfloat16())
    assert bf.dtype == torch.bfloat16


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_sdpa_with_mask_and_any_leading_axes(lead):
    q, k, v = rand(*lead, 5, 8), rand(*lead, 7, 8), rand(*lead, 7, 6)
    mask = torch.rand(*lead, 5, 7) > 0.3
    mask[..., 0] = True  # every query sees at least one key
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(adapters.run_scaled_dot_product_attention(q, k, v, mask), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        adapters.run_scaled_dot_product_attention(q, k, v),
        F.scaled_dot_product_attention(q, k, v),
        atol=1e-5,
        rtol=1e-5,
    )


# ------------------------------------------------------------------ an independent functional model


def rope_complex(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE as multiplication of consecutive pairs, read as complex numbers, by e^{i p w_k} (float64)."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones_like(freqs), positions.double()[..., None] * freqs)  # (..., S, d/2)
    xc = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


def functional_attention(x, w, prefix, heads, rope_theta=None, positions=None):
    b_shape, s, d = x.shape[:-2], x.shape[-2], x.shape[-1]

    def split(t):
        return t.unflatten(-1, (heads, d // heads)).transpose(-3, -2)

    q, k, v = (split(F.linear(x, w[f"{prefix}{n}_proj.weight"])) for n in "qkv")
    if rope_theta is not None:
        pos = torch.arange(s) if positions is None else positions
        q, k = rope_complex(q, pos, rope_theta), rope_complex(k, pos, rope_theta)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(out.transpose(-3, -2).reshape(*b_shape, s, d), w[f"{prefix}output_proj.weight"])


def functional_lm(w, ids, cfg: ModelConfig):
    def norm(x, name):
        return x if cfg.norm == "none" else F.rms_norm(x, (x.shape[-1],), w[name], eps=cfg.eps)

    def ffn(x, p):
        if cfg.ffn == "silu":
            return F.linear(F.silu(F.linear(x, w[p + "w1.weight"])), w[p + "w2.weight"])
        return F.linear(F.silu(F.linear(x, w[p + "w1.weight"])) * F.linear(x, w[p + "w3.weight"]), w[p + "w2.weight"])

    theta = cfg.rope_theta if cfg.rope else None
    x = F.embedding(ids, w["token_embeddings.weight"])
    for i in range(cfg.num_layers):
        p = f"layers.{i}."

        def attn(h):
            return functional_attention(h, w, p + "attn.", cfg.num_heads, theta)

        if cfg.norm == "post":
            h = norm(x + attn(x), p + "ln1.weight")
            x = norm(h + ffn(h, p + "ffn."), p + "ln2.weight")
        else:
            h = x + attn(norm(x, p + "ln1.weight"))
            x = h + ffn(norm(h, p + "ln2.weight"), p + "ffn.")
    return F.linear(norm(x, "ln_final.weight"), w["lm_head.weight"])


def expected_param_table(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """docs/spec.md#parameters, written out: name -> shape."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    table = {"token_embeddings.weight": (v, d), "lm_head.weight": (v, d)}
    if cfg.norm != "none":
        table["ln_final.weight"] = (d,)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        for n in ("q", "k", "v"):
            table[f"{p}attn.{n}_proj.weight"] = (d, d)
        table[f"{p}attn.output_proj.weight"] = (d, d)
        table[f"{p}ffn.w1.weight"], table[f"{p}ffn.w2.weight"] = (f, d), (d, f)
        if cfg.ffn == "swiglu":
            table[f"{p}ffn.w3.weight"] = (f, d)
        if cfg.norm != "none":
            table[f"{p}ln1.weight"] = table[f"{p}ln2.weight"] = (d,)
    return table


SMALL = dict(vocab_size=37, context_length=16, d_model=24, num_layers=2, num_heads=3, d_ff=40)
OPTIONS = list(itertools.product(["pre", "post", "none"], [True, False], ["swiglu", "silu"]))


@pytest.mark.parametrize("norm,rope,ffn", OPTIONS)
def test_lm_matches_functional_reference_for_every_option(norm, rope, ffn):
    cfg = ModelConfig(**SMALL, norm=norm, rope=rope, ffn=ffn)
    torch.manual_seed(1)
    model = torchref.TransformerLM(cfg)
    state = model.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == expected_param_table(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 11))
    expected = functional_lm({k: v.double() for k, v in state.items()}, ids, cfg)
    torch.testing.assert_close(model(ids).double(), expected, atol=2e-5, rtol=2e-5)


def test_adapter_lm_and_block_load_spec_state_dicts():
    cfg = ModelConfig(**SMALL)
    state = torchref.TransformerLM(cfg).state_dict()
    ids = torch.randint(0, cfg.vocab_size, (3, 9))  # shorter than context_length
    out = adapters.run_transformer_lm(37, 16, 24, 2, 3, 40, 10000.0, state, ids)
    torch.testing.assert_close(
        out.double(), functional_lm({k: v.double() for k, v in state.items()}, ids, cfg), atol=2e-5, rtol=2e-5
    )

    block_w = {k.removeprefix("layers.0."): v for k, v in state.items() if k.startswith("layers.0.")}
    x = rand(2, 9, 24)
    w64 = {k: v.double() for k, v in block_w.items()}
    x64 = x.double()
    h = x64 + functional_attention(F.rms_norm(x64, (24,), w64["ln1.weight"], eps=1e-5), w64, "attn.", 3, 10000.0)
    hn = F.rms_norm(h, (24,), w64["ln2.weight"], eps=1e-5)
    expected = h + F.linear(
        F.silu(F.linear(hn, w64["ffn.w1.weight"])) * F.linear(hn, w64["ffn.w3.weight"]), w64["ffn.w2.weight"]
    )
    torch.testing.assert_close(
        adapters.run_transformer_block(24, 3, 40, 16, 10000.0, block_w, x).double(), expected, atol=2e-5, rtol=2e-5
    )


def test_multihead_attention_adapters():
    d, h = 24, 4
    ws = [rand(d, d) / math.sqrt(d) for _ in range(4)]
    names = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "output_proj.weight"]
    w = dict(zip(names, ws))
    x = rand(2, 3, 10, d)  # two leading batch axes
    expected = functional_attention(x.double(), {k: v.double() for k, v in w.items()}, "", h)
    torch.testing.assert_close(
        adapters.run_multihead_self_attention(d, h, *ws, x).double(), expected, atol=1e-5, rtol=1e-5
    )
    pos = torch.randint(0, 32, (10,))
    expected = functional_attention(x.double(), {k: v.double() for k, v in w.items()}, "", h, 10000.0, pos)
    got = adapters.run_multihead_self_attention_with_rope(d, h, 32, 10000.0, *ws, x, token_positions=pos)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    default = adapters.run_multihead_self_attention_with_rope(d, h, 32, 10000.0, *ws, x)
    explicit = adapters.run_multihead_self_attention_with_rope(
        d, h, 32, 10000.0, *ws, x, token_positions=torch.arange(10)
    )
    torch.testing.assert_close(default, explicit)


def test_rope_hand_checkable_properties():
    d_k, theta = 16, 10000.0
    x = rand(2, 6, d_k)
    zero = torch.zeros(2, 6, dtype=torch.long)
    torch.testing.assert_close(adapters.run_rope(d_k, theta, 64, x, zero), x)  # position 0 is the identity
    pos = torch.randint(0, 64, (2, 6))
    y = adapters.run_rope(d_k, theta, 64, x, pos)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # rotations preserve norms
    pairs_in, pairs_out = x.unflatten(-1, (-1, 2)).norm(dim=-1), y.unflatten(-1, (-1, 2)).norm(dim=-1)
    torch.testing.assert_close(pairs_out, pairs_in)  # ... pair by pair (interleaved layout)
    torch.testing.assert_close(y, rope_complex(x, pos, theta), atol=1e-5, rtol=1e-5)
    # q.k depends only on the relative position: (m, n) and (m + s, n + s) agree.
    q, k = rand(d_k), rand(d_k)
    for m, n, s in [(3, 1, 5), (10, 10, 7), (0, 9, 20)]:
        a = adapters.run_rope(d_k, theta, 64, q, torch.tensor(m)) @ adapters.run_rope(
            d_k, theta, 64, k, torch.tensor(n)
        )
        b = adapters.run_rope(d_k, theta, 64, q, torch.tensor(m + s)) @ adapters.run_rope(
            d_k, theta, 64, k, torch.tensor(n + s)
        )
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # The first pair at position 1 turns by exactly 1 radian (theta^0).
    e = torch.zeros(d_k)
    e[0] = 1.0
    r = adapters.run_rope(d_k, theta, 64, e, torch.tensor(1))
    torch.testing.assert_close(r[:2], torch.tensor([math.cos(1.0), math.sin(1.0)]))


@pytest.mark.parametrize("norm,rope,ffn", [("pre", True, "swiglu"), ("post", False, "silu"), ("none", True, "swiglu")])
def test_causality_future_tokens_never_change_the_past(norm, rope, ffn):
    cfg = ModelConfig(**SMALL, norm=norm, rope=rope, ffn=ffn)
    model = torchref.TransformerLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, 12))
    base = model(ids)
    for t in range(12):
        changed = ids.clone()
        changed[0, t] = (changed[0, t] + 1) % cfg.vocab_size
        out = model(changed)
        torch.testing.assert_close(out[:, :t], base[:, :t])
        assert not torch.allclose(out[:, t:], base[:, t:])


def test_sliding_window_equals_banded_mask_and_fused_path():
    torch.manual_seed(3)
    cfg = ModelConfig(**SMALL, window=3)
    model = torchref.TransformerLM(cfg)
    fused = torchref.TransformerLM(cfg, fused_attention=True)
    fused.load_state_dict(model.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (2, 14))
    torch.testing.assert_close(fused(ids), model(ids), atol=1e-5, rtol=1e-5)
    mask = torchref.causal_mask(14, 14, 3)
    assert mask.sum(-1).tolist() == [1, 2, 3] + [4] * 11  # itself plus at most 3 previous keys
    full = torchref.TransformerLM(ModelConfig(**SMALL, window=100))
    full.load_state_dict(model.state_dict())
    plain = torchref.TransformerLM(ModelConfig(**SMALL))
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(full(ids), plain(ids))


def test_tied_embeddings_share_one_tensor():
    model = torchref.TransformerLM(ModelConfig(**SMALL, tie_embeddings=True))
    assert model.lm_head.weight is model.token_embeddings.weight
    assert model.num_params() == sum(p.numel() for p in model.parameters())


def truncated_std_ratio(c: float = 3.0) -> float:
    """Standard deviation of a unit normal cut at +-c: sqrt(1 - 2 c phi(c) / (2 Phi(c) - 1))."""
    phi = math.exp(-c * c / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(c / math.sqrt(2))
    return math.sqrt(1 - 2 * c * phi / mass)


def test_init_follows_spec():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=500, context_length=8, d_model=256, num_layers=1, num_heads=4, d_ff=512)
    state = torchref.TransformerLM(cfg).state_dict()
    ratio = truncated_std_ratio()  # 0.9866
    emb = state["token_embeddings.weight"]
    assert abs(emb.std().item() - ratio) < 0.01 and emb.abs().max() <= 3.0
    w1 = state["layers.0.ffn.w1.weight"]
    std = math.sqrt(2 / (256 + 512))
    assert abs(w1.std().item() / std - ratio) < 0.01
    assert w1.abs().max() <= 3 * std + 1e-6
    assert torch.equal(state["layers.0.ln1.weight"], torch.ones(256))


def test_context_length_is_enforced():
    model = torchref.TransformerLM(ModelConfig(**SMALL))
    with pytest.raises(ValueError, match="context_length"):
        model(torch.zeros(1, 17, dtype=torch.long))
