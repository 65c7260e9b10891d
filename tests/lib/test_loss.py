"""compute.loss_chunk: the blockwise LM head + cross-entropy is the whole-logits function (loss, gradients,
accuracy) at prime sizes, tied or not, in bfloat16, under remat, scanned layers, LoRA, QAT and gradient
accumulation; its block geometry and the memory estimator's term by hand. Against torchref's loss:
tests/parity/test_loss_torch.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlm.analysis import memory
from jaxlm.core.config import ComputeConfig, Config, LoraConfig, ModelConfig, QatConfig, TrainConfig, load_config
from jaxlm.core.errors import ConfigError
from jaxlm.nn.loss import block_positions, chunk_tokens, cross_entropy, lm_loss, lm_terms, token_accuracy
from jaxlm.nn.model import TransformerLM
from jaxlm.training.step import build_model, split_model
from tests.train_helpers import max_rel_diff, run_steps, tiny_overrides

V, D, N, L, CTX = 97, 48, 4, 2, 16
B, T = 3, 13  # B x T = 39 tokens: no block size below divides it
# chunk -> positions per block: 5 -> 1 (13 blocks), 10 -> 3 (5 blocks, 2 positions padded)
CHUNKS = [5, 10]


def cfg_for(**kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, context_length=CTX, d_model=D, num_layers=L, num_heads=N), **kw})


def batch(seed: int = 1):
    tok = np.random.default_rng(seed).integers(0, V, (B, T + 1))
    return jnp.asarray(tok[:, :-1]), jnp.asarray(tok[:, 1:])


def loss_and_grads(model, x, y):
    graphdef, params, rest = split_model(model)
    value, grads = jax.value_and_grad(lambda p: lm_loss(nnx.merge(graphdef, p, rest), x, y))(params)
    return float(value), grads


def build(cfg: ModelConfig, chunk: int, **compute):
    return TransformerLM(cfg, ComputeConfig(loss_chunk=chunk, **compute), rngs=nnx.Rngs(1))


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_loss_and_gradients_equal_the_whole_logits(chunk, tie):
    cfg, (x, y) = cfg_for(tie_embeddings=tie), batch()
    whole, chunked = build(cfg, 0), build(cfg, chunk)
    assert block_positions(chunked.compute, V, B, T) < T  # really in blocks
    l0, g0 = loss_and_grads(whole, x, y)
    l1, g1 = loss_and_grads(chunked, x, y)
    assert abs(l1 - l0) <= 1e-6 * abs(l0)
    assert max_rel_diff(g1, g0) <= 1e-6


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_bfloat16_loss_equal_and_gradients_within_bfloat16_rounding(tie):
    """The loss is the same float32 reduction of the same bfloat16 logits; the head's weight gradient is summed
    over blocks in float32 instead of rounded to bfloat16 once, so gradients agree to bfloat16's precision."""
    cfg, (x, y) = cfg_for(tie_embeddings=tie), batch()
    l0, g0 = loss_and_grads(build(cfg, 0, dtype="bfloat16"), x, y)
    l1, g1 = loss_and_grads(build(cfg, 10, dtype="bfloat16"), x, y)
    assert abs(l1 - l0) <= 1e-6 * abs(l0)
    assert max_rel_diff(g1, g0) <= 1e-2


def test_evaluation_loss_and_accuracy_unchanged():
    cfg, (x, _) = cfg_for(), batch()
    whole, chunked = build(cfg, 0), build(cfg, 10)
    logits = whole(x)  # (B, T, V)
    hit = np.arange(B * T).reshape(B, T) % 3 == 0  # 13 of the 39 targets are the model's own argmax
    y = jnp.where(hit, jnp.argmax(logits, -1), (jnp.argmax(logits, -1) + 1) % V)
    (nll0, hit0), (nll1, hit1) = lm_terms(whole, x, y), lm_terms(chunked, x, y)  # (B, T) each
    assert np.array_equal(hit0, hit1)
    assert float(jnp.mean(hit1)) == float(token_accuracy(logits, y)) == pytest.approx(13 / 39)
    assert float(jnp.mean(nll1)) == pytest.approx(float(cross_entropy(logits, y)), rel=1e-6)
    np.testing.assert_allclose(nll1, nll0, rtol=1e-6)


@pytest.mark.parametrize("compute", [pytest.param(dict(remat="full"), marks=pytest.mark.extended),
                                     dict(remat="dots_saveable", scan_layers=True)], ids=["full", "dots_saveable-scan"])
def test_remat_and_scanned_layers(compute):
    """[full] is extended: [dots_saveable-scan] takes the chunked loss through remat (and scanned layers)."""
    cfg, (x, y) = cfg_for(), batch()
    l0, g0 = loss_and_grads(build(cfg, 0, **compute), x, y)
    l1, g1 = loss_and_grads(build(cfg, 10, **compute), x, y)
    assert abs(l1 - l0) <= 1e-6 * abs(l0)
    assert max_rel_diff(g1, g0) <= 1e-6


@pytest.mark.extended
@pytest.mark.parametrize("kind", ["lora", "qat"])
def test_lora_and_qat(kind):
    """The head is a plain Linear (or the tied embedding) under both: the blocks see LoRA/QAT, the loss is unchanged.
    Extended: the chunked head is test_chunked_loss_and_gradients_equal_the_whole_logits's, LoRA and QAT blocks
    are test_peft.py's."""
    cfg, (x, y) = cfg_for(), batch()
    extra = dict(lora=LoraConfig(rank=4)) if kind == "lora" else dict(qat=QatConfig(weight_bits=8, activation_bits=8))
    (l0, g0), (l1, g1) = (loss_and_grads(build_model(Config(model=cfg, compute=ComputeConfig(loss_chunk=c),
                                                             train=TrainConfig(seed=3), **extra)), x, y)
                          for c in (0, 10))
    assert abs(l1 - l0) <= 1e-6 * abs(l0)
    assert max_rel_diff(g1, g0) <= 1e-6


def test_training_with_accumulation_follows_the_same_trajectory(tmp_path):
    """Six train steps (micro-batches of 4 x 32: chunk 23 gives 5 positions per block, 3 padded) and the eval step."""
    from jaxlm.core import sharding
    from jaxlm.training.loop import build as build_run

    mesh = sharding.make_mesh(jax.devices()[:1])
    cfgs = [load_config(None, tiny_overrides("/unused", "/unused", **{"train.grad_accum": 2, "compute.loss_chunk": c}))
            for c in (0, 23)]
    assert block_positions(cfgs[1].compute, 257, 4, 32) == 5
    (t0, p0), (t1, p1) = (run_steps(c, mesh, 6) for c in cfgs)
    np.testing.assert_allclose(t1, t0, rtol=1e-6, atol=0)
    assert max_rel_diff(p1, p0) < 1e-5
    x = jnp.asarray(np.random.default_rng(0).integers(0, 257, (8, 33)), jnp.int32)
    mask = jnp.ones((8, 32), jnp.float32).at[5:].set(0.0)  # a padded last batch: 3 rows not scored
    evals = []
    for c in cfgs:
        b = build_run(c, mesh)
        evals.append(b.eval_fn(jax.jit(b.make_state)(), x[:, :-1], x[:, 1:], mask))
    assert float(evals[0]["correct"]) == float(evals[1]["correct"]) and float(evals[1]["tokens"]) == 5 * 32
    assert float(evals[1]["loss_sum"]) == pytest.approx(float(evals[0]["loss_sum"]), rel=1e-6)


def test_block_geometry_and_default():
    c = ComputeConfig
    assert block_positions(c(loss_chunk=1024), 50257, 128, 256) == 8  # 32 blocks of 128 x 8 tokens
    assert block_positions(c(loss_chunk=1024), 50257, 5, 256) == 128  # 204 per row at most: 2 blocks of 128
    assert block_positions(c(loss_chunk=256), 65, 12, 64) == 16  # 21 per row at most: 4 blocks of 16, none padded
    assert block_positions(c(loss_chunk=10), V, 3, 13) == 3
    assert block_positions(c(loss_chunk=2), V, 3, 13) == 1  # fewer tokens than rows: one position of each
    assert block_positions(c(loss_chunk=39), V, 3, 13) == 13  # the whole batch: one block, the whole logits
    assert block_positions(c(loss_chunk=0), 50257, 128, 256) == 256
    assert chunk_tokens(c(), 50257) == 1024 and chunk_tokens(c(), 32000) == 1024 and chunk_tokens(c(), 31999) == 0
    with pytest.raises(ConfigError, match=r"loss_chunk = -1: must be >= 0 or unset"):
        c(loss_chunk=-1)


def test_estimator_counts_one_block_of_logits():
    cfg = ModelConfig(vocab_size=50257, context_length=256, d_model=256, num_layers=4, num_heads=8, d_ff=1024,
                      tie_embeddings=True)
    def logits(chunk, backend, mesh=memory.Mesh()):
        return memory.estimate(cfg, 128, 256, ComputeConfig(loss_chunk=chunk), mesh=mesh,
                               backend=backend).activations["logits / loss"]

    assert logits(0, "cpu") == 128 * 256 * 50257 * 4 * 2 and logits(1024, "cpu") == 1024 * 50257 * 4 * 2
    assert logits(1024, "cpu", memory.Mesh(4)) == 256 * 50257 * 4 * 2  # the block's rows are split over devices too
    assert logits(1024, "gpu") == pytest.approx(logits(0, "gpu") * 1024 / (128 * 256))  # GPU calibration: same share
    cap, compute = 8 * 2**30, ComputeConfig(loss_chunk=1024)
    b = memory.largest_batch(cfg, 256, cap, compute)
    assert memory.estimate(cfg, b, 256, compute).total <= cap < memory.estimate(cfg, b + 1, 256, compute).total
    assert b > memory.largest_batch(cfg, 256, cap, ComputeConfig(loss_chunk=0))


def test_cross_entropy_and_accuracy():
    logits = jax.random.normal(jax.random.key(0), (3, 5, V)) * 4
    targets = jax.random.randint(jax.random.key(1), (3, 5), 0, V)
    x = np.asarray(logits, np.float64)
    ref = np.mean(np.log(np.exp(x).sum(-1)) - np.take_along_axis(x, np.asarray(targets)[..., None], -1)[..., 0])
    np.testing.assert_allclose(cross_entropy(logits, targets), ref, rtol=1e-6)
    big = logits + 1e4  # stable for huge logits
    np.testing.assert_allclose(cross_entropy(big, targets), ref, rtol=1e-3)
    assert cross_entropy(logits.astype(jnp.bfloat16), targets).dtype == jnp.float32
    acc = np.mean(np.argmax(x, -1) == np.asarray(targets))
    np.testing.assert_allclose(token_accuracy(logits, targets), acc)
