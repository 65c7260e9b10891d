"""Decoding: temperature / top-k / nucleus sampling and KV-cache generation (the CLI is jaxlm.generate).

Design (docs/generate.md has the long version):

* Batches of prompts with different lengths are RIGHT-padded and every row keeps
  its own position: row b's prompt fills cache slots 0 ... L_b-1 and its n-th new
  token sits at position (and slot) L_b + n, exactly where it would be if the row
  were generated alone. `TransformerLM.extend` masks each query to slots
  0 ... its own position, so padding and stale slots are never attended.
* One compiled call per generation: the prefill (`extend` over the padded
  prompts into a (B, S, N, H) cache that lives only inside the call), then a
  `lax.while_loop` whose every step feeds each row's last token, samples the next
  one and stops rows at the end-of-text token or at max_new_tokens. Nothing comes
  back to the host until every row has stopped (streaming: every `STREAM_CHUNK`
  steps, continuing from the donated loop state). Shapes are fixed per
  (batch, prompt bucket, cache length), so one compilation serves every call.
* Without the cache (`use_cache=False`): every step re-runs the full forward on
  a fixed-length (B, S) window of everything so far (right-padded; causal
  masking hides the padding), inside the same kind of loop.
* The context window slides as nanoGPT's does: once a row's next token would sit
  past `context_length` (W), it is predicted from the row's last W tokens at
  positions 0 ... W-1. Every cached key was computed with the dropped tokens in
  view, so none can be reused: from the step the first row fills its window, the
  loop goes on with a second `while_loop` whose step is the full forward over every
  row's last W tokens (the no-cache step), still inside the one compiled call.
* Sampling parameters are traced scalars: changing temperature / top-k / top-p
  does not recompile. Row r's random key at step n is
  fold_in(fold_in(key(seed), sample_id[r]), n), so a row samples the same tokens
  whether it is generated alone or in a batch.
* Only ids the tokenizer has are ever drawn: a model whose vocabulary is padded past
  the tokenizer's (50,304 for GPT-2's 50,257) has its padding logits set to -inf
  before any sampling (`vocab_size` of the Generator).
"""

from __future__ import annotations

import codecs
import dataclasses
import math
from collections import Counter
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlm.nn.model import KVCache, TransformerLM

# --------------------------------------------------------------------------- sampling


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0: greedy (argmax). top_k 0: no top-k cut. top_p 1: no nucleus cut."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")

    def as_arrays(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        return jnp.float32(self.temperature), jnp.int32(self.top_k), jnp.float32(self.top_p)


def filter_logits(logits: jax.Array, top_k, top_p) -> jax.Array:
    """Set every token outside the top-k / nucleus set to -inf. logits (..., V), float32.

    Top-k first (k <= 0: off): keep the k highest logits (ties broken by lower id).
    Then nucleus on the distribution renormalised over the survivors: keep the
    smallest prefix of tokens, by descending probability, whose cumulative
    probability reaches top_p (a token is kept iff the mass strictly before it is
    < top_p); the top token is always kept, and top_p >= 1 keeps everything.
    `softmax` of the result is the renormalised sampling distribution.
    """
    shape = logits.shape
    flat = logits.reshape(-1, shape[-1]).astype(jnp.float32)  # (R, V)
    order = jnp.argsort(-flat, axis=-1, stable=True)  # (R, V): descending, ties by id
    ranked = jnp.take_along_axis(flat, order, axis=-1)  # (R, V)
    rank = jnp.arange(shape[-1])[None, :]  # (1, V)
    keep = (top_k <= 0) | (rank < top_k)  # (R, V)
    ranked = jnp.where(keep, ranked, -jnp.inf)
    probs = jax.nn.softmax(ranked, axis=-1)  # (R, V): renormalised over the top-k
    mass_before = jnp.cumsum(probs, axis=-1) - probs  # (R, V): exclusive cumulative sum
    keep &= (top_p >= 1.0) | (mass_before < top_p) | (rank == 0)
    ranked = jnp.where(keep, ranked, -jnp.inf)
    rows = jnp.arange(flat.shape[0])[:, None]  # (R, 1)
    out = jnp.full_like(flat, -jnp.inf).at[rows, order].set(ranked)  # back to token order
    return out.reshape(shape)


def row_keys(seed_key: jax.Array, sample_ids: jax.Array, step) -> jax.Array:
    """(B,) keys: fold_in(fold_in(seed_key, sample_id), step), one per row."""
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(seed_key, r), step))(sample_ids)


def mask_padding(logits: jax.Array, vocab_size) -> jax.Array:
    """-inf on the logits of ids >= vocab_size (a vocabulary padded past the tokenizer's). (..., V)."""
    return jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -jnp.inf)


def sample_tokens(logits: jax.Array, keys, temperature, top_k, top_p) -> jax.Array:
    """logits (B, V), keys (B,) -> next tokens (B,) int32. temperature == 0: argmax (keys unused).

    Each `lax.cond` runs one branch: greedy is the argmax alone, and the sort behind top-k / top-p
    (a full sort of the vocabulary per row, a large part of a small model's CPU decode step) runs
    only when one of them is on. `keys` may be a function returning them, called in the sampling
    branch only, so greedy decoding skips deriving them. A mask on the logits belongs at the top,
    before both branches.
    """
    logits = logits.astype(jnp.float32)  # (B, V)

    def draw(z):  # (B, V) -> (B,)
        z = z / jnp.maximum(temperature, 1e-6)
        z = jax.lax.cond((top_k > 0) | (top_p < 1.0), filter_logits, lambda z, k, p: z, z, top_k, top_p)
        return jax.vmap(jax.random.categorical)(keys() if callable(keys) else keys, z)

    return jax.lax.cond(temperature > 0, draw, lambda z: jnp.argmax(z, axis=-1), logits).astype(jnp.int32)


# --------------------------------------------------------------------------- the generator

RUNNING, EOT, LENGTH = 0, 1, 2  # DecodeState.stop codes
STOP_NAMES = {EOT: "eot", LENGTH: "length"}


@dataclasses.dataclass
class Generation:
    """tokens[r]: the new tokens of row r (without the prompt or the stop token); stop[r]: why it ended
    ("eot" or "length" = max_new_tokens); prompt_lengths[r]: the prompt tokens the model saw (at most W)."""

    tokens: list[list[int]]
    stop: list[str]
    prompt_lengths: list[int]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Request:
    """What one `generate` call fixes for every step: traced, so none of it recompiles."""

    prompt_lengths: jax.Array  # (B,) int32
    max_new_tokens: jax.Array  # () int32
    eot_id: jax.Array  # (E,) int32: the end-of-text ids (a Llama 3 instruct model has several), -1: none
    seed_key: jax.Array  # a PRNG key
    sample_ids: jax.Array  # (B,) int32: each row's random stream
    temperature: jax.Array  # () float32
    top_k: jax.Array  # () int32
    top_p: jax.Array  # () float32
    vocab_size: jax.Array  # () int32: the tokenizer's; ids at or past it are never drawn

    def next_tokens(self, logits: jax.Array, step: jax.Array) -> jax.Array:
        """logits (B, V) -> (B,) tokens, drawn from each row's stream at `step`."""
        keys = lambda: row_keys(self.seed_key, self.sample_ids, step)  # noqa: E731
        logits = mask_padding(logits.astype(jnp.float32), self.vocab_size)  # (B, V)
        return sample_tokens(logits, keys, self.temperature, self.top_k, self.top_p)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """What a generation carries from token to token, on the device (the while loop's carry)."""

    cache: KVCache | None  # None on the no-cache path
    seqs: jax.Array  # (B, L) int32: each row's prompt, then its new tokens, then zeros
    lengths: jax.Array  # (B,) int32: tokens of each row in seqs
    stop: jax.Array  # (B,) int32: RUNNING, EOT or LENGTH
    token: jax.Array  # (B,) int32: the token each row sampled last
    step: jax.Array  # () int32: tokens sampled so far per row = the random stream's next step


class Generator:
    """One compiled generation (prefill, then a `lax.while_loop` over tokens) per shape, reused across calls.

    `traces` counts how often each jitted function was traced (= compiled): a fixed
    (batch, prompt bucket, cache length) compiles `begin` once however many tokens follow;
    `resume` (the loop alone, continuing a donated `DecodeState`) compiles only for streaming.
    """

    PREFILL_BUCKET = 16  # prompts are right-padded to a multiple of this (or the cache length)
    CACHE_BUCKET = 64  # cache / no-cache window length: a multiple of this, or the context length
    STREAM_CHUNK = 8  # tokens per compiled call when streaming (`on_tokens`)

    def __init__(self, model: TransformerLM, vocab_size: int | None = None):
        self.cfg = model.cfg
        self.vocab_size = vocab_size or model.cfg.vocab_size  # the tokenizer's, when the model's is padded past it
        self.graphdef, self.state = nnx.split(model)
        self.traces: Counter = Counter()
        statics = ("prefill", "window", "use_cache", "slides")
        self._begin = jax.jit(self._begin_fn, static_argnames=statics)
        self._resume = jax.jit(self._resume_fn, static_argnames=("window", "slides"), donate_argnums=(1,))

    def _begin_fn(self, state, seqs, req: Request, until, *, prefill: int, window: int, use_cache: bool, slides: bool):
        """The first token (a prefill into a fresh cache, or the full forward), then the loop up to step `until`."""
        self.traces["begin"] += 1
        model = nnx.merge(self.graphdef, state)
        lengths = req.prompt_lengths
        cache = None
        if use_cache:
            cache = model.init_cache(seqs.shape[0], window)  # lives only inside this call: updated in place
            logits, cache = model.extend(seqs[:, :prefill], cache, jnp.zeros_like(lengths))  # (B, P, V)
            last = _at(logits, lengths - 1)  # (B, V)
        else:
            last = _last_logits(model, seqs, lengths, window)  # (B, V)
        token = req.next_tokens(last, jnp.int32(0))
        start = DecodeState(cache, seqs, lengths, jnp.zeros_like(lengths), token, jnp.int32(0))
        return _loop(self.graphdef, state, _accept(start, token, req), req, until, window, slides)

    def _resume_fn(self, state, d: DecodeState, req: Request, until, *, window: int, slides: bool):
        self.traces["resume"] += 1
        return _loop(self.graphdef, state, d, req, until, window, slides)

    def compiled_sizes(self) -> dict[str, int]:
        """Entries in each jitted function's compilation cache."""
        return {"begin": self._begin._cache_size(), "resume": self._resume._cache_size()}

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        *,
        seed: int = 0,
        eot_id: int | Sequence[int] | None = None,
        use_cache: bool = True,
        sample_ids: Sequence[int] | None = None,
        on_tokens: Callable[[np.ndarray, np.ndarray], None] | None = None,
    ) -> Generation:
        """Continue each prompt (a list of token ids) by up to `max_new_tokens` tokens.

        Rows stop at `eot_id` (one id or several; not included in the output) or after max_new_tokens;
        past the context window the window slides. `sample_ids` (default 0 ... B-1)
        pick each row's random stream. `on_tokens(tokens (B,), active (B,) bool)` is
        called once per step with the new token of each row (streaming); the steps
        come back from the device in chunks of `STREAM_CHUNK`.
        """
        seqs = self._crop(prompts, max_new_tokens)
        lengths = [len(s) for s in seqs]
        ids = np.array(range(len(seqs)) if sample_ids is None else sample_ids, np.int32)  # (B,)
        if ids.shape != (len(seqs),):
            raise ValueError(f"sample_ids must have one entry per prompt ({len(seqs)}), got {len(ids)}")
        # Cache, window and token-buffer lengths are rounded up to buckets (capped at the context): few shapes compile.
        total = _round_up(max(lengths) + max_new_tokens, self.CACHE_BUCKET)
        S = min(self.cfg.context_length, total)
        statics = dict(prefill=min(S, _round_up(max(lengths), self.PREFILL_BUCKET)), window=S, use_cache=use_cache,
                       slides=max(lengths) + max_new_tokens > self.cfg.context_length)
        stops = np.atleast_1d(np.array(-1 if eot_id is None else eot_id, np.int32))  # (E,)
        req = Request(np.array(lengths, np.int32), np.int32(max_new_tokens), stops, jax.random.key(seed), ids,
                      *sampling.as_arrays(), np.int32(self.vocab_size))
        chunk = max_new_tokens if on_tokens is None else self.STREAM_CHUNK
        d = self._begin(self.state, _pack(seqs, total), req, np.int32(chunk), **statics)
        shown = 0
        while True:
            out = jax.device_get((d.seqs, d.lengths, d.stop, d.step))
            if on_tokens is not None:
                shown = _replay(on_tokens, *out, lengths, shown)
            if (out[2] != RUNNING).all():
                break
            d = self._resume(self.state, d, req, np.int32(out[3] + chunk), window=S, slides=statics["slides"])
        new_seqs, new_lengths, stop = out[0], out[1], out[2]
        return Generation([new_seqs[b, n:m].tolist() for b, (n, m) in enumerate(zip(lengths, new_lengths))],
                          [STOP_NAMES[int(s)] for s in stop], lengths)

    def _crop(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """The prompts as lists of ints, each cut to its last context_length tokens (all the model sees)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        seqs = [[int(t) for t in p][-self.cfg.context_length:] for p in prompts]
        if not seqs or not all(seqs):
            raise ValueError("empty prompt: give at least one token per prompt (e.g. the <|endoftext|> id)")
        return seqs


def _loop(graphdef, state, d: DecodeState, req: Request, until, window: int, slides: bool) -> DecodeState:
    """Sample tokens until every row has stopped or `until` steps are done: cached steps while every fed-back
    token has a cache slot, then (`slides`, or without the cache) full forwards over each row's last `window`."""

    def live(d):
        return jnp.any(d.stop == RUNNING) & (d.step < until)

    def body(step: Callable) -> Callable:
        """step(model, d) as a loop body. The weights enter an inner jit as an argument: an NNX transform in the
        forward (the remat of compute.remat) cannot update a module whose arrays the body closes over."""
        inner = jax.jit(lambda state, d: step(nnx.merge(graphdef, state), d))
        return lambda d: inner(state, d)

    if d.cache is not None:
        d = jax.lax.while_loop(lambda d: live(d) & (jnp.max(d.lengths) <= window),
                               body(lambda m, d: _cached_step(m, d, req)), d)
    if d.cache is None or slides:
        d = jax.lax.while_loop(live, body(lambda m, d: _full_step(m, d, req, window)), d)
    return d


def _cached_step(model: TransformerLM, d: DecodeState, req: Request) -> DecodeState:
    """Feed each row's last token at its position (= its cache slot), sample the next one."""
    logits, cache = model.extend(d.token[:, None], d.cache, d.lengths - 1)  # (B, 1, V)
    return _accept(dataclasses.replace(d, cache=cache), req.next_tokens(logits[:, 0], d.step), req)


def _full_step(model: TransformerLM, d: DecodeState, req: Request, window: int) -> DecodeState:
    """The full forward over each row's last `window` tokens (how the context window slides)."""
    return _accept(d, req.next_tokens(_last_logits(model, d.seqs, d.lengths, window), d.step), req)


def _last_logits(model: TransformerLM, seqs: jax.Array, lengths: jax.Array, window: int) -> jax.Array:
    """Next-token logits (B, V) of each row from its last `window` tokens at positions 0 ..., right-padded with 0."""
    n = jnp.minimum(lengths, window)  # (B,)
    rows = jax.vmap(lambda row, s: jax.lax.dynamic_slice(row, (s,), (window,)))(seqs, lengths - n)  # (B, W)
    rows = jnp.where(jnp.arange(window)[None, :] < n[:, None], rows, 0)  # (B, W)
    return _at(model(rows), n - 1)


def _at(logits: jax.Array, index: jax.Array) -> jax.Array:
    """logits (B, T, V) at position index[b] of each row -> (B, V)."""
    return jnp.take_along_axis(logits, index[:, None, None], axis=1)[:, 0]


def _accept(d: DecodeState, token: jax.Array, req: Request) -> DecodeState:
    """Append each running row's new token, or stop the row at the end-of-text token or at max_new_tokens."""
    running = d.stop == RUNNING  # (B,)
    eot = running & jnp.any(token[:, None] == req.eot_id[None, :], axis=-1)  # (B,)
    keep = running & ~eot
    slot = jnp.where(keep, d.lengths, d.seqs.shape[1])  # (B,): past the end (dropped) where nothing is kept
    seqs = d.seqs.at[jnp.arange(token.shape[0]), slot].set(token, mode="drop")  # (B, L)
    lengths = d.lengths + keep
    done = keep & (lengths - req.prompt_lengths >= req.max_new_tokens)
    stop = jnp.where(eot, EOT, jnp.where(done, LENGTH, d.stop))
    return DecodeState(d.cache, seqs, lengths, stop, token, d.step + 1)


def _pack(seqs: list[list[int]], L: int) -> np.ndarray:
    """(B, L) int32: each row's tokens from position 0, right-padded with 0."""
    out = np.zeros((len(seqs), L), np.int32)
    for b, s in enumerate(seqs):
        out[b, :len(s)] = s
    return out


def _replay(on_tokens: Callable, seqs: np.ndarray, lengths: np.ndarray, stop: np.ndarray, step: int,
            prompt_lengths: list[int], shown: int) -> int:
    """Call on_tokens for steps shown+1 ... step: row b's n-th new token came at step n; returns step."""
    made = lengths - np.array(prompt_lengths)  # (B,): new tokens per row
    for n in range(shown + 1, int(step) + 1):
        active = made >= n  # (B,)
        cols = np.minimum(np.array(prompt_lengths) + n - 1, seqs.shape[1] - 1)
        on_tokens(np.where(active, seqs[np.arange(len(seqs)), cols], 0), active)
    return int(step)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The prompt's token ids, after the tokenizer's BOS when it has one (a Hugging Face model's); an empty text
    without a BOS starts from <|endoftext|> (id 0 without one)."""
    ids = ([] if tokenizer.bos_id is None else [tokenizer.bos_id]) + list(tokenizer.encode(text))
    return ids or [tokenizer.eot_id if tokenizer.eot_id is not None else 0]


def generate(
    model: TransformerLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    **kwargs,
) -> Generation:
    """One-off convenience: `Generator(model).generate(...)` (build a Generator to reuse compilations)."""
    return Generator(model).generate(prompts, max_new_tokens, sampling, **kwargs)


# --------------------------------------------------------------------------- streaming text


class StreamDecoder:
    """Token ids -> text pieces, holding back bytes until they form complete UTF-8 characters."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._utf8.decode(self.tokenizer.decode_bytes([int(token)]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)
