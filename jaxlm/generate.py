"""Text generation: temperature / top-k / nucleus sampling with a KV cache.

    python -m jaxlm.generate --run RUN --prompt "Once upon a time" [--max-new-tokens N]
        [--temperature T] [--top-p P] [--top-k K] [--seed S] [--num-samples M] [--stream] [--no-cache]
    python -m jaxlm.generate bench [--config F] [--preset NAME] [--set model.k=v ...] [--new-tokens 256] [--batch 1]

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
* Sampling parameters are traced scalars: changing temperature / top-k / top-p
  does not recompile. Row r's random key at step n is
  fold_in(fold_in(key(seed), sample_id[r]), n), so a row samples the same tokens
  whether it is generated alone or in a batch.
* prompt + generated tokens never exceed the context window: longer prompts keep
  their last context_length - 1 tokens (with a warning) and a row that reaches
  the window stops (reason "context").
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import json
import math
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlm.errors import CheckpointError
from jaxlm.model import KVCache, TransformerLM

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


def sampling_probs(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """The distribution `sample_tokens` draws from (one-hot on the argmax when greedy). (..., V)."""
    logits = logits.astype(jnp.float32)
    if params.temperature == 0:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1])
    temperature, top_k, top_p = params.as_arrays()
    return jax.nn.softmax(filter_logits(logits / temperature, top_k, top_p), axis=-1)


def row_keys(seed_key: jax.Array, sample_ids: jax.Array, step) -> jax.Array:
    """(B,) keys: fold_in(fold_in(seed_key, sample_id), step), one per row."""
    return jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(seed_key, r), step))(sample_ids)


def sample_tokens(logits: jax.Array, keys: jax.Array, temperature, top_k, top_p) -> jax.Array:
    """logits (B, V), keys (B,) -> next tokens (B,) int32. temperature == 0: argmax (keys unused)."""
    logits = logits.astype(jnp.float32)
    greedy = jnp.argmax(logits, axis=-1)  # (B,)
    filtered = filter_logits(logits / jnp.maximum(temperature, 1e-6), top_k, top_p)  # (B, V)
    drawn = jax.vmap(jax.random.categorical)(keys, filtered)  # (B,)
    return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)


# --------------------------------------------------------------------------- the generator


@dataclasses.dataclass
class Generation:
    """tokens[r]: the new tokens of row r (without the prompt or the stop token); stop[r]: why it ended
    ("eot", "length" = max_new_tokens, "context" = the context window was full)."""

    tokens: list[list[int]]
    stop: list[str]
    prompt_lengths: list[int]


class Generator:
    """Compiled prefill / decode / full-forward steps for one model, reused across calls.

    `traces` counts how often each step function was traced (= compiled): a fixed
    (batch, prompt bucket, cache length) compiles each once however many tokens follow.
    """

    PREFILL_BUCKET = 16  # prompts are right-padded to a multiple of this (or the cache length)
    CACHE_BUCKET = 64  # cache / no-cache window length: a multiple of this, or the context length

    def __init__(self, model: TransformerLM):
        self.cfg = model.cfg
        self.graphdef, self.state = nnx.split(model)
        self.traces: Counter = Counter()
        graphdef = self.graphdef

        def prefill(state, cache, tokens, lengths, seed_key, sample_ids, sampling):
            self.traces["prefill"] += 1
            model = nnx.merge(graphdef, state)
            logits, cache = model.extend(tokens, cache, jnp.zeros_like(lengths))  # (B, P, V)
            last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # (B, V)
            return sample_tokens(last, row_keys(seed_key, sample_ids, 0), *sampling), cache

        def decode(state, cache, token, position, step, seed_key, sample_ids, sampling):
            self.traces["decode"] += 1
            model = nnx.merge(graphdef, state)
            logits, cache = model.extend(token[:, None], cache, position)  # (B, 1, V)
            return sample_tokens(logits[:, 0], row_keys(seed_key, sample_ids, step), *sampling), cache

        def full(state, window, lengths, step, seed_key, sample_ids, sampling):
            self.traces["full"] += 1
            logits = nnx.merge(graphdef, state)(window)  # (B, S, V)
            last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # (B, V)
            return sample_tokens(last, row_keys(seed_key, sample_ids, step), *sampling)

        self._prefill = jax.jit(prefill, donate_argnums=(1,))
        self._decode = jax.jit(decode, donate_argnums=(1,))
        self._full = jax.jit(full)

    def compiled_sizes(self) -> dict[str, int]:
        """Entries in each jitted function's compilation cache."""
        return {name: f._cache_size() for name, f in (("prefill", self._prefill), ("decode", self._decode), ("full", self._full))}

    def fit_prompts(self, prompts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Left-truncate prompts to context_length - 1 tokens (warning once) so at least one token fits."""
        limit = self.cfg.context_length - 1
        out = []
        for p in prompts:
            p = [int(t) for t in p]
            if not p:
                raise ValueError("empty prompt: give at least one token (e.g. the <|endoftext|> id)")
            if len(p) > limit:
                warnings.warn(
                    f"prompt of {len(p)} tokens is longer than the context window allows "
                    f"({self.cfg.context_length} positions, keeping the last {limit} tokens)",
                    stacklevel=3,
                )
                p = p[-limit:]
            out.append(p)
        return out

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

        Rows stop at `eot_id` (not included in the output), after max_new_tokens,
        or when the context window is full. `sample_ids` (default 0 ... B-1) pick
        each row's random stream. `on_tokens(tokens (B,), active (B,) bool)` is
        called after every step with the new token of each row (streaming).
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        prompts = self.fit_prompts(prompts)
        B, ctx = len(prompts), self.cfg.context_length
        lengths = np.array([len(p) for p in prompts], np.int32)  # (B,)
        # The longest row needs its prompt plus max_new_tokens - 1 fed-back tokens in the cache;
        # lengths are rounded up to buckets (capped at the context) so few shapes compile.
        S = min(ctx, _round_up(int(lengths.max()) + max_new_tokens, self.CACHE_BUCKET))
        P = min(S, _round_up(int(lengths.max()), self.PREFILL_BUCKET))
        ids = np.array(range(B) if sample_ids is None else sample_ids, np.int32)
        if ids.shape != (B,):
            raise ValueError(f"sample_ids must have one entry per prompt ({B}), got {len(ids)}")
        seed_key = jax.random.key(seed)
        knobs = sampling.as_arrays()
        budget = np.minimum(max_new_tokens, ctx - lengths)  # (B,) new tokens each row may produce

        if use_cache:
            padded = np.zeros((B, P), np.int32)
            for b, p in enumerate(prompts):
                padded[b, : len(p)] = p
            cache: KVCache = nnx.merge(self.graphdef, self.state).init_cache(B, S)
            token, cache = self._prefill(self.state, cache, padded, lengths, seed_key, ids, knobs)
        else:
            window = np.zeros((B, S), np.int32)
            for b, p in enumerate(prompts):
                window[b, : len(p)] = p
            token = self._full(self.state, window, lengths, 0, seed_key, ids, knobs)

        out: list[list[int]] = [[] for _ in range(B)]
        stop = [""] * B
        step = 0
        while True:
            tok = np.asarray(token)  # (B,): the token at position lengths + step
            active = np.array([not s for s in stop])
            for b in np.flatnonzero(active):
                if eot_id is not None and tok[b] == eot_id:
                    stop[b] = "eot"
                    continue
                out[b].append(int(tok[b]))
                if len(out[b]) >= budget[b]:
                    stop[b] = "length" if len(out[b]) >= max_new_tokens else "context"
            if on_tokens is not None:
                on_tokens(tok, active & np.array([not (s == "eot") for s in stop]))
            if all(stop):
                break
            step += 1
            position = np.minimum(lengths + step - 1, S - 1).astype(np.int32)  # slot of the fed-back token
            if use_cache:
                token, cache = self._decode(self.state, cache, token, position, step, seed_key, ids, knobs)
            else:
                window[np.arange(B), position] = tok
                token = self._full(self.state, window, position + 1, step, seed_key, ids, knobs)
        return Generation(out, stop, [len(p) for p in prompts])


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


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


# --------------------------------------------------------------------------- CLI: generate


def load_for_generation(path: str | Path):
    """(model, cfg, tokenizer) via jaxlm.checkpoint.restore_for_inference, with errors that name the path."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such run or checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory (give a run directory or RUN/checkpoints/<step>)")
    from jaxlm.checkpoint import restore_for_inference

    try:
        model, cfg, tokenizer = restore_for_inference(path)
    except Exception as e:  # orbax / config / missing-file errors all mean "cannot restore this path"
        raise CheckpointError(f"{path}: cannot restore a checkpoint: {type(e).__name__}: {e}") from e
    if tokenizer is None:
        raise CheckpointError(f"{path}: the run records no tokenizer (tokenizer/meta.json), so text cannot be encoded")
    return model, cfg, tokenizer


def _generate_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m jaxlm.generate",
        description="Sample text from a trained jaxlm checkpoint (see also: python -m jaxlm.generate bench --help).",
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="run directory (its latest checkpoint)")
    src.add_argument("--checkpoint", help="a run's checkpoint directory, e.g. RUN/checkpoints/600")
    ap.add_argument("--prompt", action="append", default=[], help="prompt text (repeat for a batch of prompts)")
    ap.add_argument("--prompt-file", action="append", default=[], help="a file whose whole text is one prompt")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1]; 1 = off")
    ap.add_argument("--top-k", type=int, default=0, help="0 = off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-samples", type=int, default=1, help="samples per prompt")
    ap.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    ap.add_argument("--no-cache", action="store_true", help="re-run the full forward per token (slow; for comparison)")
    args = ap.parse_args(argv)
    if not args.prompt and not args.prompt_file:
        ap.error("give --prompt TEXT or --prompt-file F")
    if args.num_samples < 1:
        ap.error("--num-samples must be >= 1")
    return args


def main_generate(argv=None) -> int:
    args = _generate_args(argv)
    try:
        sampling = SamplingParams(args.temperature, args.top_k, args.top_p)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    texts = list(args.prompt)
    for f in args.prompt_file:
        try:
            texts.append(Path(f).read_text(encoding="utf-8"))
        except OSError as e:
            print(f"error: cannot read prompt file {f}: {e}", file=sys.stderr)
            return 2
    try:
        model, cfg, tok = load_for_generation(args.run or args.checkpoint)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    eot = tok.eot_id
    prompts = [tok.encode(t) or ([eot] if eot is not None else [0]) for t in texts]
    rows = [(i, p) for i, p in enumerate(prompts) for _ in range(args.num_samples)]
    gen = Generator(model)
    kw = dict(seed=args.seed, eot_id=eot, use_cache=not args.no_cache)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        if args.stream:  # one row at a time (same sample ids, so the same text as a batch)
            for r, (i, p) in enumerate(rows):
                print(f"--- prompt {i} sample {r % args.num_samples}", file=sys.stderr)
                sys.stdout.write(texts[i])
                dec = StreamDecoder(tok)

                def emit(tokens, active, dec=dec):
                    if active[0]:
                        sys.stdout.write(dec.push(tokens[0]))
                        sys.stdout.flush()

                res = gen.generate([p], args.max_new_tokens, sampling, sample_ids=[r], on_tokens=emit, **kw)
                sys.stdout.write(dec.flush() + "\n")
                _report_stop(res.stop[0], cfg.model.context_length)
        else:
            res = gen.generate([p for _, p in rows], args.max_new_tokens, sampling, **kw)
            for r, (i, _) in enumerate(rows):
                print(f"--- prompt {i} sample {r % args.num_samples}", file=sys.stderr)
                print(texts[i] + tok.decode(res.tokens[r]))
                _report_stop(res.stop[r], cfg.model.context_length)
    return 0


def _report_stop(reason: str, context_length: int) -> None:
    if reason == "context":
        print(f"[stopped: the context window of {context_length} tokens is full]", file=sys.stderr)


# --------------------------------------------------------------------------- CLI: bench

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "quickstart.toml"


def bench(cfg, compute, *, batch: int, prompt_tokens: int, new_tokens: int, repeats: int, seed: int = 0,
          modes=("cache", "no-cache")) -> dict:
    """Greedy tokens/s of a random-init model, with and without the KV cache (compile excluded)."""
    model = TransformerLM(cfg, compute, rngs=nnx.Rngs(seed))
    gen = Generator(model)
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, cfg.vocab_size, size=(batch, prompt_tokens)).tolist()
    out = {"model": dataclasses.asdict(cfg), "compute": dataclasses.asdict(compute), "batch": batch, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
           "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend()}
    for mode in modes:
        use_cache = mode == "cache"
        t0 = time.perf_counter()
        gen.generate(prompts, new_tokens, SamplingParams(temperature=0.0), use_cache=use_cache)  # compile + warm-up
        warm = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = gen.generate(prompts, new_tokens, SamplingParams(temperature=0.0), use_cache=use_cache)
            times.append(time.perf_counter() - t0)
            assert all(len(t) == new_tokens for t in res.tokens)
        t = np.array(times)
        out[mode] = {"seconds_mean": float(t.mean()), "seconds_std": float(t.std()), "first_call_seconds": warm,
                     "tokens_per_second": batch * new_tokens / float(t.mean())}
    out["compiled"] = gen.compiled_sizes()
    if "cache" in out and "no-cache" in out:
        out["speedup"] = out["cache"]["tokens_per_second"] / out["no-cache"]["tokens_per_second"]
    return out


def main_bench(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxlm.generate bench",
                                 description="Tokens/s of generation with and without the KV cache (random-init model).")
    from jaxlm import cli

    cli.add_config_args(ap)  # [model] and [compute]; default: experiments/configs/quickstart.toml
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mode", choices=("both", "cache", "no-cache"), default="both")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    full = cli.load_config_from_args(args, path=QUICKSTART if args.preset is None else None)
    cfg = full.model
    if cfg.context_length < args.prompt_tokens + args.new_tokens:  # prompt + new tokens must fit
        cfg = dataclasses.replace(cfg, context_length=args.prompt_tokens + args.new_tokens)
    modes = ("cache", "no-cache") if args.mode == "both" else (args.mode,)
    res = bench(cfg, full.compute, batch=args.batch, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                repeats=args.repeats, modes=modes)
    m = res["model"]
    print(f"model d_model={m['d_model']} layers={m['num_layers']} heads={m['num_heads']} d_ff={m['d_ff']} "
          f"vocab={m['vocab_size']} context={m['context_length']} dtype={res['compute']['dtype']}; {res['backend']} "
          f"({res['device']}); batch {args.batch}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens")
    for mode in modes:
        r = res[mode]
        print(f"{mode:>9}: {r['tokens_per_second']:10.1f} tokens/s  ({r['seconds_mean']:.3f} +- {r['seconds_std']:.3f} s "
              f"per generation, first call {r['first_call_seconds']:.2f} s)")
    if "speedup" in res:
        print(f"  speedup: {res['speedup']:.1f}x   compilations: {res['compiled']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def main(argv=None) -> int:
    from jaxlm.host import tune_for_cpu_backend

    tune_for_cpu_backend()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        return main_bench(argv[1:])
    return main_generate(argv)


if __name__ == "__main__":
    sys.exit(main())
