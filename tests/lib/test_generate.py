"""Decoding: KV cache vs full forward, the sliding window, jaxlm vs torchref, sampling rules, batching, compilation, CLI."""

from __future__ import annotations

import argparse
import functools
import itertools
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import torchref
from jaxlm import cli
from jaxlm.cli.generate import build_parser, main, run_config
from jaxlm.core.config import ModelConfig, load_config
from jaxlm.nn.decode import (
    Generator,
    SamplingParams,
    StreamDecoder,
    filter_logits,
    row_keys,
)
from jaxlm.nn.model import TransformerLM
from jaxlm.training.checkpoint import load_for_generation
from parity.convert import torch_config, torch_to_jax
from tests.train_helpers import ROOT, make_corpus, tiny_overrides
from torchref.generate import filter_logits as torch_filter_logits
from torchref.generate import generate as torch_generate

# Prime-ish sizes catch shape mix-ups; random-init logits of this model have no near-ties at argmax.
CFG = ModelConfig(vocab_size=67, context_length=40, d_model=48, num_layers=2, num_heads=4, d_ff=96)
PROMPTS = [[3, 14, 15, 9, 26], [5, 35], list(range(1, 23))]
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="session")
def torch_model():
    torch.manual_seed(0)
    return torchref.TransformerLM(torch_config(CFG)).eval()


@pytest.fixture(scope="session")
def gen(torch_model):
    """A Generator over the same weights as `torch_model`, traced at highest matmul precision."""
    model = torch_to_jax(torch_model.state_dict(), TransformerLM(CFG, rngs=nnx.Rngs(1)))
    return Generator(model)  # compiled lazily: callers trace under jax.default_matmul_precision("highest")


@pytest.fixture(scope="session")
def greedy_batch(gen):
    with jax.default_matmul_precision("highest"):
        return gen.generate(PROMPTS, 24, GREEDY)


# --------------------------------------------------------------------------- cache and parity


def test_cache_equals_full_forward_greedy(gen, greedy_batch):
    with jax.default_matmul_precision("highest"):
        full = gen.generate(PROMPTS, 24, GREEDY, use_cache=False)
    assert full.tokens == greedy_batch.tokens
    # Row 2 (22 prompt tokens, context 40) fills its window after 18 tokens and slides on.
    assert greedy_batch.stop == ["length"] * 3
    assert [len(t) for t in greedy_batch.tokens] == [24, 24, 24]


def torch_cropped_greedy(model, prompt, n: int) -> list[int]:
    """nanoGPT's loop: each next token is the argmax of a full forward over the last context_length tokens."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(torch.argmax(model(torch.tensor([seq[-CFG.context_length:]]))[0, -1])))
    return seq[len(prompt):]


def test_window_slides_like_a_cropped_full_forward(gen, torch_model):
    """70 new tokens on a context of 40, rows of 2 to 60 prompt tokens: the cache, and the no-cache path,
    equal torchref's full forward over each row's last 40 tokens."""
    prompts = [*PROMPTS, list(np.arange(60) % 67)]
    with jax.default_matmul_precision("highest"):
        cached = gen.generate(prompts, 70, GREEDY)
        full = gen.generate(prompts, 70, GREEDY, use_cache=False)
    expected = [torch_cropped_greedy(torch_model, p, 70) for p in prompts]
    assert cached.tokens == expected
    assert full.tokens == expected
    assert cached.stop == ["length"] * 4 and cached.prompt_lengths == [5, 2, 22, 40]


def test_batched_prompts_equal_one_at_a_time(gen, greedy_batch):
    with jax.default_matmul_precision("highest"):
        alone = [gen.generate([p], 24, GREEDY).tokens[0] for p in PROMPTS]
        sampling = SamplingParams(temperature=1.0, top_p=0.9)
        batch = gen.generate(PROMPTS, 12, sampling, seed=7)
        row1 = gen.generate([PROMPTS[1]], 12, sampling, seed=7, sample_ids=[1])
    assert alone == greedy_batch.tokens
    assert row1.tokens[0] == batch.tokens[1]  # a row samples the same tokens alone or in a batch


def test_torchref_cache_equals_no_cache(torch_model):
    for p in PROMPTS:
        assert torch_generate(torch_model, p, 24, temperature=0) == torch_generate(
            torch_model, p, 24, temperature=0, use_cache=False
        )


def test_torchref_cache_logits_equal_full_forward(torch_model):
    x = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        full = torch_model(x)
        cache = torchref.model.KVCache(CFG.num_layers)
        parts = [torch_model(x[:, :9], kv_cache=cache)] + [torch_model(x[:, t : t + 1], kv_cache=cache) for t in range(9, 22)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_jax_equals_torchref_greedy(torch_model, greedy_batch):
    expected = [torch_generate(torch_model, p, 24, temperature=0) for p in PROMPTS]
    assert [len(t) for t in expected] == [24, 24, 18]  # torchref.generate stops at the context window
    assert [t[: len(e)] for t, e in zip(greedy_batch.tokens, expected)] == expected


def test_model_extend_matches_call_with_window():
    """Prefill 12 tokens, then 8 decode steps: the same logits as one causal forward (sliding window 3)."""
    cfg = ModelConfig(vocab_size=61, context_length=24, d_model=40, num_layers=2, num_heads=4, d_ff=72, window=3)
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 20), 0, 61)
    graphdef, state = nnx.split(model)
    full = np.asarray(jax.jit(lambda st, t: nnx.merge(graphdef, st)(t))(state, tokens))  # jit: eager is slower
    extend = jax.jit(lambda st, t, c, s: nnx.merge(graphdef, st).extend(t, c, s))
    logits, cache = extend(state, tokens[:, :12], model.init_cache(2, 24), np.zeros(2, np.int32))
    steps = [np.asarray(logits)]
    for t in range(12, 20):
        logits, cache = extend(state, tokens[:, t : t + 1], cache, np.full(2, t, np.int32))
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5)


# --------------------------------------------------------------------------- sampling rules


def sampling_probs(logits, params: SamplingParams) -> np.ndarray:
    """The distribution `sample_tokens` draws from: softmax of the filtered, temperature-scaled logits."""
    temperature, top_k, top_p = params.as_arrays()
    return jax.nn.softmax(filter_logits(logits / temperature, top_k, top_p), axis=-1)


def test_nucleus_and_top_k_against_hand_computed():
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    logits = np.log(p)[None].astype(np.float32)
    # p = 0.75: mass before each token is 0, .5, .7, .85, .95 -> keep the first three, renormalise by .85.
    got = np.asarray(sampling_probs(logits, SamplingParams(1.0, 0, 0.75)))[0]
    np.testing.assert_allclose(got, [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0], atol=1e-6)
    got = np.asarray(sampling_probs(logits, SamplingParams(1.0, 2, 1.0)))[0]
    np.testing.assert_allclose(got, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], atol=1e-6)
    # top-k 3 then nucleus 0.8 on the renormalised (.588, .235, .176): mass before .588 < .8, .824 >= .8.
    got = np.asarray(sampling_probs(logits, SamplingParams(1.0, 3, 0.8)))[0]
    np.testing.assert_allclose(got, [0.5 / 0.7, 0.2 / 0.7, 0, 0, 0], atol=1e-6)
    got = np.asarray(sampling_probs(logits, SamplingParams(1.0, 0, 0.0)))[0]  # p = 0 keeps the top token
    np.testing.assert_allclose(got, [1, 0, 0, 0, 0], atol=1e-6)
    # temperature 2 flattens before the cut: probs ~ sqrt(p), renormalised.
    q = np.sqrt(p) / np.sqrt(p).sum()
    got = np.asarray(sampling_probs(logits, SamplingParams(2.0, 0, 1.0)))[0]
    np.testing.assert_allclose(got, q, atol=1e-6)


def test_torch_and_jax_filters_agree():
    x = np.random.default_rng(0).normal(size=(6, 67)).astype(np.float32) * 3
    for k, p in [(0, 0.9), (5, 1.0), (7, 0.5), (0, 0.0), (1, 1.0)]:
        j = np.asarray(filter_logits(x, k, p))
        t = torch_filter_logits(torch.from_numpy(x), k, p).numpy()
        np.testing.assert_array_equal(np.isfinite(j), np.isfinite(t))
        np.testing.assert_array_equal(j[np.isfinite(j)], t[np.isfinite(t)])


def test_top_p_zero_and_top_k_one_equal_greedy(gen, greedy_batch):
    with jax.default_matmul_precision("highest"):
        top_p = gen.generate(PROMPTS, 24, SamplingParams(temperature=1.0, top_p=1e-6), seed=3)
        top_k = gen.generate(PROMPTS, 24, SamplingParams(temperature=1.0, top_k=1), seed=4)
    assert top_p.tokens == greedy_batch.tokens
    assert top_k.tokens == greedy_batch.tokens


def test_sampling_reproducible_and_seed_dependent(gen):
    s = SamplingParams(temperature=1.0, top_k=20)
    with jax.default_matmul_precision("highest"):
        a = gen.generate(PROMPTS, 16, s, seed=1)
        b = gen.generate(PROMPTS, 16, s, seed=1)
        c = gen.generate(PROMPTS, 16, s, seed=2)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


def test_sampling_params_validated():
    for bad in (dict(temperature=-1.0), dict(top_k=-2), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


# --------------------------------------------------------------------------- compilation, limits, streaming


def test_no_recompilation_per_decode_step():
    model = TransformerLM(CFG, rngs=nnx.Rngs(2))
    g = Generator(model)
    g.generate([[1, 2, 3]], 30, GREEDY)
    assert dict(g.traces) == {"begin": 1} and g.compiled_sizes() == {"begin": 1, "resume": 0}  # 30 tokens, one trace
    # Other sampling settings, seeds, stop tokens and lengths in the same buckets reuse it (traced arguments).
    g.generate([[4, 5, 6, 7]], 25, SamplingParams(temperature=0.7, top_k=5, top_p=0.9), seed=3, eot_id=5)
    assert dict(g.traces) == {"begin": 1} and g.compiled_sizes() == {"begin": 1, "resume": 0}
    g.generate([[1, 2, 3]], 30, GREEDY, use_cache=False)
    assert g.traces["begin"] == 2


def test_sliding_compiles_once_per_shape():
    """Past the window: one compiled generation (cached steps, then full forwards) for the (batch, bucket) shapes,
    none more for the next call with the same shapes (other prompts, sampling and seed)."""
    g = Generator(TransformerLM(CFG, rngs=nnx.Rngs(2)))
    g.generate([[1, 2, 3], [4] * 30], 60, GREEDY)
    first = dict(g.traces)
    assert first == {"begin": 1} and g.compiled_sizes() == {"begin": 1, "resume": 0}
    g.generate([[7] * 25, [8, 9]], 60, SamplingParams(temperature=0.9, top_k=7), seed=5)
    assert dict(g.traces) == first


def test_long_prompt_keeps_its_last_window(gen):
    prompt = list(np.arange(60) % 67)
    with jax.default_matmul_precision("highest"):
        out = gen.generate([prompt], 5, GREEDY)
        assert out.tokens == gen.generate([prompt[-40:]], 5, GREEDY).tokens
    assert out.prompt_lengths == [40] and out.stop == ["length"] and len(out.tokens[0]) == 5


def test_eot_stops_a_row(gen, greedy_batch):
    eot = greedy_batch.tokens[0][3]  # row 0's 4th greedy token acts as the stop token
    with jax.default_matmul_precision("highest"):
        out = gen.generate(PROMPTS[:1], 24, GREEDY, eot_id=eot)
    assert out.stop == ["eot"] and out.tokens[0] == greedy_batch.tokens[0][: greedy_batch.tokens[0].index(eot)]


@functools.cache
def reference_steps(graphdef):
    """The per-token jitted steps of `reference_loop` (one compilation per graphdef and shape)."""

    def sample(logits, last, step, key, temperature, top_k, top_p):  # logits (B, T, V) at position last[b] -> (B,)
        z = logits[jnp.arange(len(last)), last].astype(jnp.float32)  # (B, V)
        keys = row_keys(key, jnp.arange(len(last)), step)
        drawn = jax.vmap(jax.random.categorical)(keys, filter_logits(z / jnp.maximum(temperature, 1e-6), top_k, top_p))
        return jnp.where(temperature > 0, drawn, jnp.argmax(z, axis=-1))

    @jax.jit
    def full(state, tokens, lengths, step, *args):
        return sample(nnx.merge(graphdef, state)(tokens), lengths - 1, step, *args)

    @jax.jit
    def cached(state, cache, tokens, start, last, step, *args):
        logits, cache = nnx.merge(graphdef, state).extend(tokens, cache, start)
        return sample(logits, last, step, *args), cache

    return full, cached


def reference_loop(model, prompts, n, sampling, *, seed=0, eot_id=None, use_cache=True):
    """Decoding as it was before the compiled loop: one jitted step per token and the host appending tokens,
    stopping rows and sliding the window; from the model's extend / forward and the rules of docs/generate.md,
    with the Generator's cache and prompt buckets (padding widths change the order of float sums)."""
    graphdef, state = nnx.split(model)
    full, cached = reference_steps(graphdef)
    args = (jax.random.key(seed), *sampling.as_arrays())
    seqs = [[int(t) for t in p][-model.cfg.context_length:] for p in prompts]
    B, longest = len(seqs), max(len(s) for s in seqs)
    S = min(model.cfg.context_length, -(-(longest + n) // 64) * 64)

    def window(width):  # each row's last `width` tokens, right-padded, and how many there are
        rows = np.zeros((B, width), np.int32)
        for b, seq in enumerate(seqs):
            rows[b, :min(len(seq), width)] = seq[-width:]
        return rows, np.array([min(len(seq), width) for seq in seqs], np.int32)

    cache = model.init_cache(B, S) if use_cache else None
    if use_cache:
        prompt, lengths = window(min(S, -(-longest // 16) * 16))
        token, cache = cached(state, cache, prompt, np.zeros(B, np.int32), lengths - 1, 0, *args)
    else:
        token = full(state, *window(S), 0, *args)
    out, stop = [[] for _ in seqs], [""] * B
    for step in itertools.count(1):
        for b in range(B):
            if not stop[b] and int(token[b]) == eot_id:
                stop[b] = "eot"
            elif not stop[b]:
                out[b].append(int(token[b]))
                seqs[b].append(int(token[b]))
                stop[b] = "length" if len(out[b]) == n else ""
        if all(stop):
            return out, stop
        position = np.array([len(seq) - 1 for seq in seqs], np.int32)
        if cache is not None and position.max() < S:
            token, cache = cached(state, cache, np.asarray(token)[:, None], position, np.zeros(B, np.int32), step, *args)
        else:
            cache, token = None, full(state, *window(S), step, *args)


@pytest.mark.parametrize("sampling, seed, n, stops, use_cache", [
    (GREEDY, 0, 70, False, True),  # 70 tokens on a context of 40: the window slides inside the loop
    (SamplingParams(temperature=0.9, top_k=7, top_p=0.9), 3, 70, False, True),
    (SamplingParams(temperature=1.0), 4, 30, True, True),
    (SamplingParams(temperature=1.3, top_p=0.8), 5, 30, True, False),
])
def test_compiled_loop_equals_the_step_by_step_loop(gen, sampling, seed, n, stops, use_cache):
    """The one compiled generation gives, token for token, what one jitted step per token gave: greedy and
    seeded sampling, a batch of 2 to 60 prompt tokens, rows stopping at the end-of-text token."""
    prompts = [*PROMPTS, list(np.arange(60) % 67)]
    model = nnx.merge(gen.graphdef, gen.state)
    with jax.default_matmul_precision("highest"):
        eot_id = gen.generate(prompts, n, sampling, seed=seed).tokens[1][9] if stops else None  # row 1's 10th token
        got = gen.generate(prompts, n, sampling, seed=seed, eot_id=eot_id, use_cache=use_cache)
        want = reference_loop(model, prompts, n, sampling, seed=seed, eot_id=eot_id, use_cache=use_cache)
    assert (got.tokens, got.stop) == want
    assert got.stop[1] == ("eot" if stops else "length")


def test_streaming_replays_every_step(gen):
    """on_tokens sees each step's new token of every active row (the loop returns them in chunks), and the
    streamed rows add up to the generation; an end-of-text token is not shown as active."""
    eot = [t for t in range(67) if t not in PROMPTS[0]][0]
    seen = []
    with jax.default_matmul_precision("highest"):
        plain = gen.generate(PROMPTS, 21, SamplingParams(1.0), seed=2, eot_id=eot)
        streamed = gen.generate(PROMPTS, 21, SamplingParams(1.0), seed=2, eot_id=eot,
                                on_tokens=lambda tokens, active: seen.append((tokens.copy(), active.copy())))
    assert streamed.tokens == plain.tokens and streamed.stop == plain.stop
    assert gen.traces["resume"] >= 1  # 21 steps > one chunk: the loop came back and went on
    for b, row in enumerate(plain.tokens):
        assert [int(t[b]) for t, active in seen if active[b]] == row
    assert len(seen) == max(len(row) + (stop == "eot") for row, stop in zip(plain.tokens, plain.stop))


def test_stream_decoder_holds_partial_utf8():
    from jaxlm.data.tokenizer import load_tokenizer

    tok = load_tokenizer("bytes")
    ids = tok.encode("a€b")  # "€" is three bytes, so three byte tokens
    dec = StreamDecoder(tok)
    pieces = [dec.push(t) for t in ids]
    assert pieces == ["a", "", "", "€", "b"] and dec.flush() == ""


# --------------------------------------------------------------------------- checkpoints and the CLI


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    from jaxlm.training.loop import train

    base = tmp_path_factory.mktemp("gen_run")
    corpus = make_corpus(base / "corpus")
    extra = {"train.steps": 4, "checkpoint.every": 4, "train.eval_every": 4, "log.tensorboard": "false"}
    train(load_config(None, tiny_overrides(corpus, base / "run", **extra)))
    return base / "run"


def test_trained_checkpoint_generates_without_flags(trained_run, capsys):
    args = ["--prompt", "def f(x):", "--max-new-tokens", "6", "--temperature", "0"]
    assert main(["--run", str(trained_run), *args, "--num-samples", "2"]) == 0
    samples = capsys.readouterr().out.splitlines()
    assert samples[0].startswith("def f(x):") and samples[0] == samples[len(samples) // 2]  # greedy: equal samples
    assert main(["--checkpoint", str(trained_run / "checkpoints" / "4"), *args, "--stream", "--no-cache"]) == 0
    streamed = capsys.readouterr().out.splitlines()
    assert streamed == samples[: len(streamed)]  # streamed, full-forward text is the same


def test_compute_flags_change_how_the_run_decodes(trained_run):
    args = argparse.Namespace(config=None, preset=None, overrides=["compute.dtype=bfloat16"])
    cfg = run_config(str(trained_run), args)
    model, _ = load_for_generation(trained_run, cfg)
    assert model.compute.dtype == "bfloat16" and model.init_cache(1, 8).layers[0][0].dtype == jnp.bfloat16
    saved, _ = load_for_generation(trained_run)
    np.testing.assert_array_equal(model.token_embeddings.weight[...], saved.token_embeddings.weight[...])


@pytest.fixture(scope="session")
def scanned_run(tmp_path_factory):
    from jaxlm.training.loop import train

    base = tmp_path_factory.mktemp("gen_scanned_run")
    extra = {"train.steps": 2, "checkpoint.every": 2, "train.eval_every": 2, "log.tensorboard": "false",
             "compute.scan_layers": "true"}
    train(load_config(None, tiny_overrides(make_corpus(base / "corpus"), base / "run", **extra)))
    return base / "run"


@pytest.mark.parametrize("trained_in", ["unrolled", "scanned"])
def test_a_run_decodes_in_the_other_layer_layout(trained_in, trained_run, scanned_run, capsys):
    """--set compute.scan_layers=... flips the layout a run was trained in: the same logits and greedy text."""
    run, flip = (trained_run, "true") if trained_in == "unrolled" else (scanned_run, "false")
    args = argparse.Namespace(config=None, preset=None, overrides=[f"compute.scan_layers={flip}"])
    model, _ = load_for_generation(run, run_config(str(run), args))
    saved, _ = load_for_generation(run)
    assert isinstance(model.layers, nnx.List) == (flip == "false") != isinstance(saved.layers, nnx.List)
    tok = jnp.arange(12)[None] * 7 % 257  # (1, 12)
    np.testing.assert_allclose(np.asarray(model(tok)), np.asarray(saved(tok)), atol=1e-5)
    argv = ["--run", str(run), "--prompt", "The ", "--max-new-tokens", "6", "--temperature", "0"]
    assert main(argv) == 0 and main([*argv, "--set", f"compute.scan_layers={flip}"]) == 0
    as_trained, flipped = capsys.readouterr().out.splitlines()
    assert flipped == as_trained


def run_cli(argv, capsys) -> tuple[int, list[str]]:
    """Exit code and stderr lines of `python -m jaxlm.generate ARGV`, in this process."""
    code = cli.run(main, argv)
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("flag, value", [("--max-new-tokens", "-5"), ("--top-p", "0"), ("--top-k", "-1"),
                                         ("--temperature", "-1"), ("--num-samples", "0"), ("--prompt-file", "nope.txt")])
def test_bad_option_is_one_line_exit_2(tmp_path, capsys, flag, value):
    code, err = run_cli(["--run", str(tmp_path), "--prompt", "x", flag, value], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {flag} ") and value in err[0], err


def test_architecture_override_refused(trained_run, capsys):
    code, err = run_cli(["--run", str(trained_run), "--prompt", "x", "--set", "model.d_model=64"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: model.d_model: ") and "64" in err[0], err
    code, err = run_cli(["--run", str(trained_run), "--prompt", "x", "--preset", "small"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: model.vocab_size: "), err


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN attention runs on a GPU")
def test_cudnn_without_a_gpu_is_one_line(trained_run, capsys):
    code, err = run_cli(["--run", str(trained_run), "--prompt", "x", "--set", "compute.dtype=bfloat16",
                         "--set", "compute.attention=cudnn"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: compute.attention: "), err


def test_missing_or_corrupt_checkpoint_exit_2(tmp_path, trained_run, capsys):
    missing = tmp_path / "nope"
    assert run_cli(["--run", str(missing), "--prompt", "x"], capsys) == (2, [f"error: {missing}: no such run or checkpoint directory"])
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    code, err = run_cli(["--run", str(not_a_run), "--prompt", "x"], capsys)
    assert code == 2 and len(err) == 1 and str(not_a_run) in err[0]
    corrupt = tmp_path / "corrupt"
    shutil.copytree(trained_run, corrupt)
    for f in (corrupt / "checkpoints" / "4" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    code, err = run_cli(["--run", str(corrupt), "--prompt", "x"], capsys)
    assert code == 2 and str(corrupt) in err[-1]


@pytest.mark.parametrize("argv, culprit", [(["--run", "missing", "--prompt", "x"], "missing"),
                                           (["--run", "missing", "--top-p", "0"], "--top-p 0.0")])
def test_cli_exit_code_in_a_subprocess(tmp_path, argv, culprit):
    r = subprocess.run([sys.executable, "-m", "jaxlm.generate", *argv], cwd=tmp_path, capture_output=True, text=True,
                       env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=300)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {culprit}: "), r.stderr


def test_every_option_has_help_with_its_default():
    formatter = cli.HelpFormatter("x")
    for action in build_parser()._actions:
        if action.option_strings and action.default != argparse.SUPPRESS:
            shown = not (action.default is None or action.default is False or action.default == [])  # else: "not given"
            assert action.help and (not shown or "default" in formatter._get_help_string(action)), action.option_strings
