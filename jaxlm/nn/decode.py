"""Decoding: temperature / top-k / nucleus sampling and KV-cache generation (the CLI is jaxlm.generate).

Design (docs/generate.md has the long version):

* Batches of prompts with different lengths are RIGHT-padded and every row keeps
  its own position: row b's prompt fills cache slots 0 ... L_b-1 and its n-th new
  token sits at position (and slot) L_b + n, exactly where it would be if the row
  were generated alone. `TransformerLM.extend` masks each query to slots
  0 ... its own position, so padding and stale slots are never attended.
* With the cache: one prefill (`extend` over the padded prompts), then one
  jitted decode step per token that writes one key/value per layer into the
  preallocated (B, S, N, H) buffers (donated, so updated in place). Shapes are
  fixed for a whole generation, so each step reuses one compiled function.
* Without the cache (`use_cache=False`): every step re-runs the full forward on
  a fixed-length (B, S) window of everything so far (right-padded; causal
  masking hides the padding), so it also compiles once.
* The context window slides as nanoGPT's does: once a row's next token would sit
  past `context_length` (W), it is predicted from the row's last W tokens at
  positions 0 ... W-1. Every cached key was computed with the dropped tokens in
  view, so none can be reused: from the step the first row fills its window, each
  step is the full forward over every row's last W tokens (the no-cache path).
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
import itertools
import math
from collections import Counter
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlm.nn.model import TransformerLM

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


def mask_padding(logits: jax.Array, vocab_size: int | None) -> jax.Array:
    """-inf on the logits of ids >= vocab_size (a vocabulary padded past the tokenizer's). (..., V).
    The Generator always passes one, so every decoding (training samples, generate, bench decode) runs these ops."""
    if vocab_size is None:
        return logits
    return jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -jnp.inf)


def sampling_probs(logits: jax.Array, params: SamplingParams, vocab_size: int | None = None) -> jax.Array:
    """The distribution `sample_tokens` draws from (one-hot on the argmax when greedy). (..., V)."""
    logits = mask_padding(logits.astype(jnp.float32), vocab_size)
    if params.temperature == 0:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1])
    temperature, top_k, top_p = params.as_arrays()
    return jax.nn.softmax(filter_logits(logits / temperature, top_k, top_p), axis=-1)


def row_keys(seed_key: jax.Array, sample_ids: jax.Array, step) -> jax.Array:
    """(B,) keys: fold_in(fold_in(seed_key, sample_id), step), one per row."""
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(seed_key, r), step))(sample_ids)


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature, top_k, top_p, vocab_size: int | None = None) -> jax.Array:
    """logits (B, V), keys (B,) -> next tokens (B,) int32, all < vocab_size. temperature == 0: argmax (keys unused)."""
    logits = mask_padding(logits.astype(jnp.float32), vocab_size)
    greedy = jnp.argmax(logits, axis=-1)  # (B,)
    filtered = filter_logits(logits / jnp.maximum(temperature, 1e-6), top_k, top_p)  # (B, V)
    drawn = jax.vmap(jax.random.categorical)(keys, filtered)  # (B,)
    return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)


# --------------------------------------------------------------------------- the generator


@dataclasses.dataclass
class Generation:
    """tokens[r]: the new tokens of row r (without the prompt or the stop token); stop[r]: why it ended
    ("eot" or "length" = max_new_tokens); prompt_lengths[r]: the prompt tokens the model saw (at most W)."""

    tokens: list[list[int]]
    stop: list[str]
    prompt_lengths: list[int]


class Generator:
    """Compiled prefill / decode / full-forward steps for one model, reused across calls.

    `traces` counts how often each step function was traced (= compiled): a fixed
    (batch, prompt bucket, cache length) compiles each once however many tokens follow.
    `vocab_size`: the tokenizer's, when the model's vocabulary is padded past it (no id beyond is drawn).
    """

    PREFILL_BUCKET = 16  # prompts are right-padded to a multiple of this (or the cache length)
    CACHE_BUCKET = 64  # cache / no-cache window length: a multiple of this, or the context length

    def __init__(self, model: TransformerLM, vocab_size: int | None = None):
        self.cfg = model.cfg
        vocab = self.vocab_size = vocab_size or model.cfg.vocab_size
        self.graphdef, self.state = nnx.split(model)
        self.traces: Counter = Counter()
        graphdef = self.graphdef

        def prefill(state, cache, tokens, lengths, seed_key, sample_ids, sampling):
            self.traces["prefill"] += 1
            model = nnx.merge(graphdef, state)
            logits, cache = model.extend(tokens, cache, jnp.zeros_like(lengths))  # (B, P, V)
            last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # (B, V)
            return sample_tokens(last, row_keys(seed_key, sample_ids, 0), *sampling, vocab), cache

        def decode(state, cache, token, position, step, seed_key, sample_ids, sampling):
            self.traces["decode"] += 1
            model = nnx.merge(graphdef, state)
            logits, cache = model.extend(token[:, None], cache, position)  # (B, 1, V)
            return sample_tokens(logits[:, 0], row_keys(seed_key, sample_ids, step), *sampling, vocab), cache

        def full(state, window, lengths, step, seed_key, sample_ids, sampling):
            self.traces["full"] += 1
            logits = nnx.merge(graphdef, state)(window)  # (B, S, V)
            last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # (B, V)
            return sample_tokens(last, row_keys(seed_key, sample_ids, step), *sampling, vocab)

        self._prefill = jax.jit(prefill, donate_argnums=(1,))
        self._decode = jax.jit(decode, donate_argnums=(1,))
        self._full = jax.jit(full)

    def compiled_sizes(self) -> dict[str, int]:
        """Entries in each jitted function's compilation cache."""
        return {name: f._cache_size() for name, f in (("prefill", self._prefill), ("decode", self._decode), ("full", self._full))}

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        *,
        seed: int = 0,
        eot_id: int | None = None,
        use_cache: bool = True,
        sample_ids: Sequence[int] | None = None,
        on_tokens: Callable[[np.ndarray, np.ndarray], None] | None = None,
    ) -> Generation:
        """Continue each prompt (a list of token ids) by up to `max_new_tokens` tokens.

        Rows stop at `eot_id` (not included in the output) or after max_new_tokens;
        past the context window the window slides. `sample_ids` (default 0 ... B-1)
        pick each row's random stream. `on_tokens(tokens (B,), active (B,) bool)` is
        called after every step with the new token of each row (streaming).
        """
        seqs = self._crop(prompts, max_new_tokens)
        lengths = [len(s) for s in seqs]
        ids = np.array(range(len(seqs)) if sample_ids is None else sample_ids, np.int32)  # (B,)
        if ids.shape != (len(seqs),):
            raise ValueError(f"sample_ids must have one entry per prompt ({len(seqs)}), got {len(ids)}")
        # Cache and window lengths are rounded up to buckets (capped at the context) so few shapes compile.
        S = min(self.cfg.context_length, _round_up(max(lengths) + max_new_tokens, self.CACHE_BUCKET))
        args = (jax.random.key(seed), ids, sampling.as_arrays())
        token, cache = self._first(seqs, S, use_cache, args)
        stop = [""] * len(seqs)
        for step in itertools.count(1):
            tok = np.asarray(token)  # (B,): each row's next token
            active = np.array([not s for s in stop])  # (B,)
            for b in np.flatnonzero(active):
                if eot_id is not None and tok[b] == eot_id:
                    stop[b] = "eot"
                    continue
                seqs[b].append(int(tok[b]))
                if len(seqs[b]) - lengths[b] == max_new_tokens:
                    stop[b] = "length"
            if on_tokens is not None:
                on_tokens(tok, active & (np.array(stop) != "eot"))
            if all(stop):
                return Generation([s[n:] for s, n in zip(seqs, lengths)], stop, lengths)
            token, cache = self._next(seqs, S, cache, token, step, args)

    def _crop(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """The prompts as lists of ints, each cut to its last context_length tokens (all the model sees)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        seqs = [[int(t) for t in p][-self.cfg.context_length:] for p in prompts]
        if not seqs or not all(seqs):
            raise ValueError("empty prompt: give at least one token per prompt (e.g. the <|endoftext|> id)")
        return seqs

    def _first(self, seqs: list[list[int]], S: int, use_cache: bool, args: tuple):
        """(first new token (B,), cache): a prefill into a fresh (B, S) cache, or the full forward (cache None)."""
        if not use_cache:
            return self._full(self.state, *_window(seqs, S), 0, *args), None
        P = min(S, _round_up(max(len(s) for s in seqs), self.PREFILL_BUCKET))
        cache = nnx.merge(self.graphdef, self.state).init_cache(len(seqs), S)
        return self._prefill(self.state, cache, *_window(seqs, P), *args)

    def _next(self, seqs: list[list[int]], S: int, cache, token: jax.Array, step: int, args: tuple):
        """(next token (B,), cache): a decode step while every fed-back token has a cache slot; after that
        (cache None) the full forward over each row's last S tokens, which is how the window slides."""
        position = np.array([len(s) - 1 for s in seqs], np.int32)  # (B,): position of the fed-back token
        if cache is not None and position.max() < S:
            return self._decode(self.state, cache, token, position, step, *args)
        return self._full(self.state, *_window(seqs, S), step, *args), None


def _window(seqs: list[list[int]], S: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (B, S), lengths (B,)): each row's last S tokens at positions 0 ..., right-padded with 0."""
    lengths = np.array([min(len(s), S) for s in seqs], np.int32)  # (B,)
    tokens = np.zeros((len(seqs), S), np.int32)  # (B, S)
    for b, (s, n) in enumerate(zip(seqs, lengths)):
        tokens[b, :n] = s[len(s) - n:]
    return tokens, lengths


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def encode_prompt(tokenizer, text: str) -> list[int]:
    """The prompt's token ids; an empty text starts from <|endoftext|> (id 0 without one)."""
    return list(tokenizer.encode(text)) or [tokenizer.eot_id if tokenizer.eot_id is not None else 0]


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
