"""jaxlm vs torchref through parity/convert.py: lossless conversion, equal logits and gradients (CPU, float32)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import torchref
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.nn.loss import cross_entropy
from jaxlm.nn.model import TransformerLM
from parity.convert import jax_to_torch, torch_config, torch_to_jax

V, D, N, L, T, CTX = 97, 48, 4, 2, 13, 16

# float32 on CPU, same formulas, different summation orders: observed ~1e-6 on logits of size ~3.
LOGIT_ATOL = 2e-5
GRAD_ATOL = 2e-6


def cfg_for(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context_length=CTX, d_model=D, num_layers=L, num_heads=N), **kw})


@nnx.jit  # one compiled program: op-by-op dispatch compiles each op alone (seconds on a CPU)
def _jit_loss_grads(model: TransformerLM, x: jnp.ndarray, y: jnp.ndarray):
    return nnx.value_and_grad(lambda m: cross_entropy(m(x), y))(model)


VARIANTS = [
    {},
    {"norm": "post"},
    {"norm": "none"},
    {"rope": False},
    {"ffn": "silu"},
    {"tie_embeddings": True},
    {"window": 3},
]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_logits_match_torchref(kw):
    cfg = cfg_for(**kw)
    torch.manual_seed(0)
    ref = torchref.TransformerLM(torch_config(cfg)).eval()
    model = torch_to_jax(ref.state_dict(), TransformerLM(cfg, rngs=nnx.Rngs(1)))
    tok = np.random.default_rng(0).integers(0, V, (2, T))
    with torch.no_grad():
        expected = ref(torch.from_numpy(tok)).numpy()
    np.testing.assert_allclose(model(jnp.asarray(tok)), expected, atol=LOGIT_ATOL, rtol=0)
    # explicit positions reach RoPE identically
    pos = np.arange(T)[None].repeat(2, 0) + 2
    with torch.no_grad():
        expected = ref(torch.from_numpy(tok), torch.from_numpy(pos)).numpy()
    np.testing.assert_allclose(model(jnp.asarray(tok), jnp.asarray(pos)), expected, atol=LOGIT_ATOL, rtol=0)


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": True}, {"norm": "none", "ffn": "silu"}])
def test_round_trip_is_lossless(kw):
    cfg = cfg_for(**kw)
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    sd = jax_to_torch(model)
    ref = torchref.TransformerLM(torch_config(cfg))
    ref.load_state_dict(sd)  # strict: every key present, no extras
    assert set(sd) == set(ref.state_dict())
    back = jax_to_torch(torch_to_jax(ref.state_dict(), TransformerLM(cfg, rngs=nnx.Rngs(7))))
    for name, t in sd.items():
        assert torch.equal(back[name], t), name


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": True, "norm": "post", "ffn": "silu"}])
def test_scanned_layers_convert_and_match_torchref(kw):
    """compute.scan_layers: torch's layers.i.* load into the stacked arrays and back, losslessly;
    logits and gradients equal torchref's."""
    cfg = cfg_for(**kw)
    torch.manual_seed(0)
    ref = torchref.TransformerLM(torch_config(cfg))
    model = torch_to_jax(ref.state_dict(), TransformerLM(cfg, ComputeConfig(scan_layers=True), rngs=nnx.Rngs(1)))
    assert model.layers.ffn.w1.weight.shape[0] == L
    back = jax_to_torch(model)
    assert set(back) == set(ref.state_dict()) and all(torch.equal(back[k], v) for k, v in ref.state_dict().items())
    tok = np.random.default_rng(1).integers(0, V, (2, T + 1))
    x, y = tok[:, :-1], tok[:, 1:]
    logits = ref(torch.from_numpy(x))
    torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(y).reshape(-1)).backward()
    np.testing.assert_allclose(nnx.jit(lambda m, t: m(t))(model, jnp.asarray(x)), logits.detach().numpy(),
                               atol=LOGIT_ATOL, rtol=0)
    _, grads = _jit_loss_grads(model, jnp.asarray(x), jnp.asarray(y))
    graphdef, _, rest = nnx.split(model, nnx.Param, ...)
    grads = jax_to_torch(nnx.merge(graphdef, grads, rest))  # the gradients in torch's names
    for name, g in grads.items():
        if name != "lm_head.weight" or not cfg.tie_embeddings:
            np.testing.assert_allclose(g.numpy(), ref.get_parameter(name).grad.numpy(), atol=GRAD_ATOL, err_msg=name)


def test_conversion_errors_name_the_parameter():
    cfg = cfg_for()
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    sd = jax_to_torch(model)
    bad = dict(sd, **{"layers.1.ffn.w2.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match=r"layers\.1\.ffn\.w2\.weight"):
        torch_to_jax(bad, model)
    missing = {k: v for k, v in sd.items() if k != "ln_final.weight"}
    with pytest.raises(KeyError, match="ln_final.weight"):
        torch_to_jax(missing, model)


def test_loss_gradients_match_torchref():
    cfg = cfg_for()
    torch.manual_seed(0)
    ref = torchref.TransformerLM(torch_config(cfg))
    model = torch_to_jax(ref.state_dict(), TransformerLM(cfg, rngs=nnx.Rngs(1)))
    tok = np.random.default_rng(1).integers(0, V, (2, T + 1))
    x, y = tok[:, :-1], tok[:, 1:]
    logits = ref(torch.from_numpy(x))
    loss_t = torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(y).reshape(-1))
    loss_t.backward()
    loss_j, grads = _jit_loss_grads(model, jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_allclose(loss_j, loss_t.item(), rtol=1e-6)
    for path, g in nnx.to_flat_state(grads):
        name = ".".join(map(str, path))
        np.testing.assert_allclose(g[...], ref.get_parameter(name).grad.numpy(), atol=GRAD_ATOL, err_msg=name)


def test_torchref_config_mirrors_the_architecture_fields():
    """torchref keeps its own config class; parity's table must cover every field of both."""
    import dataclasses

    from jaxlm.core.errors import ConfigError
    from parity.convert import CONFIG_FIELDS, JAXLM_ONLY

    assert set(CONFIG_FIELDS) | set(JAXLM_ONLY) == {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(CONFIG_FIELDS.values()) == {f.name for f in dataclasses.fields(torchref.ModelConfig)}
    cfg = ModelConfig(d_model=96, num_heads=4, ffn="silu", window=5)
    mine = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in JAXLM_ONLY}
    assert dataclasses.asdict(torch_config(cfg)) == mine  # d_ff derived the same way too
    with pytest.raises(ConfigError, match="model.num_kv_heads = 2: torchref has no equivalent"):
        torch_config(ModelConfig(d_model=96, num_heads=4, num_kv_heads=2))  # grouped-query: transformers checks it
