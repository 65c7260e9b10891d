"""Fine-tuning: train.init_from, LoRA (frozen base, zero step, merge), QLoRA storage, QAT and PTQ numerics."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxlm.core.config import (
    ComputeConfig,
    Config,
    LoraConfig,
    ModelConfig,
    QatConfig,
    TrainConfig,
    load_config,
)
from jaxlm.core.errors import CheckpointError, ConfigError
from jaxlm.nn import lora, quant, scan
from jaxlm.training.step import TrainState, build_model, make_train_step, split_model
from tests.train_helpers import make_corpus, tiny_overrides

CFG = ModelConfig(vocab_size=61, context_length=16, d_model=32, num_layers=2, num_heads=2, d_ff=64)
TOKENS = jax.random.randint(jax.random.key(1), (2, 16), 0, 61)


def lm(compute=ComputeConfig(), base=None, seed=3, **kinds):
    """CFG's LM as a run builds it (`build_model`), with the linear kinds `kinds` (lora=, qat=)."""
    return build_model(Config(model=CFG, compute=compute, train=TrainConfig(seed=seed), **kinds), base)


def lora_model(**kw):
    base = nnx.state(lm(), nnx.Param)
    return base, lm(lora=LoraConfig(rank=4, **kw), base=base)


def test_lora_step_zero_is_the_base_model():
    base, model = lora_model()
    plain = lm(base=base)
    np.testing.assert_array_equal(np.asarray(model(TOKENS)), np.asarray(plain(TOKENS)))


def _train(model, steps=2):
    tx = optax.adam(1e-2)
    graphdef, _, _ = split_model(model)
    state = TrainState.create(model, tx)
    step = jax.jit(make_train_step(graphdef, tx, lambda s: 1e-2))
    for _ in range(steps):
        state, _ = step(state, TOKENS, jnp.roll(TOKENS, -1, axis=1))
    return state


def test_lora_trains_only_the_adapters():
    _, model = lora_model(dropout=0.1)
    before = TrainState.create(model, optax.adam(1e-2))
    after = _train(model)
    names = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(after.params)}
    assert names and all(n.endswith(("lora_a", "lora_b")) for n in names)
    n_trainable = sum(a.size for a in jax.tree.leaves(after.params))
    assert sum(a.size for a in jax.tree.leaves(after.opt_state)) == 2 * n_trainable + 1  # mu, nu, count
    for b, a in zip(jax.tree.leaves(nnx.filter_state(before.non_trainable, nnx.Param)),
                    jax.tree.leaves(nnx.filter_state(after.non_trainable, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the frozen base
    assert not np.allclose(np.asarray(after.params["layers"][0]["attn"]["q_proj"]["lora_b"][...]), 0.0)
    m = lora.memory_summary(after.params, after.opt_state, after.non_trainable)
    assert m["trainable_params"] == n_trainable and m["optimizer_bytes"] == 4 * (2 * n_trainable + 1)


@pytest.mark.parametrize("base_kind", ["float32", "nf4"])
def test_merge_equals_adapted(base_kind):
    _, model = lora_model(base=base_kind, block_size=16)
    for _, layer in nnx.iter_graph(model):  # a nonzero update to fold in
        if isinstance(layer, lora.LoRALinear):
            layer.lora_b = nnx.LoRAParam(0.05 * jax.random.normal(jax.random.key(7), layer.lora_b.shape))
    adapted = np.asarray(model(TOKENS))
    lora.merge(model)
    assert not lora.has_adapters(model)
    np.testing.assert_allclose(np.asarray(model(TOKENS)), adapted, atol=1e-5, rtol=0)


def test_nf4_and_int8_dequantisation_within_bound():
    w = jax.random.normal(jax.random.key(0), (64, 256)) * 0.02
    codes, scales = quant.quantize_blockwise(w, "nf4", 64)
    assert codes.dtype == jnp.uint8 and codes.shape == (64, 4, 32)  # two 4-bit codes per byte
    err = jnp.abs(quant.dequantize_blockwise(codes, scales, "nf4", w.shape) - w)
    # NF4 rounds to the nearest level: at most half the widest gap between levels, times the block's absmax
    absmax = np.abs(np.asarray(w, np.float64)).reshape(64, 4, 64).max(-1, keepdims=True)  # (O, nb, 1)
    bound = np.broadcast_to(absmax * np.max(np.diff(quant.NF4.astype(np.float64))) / 2, (64, 4, 64)).reshape(w.shape)
    assert bool(np.all(np.asarray(err) <= bound * (1 + 1e-6)))
    assert float(jnp.max(err)) > 0.3 * bound.max()  # the bound is tight-ish
    codes, scales = quant.quantize_blockwise(w, "int8", 64)
    err = jnp.abs(quant.dequantize_blockwise(codes, scales, "int8", w.shape) - w)
    assert bool(jnp.all(err <= jnp.repeat(scales[..., 0], 64, axis=1) / 254 * (1 + 1e-5)))


@pytest.mark.parametrize("bits", [8, 4])
def test_ptq_round_trip_within_half_a_step(bits):
    w = jax.random.normal(jax.random.key(2), (32, 48))
    q = quant.quantize_weight(w, bits)
    assert q.qvalue.dtype == {8: jnp.int8, 4: jnp.int4}[bits] and q.scale.shape == (32, 1)
    err = jnp.abs(np.asarray(quant.dequantize_weight(q)) - w)
    assert bool(jnp.all(err <= q.scale / 2 * (1 + 1e-5)))
    top = int(jnp.max(jnp.abs(q.qvalue.astype(jnp.int32))))
    assert 2 ** (bits - 1) - 1 <= top <= 2 ** (bits - 1)  # qwix: absmax maps to the edge of [-2^(b-1), 2^(b-1) - 1]


def test_qat_off_equals_plain_training_and_gradients_pass_straight_through():
    plain, qat = lm(), lm(qat=QatConfig())
    a, b = _train(plain), _train(qat)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    x = jax.random.normal(jax.random.key(3), (4, 8))
    np.testing.assert_array_equal(np.asarray(jax.grad(lambda x: jnp.sum(quant.fake_quant(x, 4, (0,)) * 3.0))(x)), 3.0)
    model = lm(qat=QatConfig(weight_bits=4, activation_bits=8))
    assert isinstance(model.layers[0].attn.q_proj, quant.QATLinear)
    diff = np.abs(np.asarray(model(TOKENS)) - np.asarray(plain(TOKENS)))
    assert 0 < diff.max() < 2.0  # quantised, not broken


def _per_layer(state: nnx.State) -> dict[tuple, np.ndarray]:
    """{(layer, path): array} of a state, unrolled or stacked alike; (path,) outside the blocks."""
    out = {}
    for path, v in nnx.to_flat_state(state):
        a = np.asarray(jax.random.key_data(v[...]) if jnp.issubdtype(v[...].dtype, jax.dtypes.prng_key) else v[...])
        if path[0] != "layers":
            out[path] = a
        elif isinstance(path[1], int):
            out[(path[1],) + path[2:]] = a
        else:
            out.update({(i,) + path[1:]: a[i] for i in range(CFG.num_layers)})
    return out


def _steps(model, n=2):
    """Losses of n plain-SGD train steps (the real train step) and the trainable state after them."""
    tx = optax.sgd(0.5)
    graphdef, _, _ = split_model(model)
    state, step = TrainState.create(model, tx), jax.jit(make_train_step(graphdef, tx, lambda s: 0.5))
    out = []
    for _ in range(n):
        state, metrics = step(state, TOKENS, jnp.roll(TOKENS, -1, axis=1))
        out.append(float(metrics["loss"]))
    return out, state


@pytest.mark.parametrize("kind", ["lora", pytest.param("qlora", marks=pytest.mark.extended), "qat"])
def test_linear_kinds_scanned_equal_unrolled(kind):
    """LoRA (with adapter dropout), QLoRA (nf4 base) and QAT (4-bit weights) in scanned layers: the unrolled
    model's numbers stacked, and its losses and trained weights over two steps (adapter dropout streams
    advance alike). QAT's activation quantisation is left out: its rounding turns the layouts' 1e-7
    differences into whole quantisation steps. QLoRA is extended: its adapters take [lora]'s path, and a scanned
    nf4 base trains in the default suite in test_train.py's test_mesh_layouts_on_8_devices_equal_one_device."""
    kw = {"lora": {"lora": LoraConfig(rank=4, dropout=0.1)},
          "qlora": {"lora": LoraConfig(rank=4, base="nf4", block_size=16)},
          "qat": {"qat": QatConfig(weight_bits=4)}}[kind]
    unrolled, scanned = (lm(ComputeConfig(scan_layers=s), **kw) for s in (False, True))
    a, b = _per_layer(nnx.state(unrolled)), _per_layer(nnx.state(scanned))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    for i, (_, layer) in enumerate(nnx.iter_graph(unrolled)):  # a nonzero update in both layouts
        if isinstance(layer, lora.LoRALinear):
            layer.lora_b[...] = 0.05 * jax.random.normal(jax.random.key(i), layer.lora_b.shape)
    nnx.update(scanned.layers, nnx.state(scan.stack(list(unrolled.layers)), nnx.LoRAParam))
    (la, sa), (lb, sb) = _steps(unrolled), _steps(scanned)
    np.testing.assert_allclose(lb, la, rtol=1e-6)
    assert la[0] != la[1]
    a, b = _per_layer(sa.params), _per_layer(sb.params)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], atol=1e-6, err_msg=str(k))


@pytest.mark.extended
def test_scanned_lora_with_adapter_dropout_decodes():
    """Decoding runs the layers inside its own compiled loop, where they are only read: the greedy tokens of
    both layouts. Extended: scanned decoding is test_model.py's test_scanned_layers_kv_cache_matches_unrolled
    and test_generate_cli.py's test_a_run_decodes_in_the_other_layer_layout."""
    from jaxlm.nn.decode import Generator, SamplingParams

    kw = {"seed": 3, "lora": LoraConfig(rank=4, dropout=0.1)}
    unrolled, scanned = (Generator(lm(ComputeConfig(scan_layers=s), **kw)).generate(
        [[1, 2, 3, 4]], 6, SamplingParams(temperature=0.0)).tokens for s in (False, True))
    assert scanned == unrolled and len(unrolled[0]) == 6


@pytest.mark.parametrize("override, message", [
    ("lora.rank=-1", "lora.rank = -1: must be >= 1"),
    ('lora.targets=["q_proj", "qkv"]', "lora.targets = 'qkv': unknown target"),
    ("qat.weight_bits=3", "qat.weight_bits = 3: must be 4, 8 or unset"),
    ("qat.activation_bits=4", "qat.activation_bits = 4: must be 8 or unset"),
    ('lora.base="nf4"', "lora.base = 'nf4': set, but lora.rank = 0 turns LoRA off"),
    ("lora.alpha=8", "lora.alpha = 8.0: set, but lora.rank = 0 turns LoRA off"),
    ("lora.rank=513", r"lora.rank = 513: above min\(in, out\) = 512 of q_proj"),
    ('train.init_from=""', "train.init_from = '': must name a run directory"),
])
def test_bad_keys_are_one_line(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(None, [override])


# --------------------------------------------------------------------------- through the trainer

RUNS = pytest.mark.xdist_group("peft_runs")  # the tests of the runs below, on one worker: each run is trained once


@pytest.fixture(scope="session")
def base_run(tmp_path_factory):
    from jaxlm.training.loop import train

    tmp = tmp_path_factory.mktemp("peft")
    corpus = make_corpus(tmp / "corpus")
    out = train(load_config(None, tiny_overrides(corpus, tmp / "base", **{"train.steps": 10})))
    return corpus, tmp, out["val_loss"]


@RUNS
def test_init_from_lora_and_merge(base_run):
    from jaxlm.cli.lora import merge_run
    from jaxlm.training.checkpoint import restore_for_inference
    from jaxlm.training.loop import train

    corpus, tmp, base_val = base_run
    cfg = load_config(None, tiny_overrides(corpus, tmp / "lora", **{
        "train.steps": 3, "train.eval_every": 1, "train.init_from": f'"{tmp / "base"}"', "lora.rank": 4}))
    train(cfg)
    rows = [json.loads(l) for l in (tmp / "lora" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/loss"] for r in rows if r["kind"] == "eval"]
    assert evals[0] == pytest.approx(base_val, abs=1e-6)  # lr(0) = 0: step 1 is the base model exactly
    params = next(r for r in rows if r["kind"] == "params")
    trainable, frozen = params["params/trainable_params"], params["params/frozen_params"]
    assert trainable < 0.15 * (trainable + frozen)
    assert merge_run(tmp / "lora", tmp / "merged") < 1e-5
    adapted, _, _ = restore_for_inference(tmp / "lora")
    merged, merged_cfg, tok = restore_for_inference(tmp / "merged")
    assert merged_cfg.lora.rank == 0 and tok is not None and not lora.has_adapters(merged)
    np.testing.assert_allclose(np.asarray(merged(TOKENS % 61)), np.asarray(adapted(TOKENS % 61)), atol=1e-5)
    with pytest.raises(CheckpointError, match="a LoRA run .* python -m jaxlm.lora merge"):
        train(load_config(None, tiny_overrides(corpus, tmp / "again", **{"train.init_from": f'"{tmp / "lora"}"'})))


@RUNS
def test_init_from_across_layer_layouts(base_run):
    """Unrolled weights start a scanned run and back: the first evaluation (lr 0) is the base model's."""
    from jaxlm.training.checkpoint import load_base_weights, restore_for_inference
    from jaxlm.training.loop import train

    corpus, tmp, base_val = base_run
    scanned = {"train.steps": 2, "train.eval_every": 1, "compute.scan_layers": "true"}
    init_from = {"train.init_from": f'"{tmp / "base"}"'}
    cfg = load_config(None, tiny_overrides(corpus, tmp / "scanned", **scanned, **init_from))
    train(cfg)
    rows = [json.loads(l) for l in (tmp / "scanned" / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/loss"] for r in rows if r["kind"] == "eval"][0] == pytest.approx(base_val, abs=1e-6)
    back = load_config(None, tiny_overrides(corpus, tmp / "unrolled", **{"train.init_from": f'"{tmp / "scanned"}"'}))
    weights = load_base_weights(tmp / "scanned", back)
    model, _, _ = restore_for_inference(tmp / "scanned")
    stacked = np.asarray(model.layers.attn.q_proj.weight[...])  # (L, d_out, d_in)
    for i in range(back.model.num_layers):
        np.testing.assert_array_equal(np.asarray(weights["layers"][i]["attn"]["q_proj"]["weight"][...]), stacked[i])


@pytest.fixture(scope="session")
def scanned_lora_run(base_run):
    """A scanned LoRA run started from the unrolled base run, and its merge (a scanned plain run)."""
    from jaxlm.cli.lora import merge_run
    from jaxlm.training.loop import train

    corpus, tmp, _ = base_run
    train(load_config(None, tiny_overrides(corpus, tmp / "lora_scanned", **{
        "train.steps": 2, "train.eval_every": 1, "train.init_from": f'"{tmp / "base"}"', "lora.rank": 4,
        "compute.scan_layers": "true"})))
    run, merged = tmp / "lora_scanned", tmp / "lora_scanned_merged"
    return run, merged, merge_run(run, merged)


@pytest.mark.extended
@RUNS
def test_init_from_across_layouts_with_lora_and_merge(base_run, scanned_lora_run):
    """Unrolled weights start a scanned LoRA run (its first evaluation, at lr 0, is the base model's); the
    scanned adapters merge into a scanned plain run computing the adapted model. Extended, as the next test: the
    default suite has its parts, test_init_from_across_layer_layouts and test_init_from_lora_and_merge."""
    from jaxlm.training.checkpoint import restore_for_inference

    _, _, base_val = base_run
    run, merged_dir, diff = scanned_lora_run
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["eval/loss"] for r in rows if r["kind"] == "eval"][0] == pytest.approx(base_val, abs=1e-6)
    adapted, cfg, _ = restore_for_inference(run)
    assert cfg.compute.scan_layers and adapted.layers.attn.q_proj.lora_a.shape == (CFG.num_layers, 4, 32)
    assert diff < 1e-5
    merged, merged_cfg, _ = restore_for_inference(merged_dir)
    assert merged_cfg.compute.scan_layers and merged_cfg.lora.rank == 0 and not lora.has_adapters(merged)
    np.testing.assert_allclose(np.asarray(merged(TOKENS % 61)), np.asarray(adapted(TOKENS % 61)), atol=1e-5)


@pytest.mark.extended
@RUNS
def test_quantize_a_scanned_run(scanned_lora_run):
    """PTQ of a scanned run: per layer and output channel, the same weights and bytes as its unrolled layout.
    Extended: PTQ of a run is test_quantize_command's; scanned weights read unrolled,
    test_init_from_across_layer_layouts's."""
    from jaxlm.cli.quantize import convert, main, weight_bytes
    from jaxlm.training.checkpoint import restore_for_inference

    _, merged, _ = scanned_lora_run
    assert main([str(merged), "--bits", "8", "4", "--tokens", "512", "--json", str(merged / "q.json")]) == 0
    rows = json.loads((merged / "q.json").read_text())
    assert [r["bits"] for r in rows] == [None, 8, 4] and abs(rows[1]["val_loss"] - rows[0]["val_loss"]) < 0.02
    scanned, _, _ = restore_for_inference(merged)
    unrolled, _, _ = restore_for_inference(merged)
    scan.relayout(unrolled, scanned=False)
    assert [weight_bytes(scanned, b) for b in (None, 8, 4)] == [weight_bytes(unrolled, b) for b in (None, 8, 4)]
    assert rows[1]["weight_bytes"] == weight_bytes(unrolled, 8)
    convert(scanned, 4)
    convert(unrolled, 4)
    stacked = np.asarray(scanned.layers.ffn.w2.weight[...])  # (L, d_model, d_ff)
    for i in range(CFG.num_layers):
        np.testing.assert_array_equal(stacked[i], np.asarray(unrolled.layers[i].ffn.w2.weight[...]))


@RUNS
def test_init_from_mismatch_names_the_key(base_run):
    from jaxlm.training.loop import train

    corpus, tmp, _ = base_run
    cfg = load_config(None, tiny_overrides(corpus, tmp / "wide", **{
        "model.d_model": 64, "train.init_from": f'"{tmp / "base"}"'}))
    with pytest.raises(ConfigError, match=r"train.init_from = .*: its model.d_model = 32, this run's is 64"):
        train(cfg)
    assert not (tmp / "wide").exists()
    with pytest.raises(CheckpointError, match="no config.toml"):
        train(load_config(None, tiny_overrides(corpus, tmp / "x", **{"train.init_from": f'"{tmp / "nowhere"}"'})))


@RUNS
def test_quantize_command(base_run, capsys):
    from jaxlm.cli.quantize import main
    from jaxlm.core.errors import UsageError

    _, tmp, base_val = base_run
    assert main([str(tmp / "base"), "--bits", "8", "4", "--tokens", "512", "--json", str(tmp / "q.json")]) == 0
    rows = json.loads((tmp / "q.json").read_text())
    assert [r["bits"] for r in rows] == [None, 8, 4]
    assert abs(rows[1]["val_loss"] - rows[0]["val_loss"]) < 0.02 < 0.8 * rows[2]["val_loss"]
    assert rows[0]["weight_bytes"] > rows[1]["weight_bytes"] > rows[2]["weight_bytes"]
    with pytest.raises(UsageError, match="--bits 3: must be 4 or 8"):
        main([str(tmp / "base"), "--bits", "3"])
