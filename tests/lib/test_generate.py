"""Decoding: KV cache vs full forward, the sliding window, sampling rules, batching, compilation, streaming
(jaxlm against torchref: tests/parity/test_generate_torch.py; the CLI: test_generate_cli.py)."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlm.core.config import ModelConfig
from jaxlm.nn.decode import (
    Generator,
    SamplingParams,
    StreamDecoder,
    filter_logits,
    row_keys,
)
from jaxlm.nn.model import TransformerLM

# Prime-ish sizes catch shape mix-ups; random-init logits of this model have no near-ties at argmax.
CFG = ModelConfig(vocab_size=67, context_length=40, d_model=48, num_layers=2, num_heads=4, d_ff=96)
PROMPTS = [[3, 14, 15, 9, 26], [5, 35], list(range(1, 23))]
GREEDY = SamplingParams(temperature=0.0)
# One xdist group: the session's Generator and its compiled loops are built once.
pytestmark = pytest.mark.xdist_group("generate")


@pytest.fixture(scope="session")
def gen():
    """A Generator over a random-init model, traced at highest matmul precision by its callers."""
    return Generator(TransformerLM(CFG, rngs=nnx.Rngs(1)))  # compiled lazily, under the callers' precision


@pytest.fixture(scope="session")
def greedy_batch(gen):
    with jax.default_matmul_precision("highest"):
        return gen.generate(PROMPTS, 24, GREEDY)


# --------------------------------------------------------------------------- cache and window


def test_cache_equals_full_forward_greedy(gen, greedy_batch):
    with jax.default_matmul_precision("highest"):
        full = gen.generate(PROMPTS, 24, GREEDY, use_cache=False)
    assert full.tokens == greedy_batch.tokens
    # Row 2 (22 prompt tokens, context 40) fills its window after 18 tokens and slides on.
    assert greedy_batch.stop == ["length"] * 3
    assert [len(t) for t in greedy_batch.tokens] == [24, 24, 24]


def cropped_greedy(gen, prompt, n: int) -> list[int]:
    """nanoGPT's loop: each next token is the argmax of a full forward over the last context_length tokens
    (right-padded to the context, so one compilation: causal attention never sees the padding)."""
    forward = jax.jit(lambda state, tokens, last: nnx.merge(gen.graphdef, state)(tokens)[0, last])  # (1, T) -> (V,)
    seq = list(prompt)
    for _ in range(n):
        window = seq[-CFG.context_length:]
        tokens = np.zeros((1, CFG.context_length), np.int32)
        tokens[0, : len(window)] = window
        seq.append(int(np.argmax(forward(gen.state, tokens, len(window) - 1))))
    return seq[len(prompt):]


@pytest.mark.extended
def test_window_slides_like_a_cropped_full_forward(gen):
    """70 new tokens on a context of 40, rows of 2 to 60 prompt tokens: the cache, and the no-cache path, equal
    a full forward over each row's last 40 tokens (torchref's too: tests/parity/test_generate_torch.py). Extended:
    the default suite slides the window in test_cache_equals_full_forward_greedy (row 2) and
    test_long_prompt_keeps_its_last_window, against torchref in tests/parity/test_generate_torch.py."""
    prompts = [*PROMPTS, list(np.arange(60) % 67)]
    with jax.default_matmul_precision("highest"):
        cached = gen.generate(prompts, 70, GREEDY)
        full = gen.generate(prompts, 70, GREEDY, use_cache=False)
        expected = [cropped_greedy(gen, p, 70) for p in prompts]
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
            token, cache = cached(state, cache, np.asarray(token)[:, None], position, np.zeros(B, np.int32), step,
                                  *args)
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
