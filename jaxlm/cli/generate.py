"""Sample text from a trained run: `python -m jaxlm.generate --run RUN --prompt TEXT [options]`.

The model and tokenizer come from the run (its config.toml and latest checkpoint,
or --checkpoint RUN/checkpoints/STEP). The common config flags apply on top of the
run's config.toml: `--set compute.dtype=bfloat16` or `--set compute.attention=cudnn`
decodes differently, while a model.* value that differs from the run is refused
(the weights fix the architecture). Decoding itself lives in jaxlm/nn/decode.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Callable

from jaxlm import cli
from jaxlm.core.config import MAX_SEED, MAX_STEPS, Config, load_config
from jaxlm.core.errors import CheckpointError, ConfigError, DataError, UserError


def build_parser() -> argparse.ArgumentParser:
    ap = cli.ArgumentParser(command="jaxlm.generate", description=__doc__, formatter_class=cli.HelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a training run directory (its latest checkpoint)")
    src.add_argument("--checkpoint", metavar="DIR", help="one checkpoint of a run, e.g. RUN/checkpoints/600")
    ap.add_argument("--prompt", metavar="TEXT", action="append", default=[],
                    help="prompt text; repeat for a batch of prompts")
    ap.add_argument("--prompt-file", action="append", default=[], metavar="FILE",
                    help="a UTF-8 file whose whole text is one prompt; repeatable")
    ap.add_argument("--max-new-tokens", metavar="N", type=int, default=200, help="tokens to generate per sample (>= 1)")
    ap.add_argument("--temperature", metavar="T", type=float, default=1.0,
                    help="softmax temperature (>= 0); 0 = greedy")
    ap.add_argument("--top-p", metavar="P", type=float, default=1.0, help="nucleus probability mass in (0, 1]; 1 = off")
    ap.add_argument("--top-k", metavar="K", type=int, default=0, help="keep the k most likely tokens (>= 0); 0 = off")
    ap.add_argument("--seed", metavar="N", type=cli.bounded(int, 0, MAX_SEED), default=0,
                    help="random seed of the sampling")
    ap.add_argument("--num-samples", metavar="N", type=int, default=1, help="samples per prompt (>= 1)")
    ap.add_argument("--stream", action="store_true", help="print tokens as they are generated, one sample at a time")
    ap.add_argument("--no-cache", action="store_true", help="re-run the full forward per token (slow; for comparison)")
    ap.add_argument("--tokenizer", metavar="DIR", help="the tokenizer, for a run that records none (weights imported "
                    "without tokenizer.json): a directory with tokenizer.json or vocab.json + merges.txt, bytes, gpt2")
    cli.add_config_args(ap, base="the run's config.toml")
    return ap


def check_args(args: argparse.Namespace) -> list[str]:
    """Every option in range (one line naming the first that is not); returns the prompt texts."""
    cli.check_option(args.max_new_tokens >= 1, "--max-new-tokens", args.max_new_tokens, "must be >= 1")
    cli.check_option(args.temperature >= 0 and math.isfinite(args.temperature), "--temperature", args.temperature,
                "must be a finite number >= 0 (0 = greedy)")
    cli.check_option(0 < args.top_p <= 1, "--top-p", args.top_p, "must be in (0, 1] (1 = off)")
    cli.check_option(args.top_k >= 0, "--top-k", args.top_k, "must be >= 0 (0 = off)")
    cli.check_option(args.num_samples >= 1, "--num-samples", args.num_samples, "must be >= 1")
    texts = list(args.prompt)
    for f in args.prompt_file:
        try:
            texts.append(Path(f).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"--prompt-file {f}: cannot read it as UTF-8 text ({type(e).__name__}: {e})") from e
    if not texts:
        raise UserError("--prompt: no prompt given; pass --prompt TEXT or --prompt-file FILE")
    return texts


def run_config(path: str, args: argparse.Namespace) -> Config:
    """The run's config.toml with the flags on top; a model.* key that differs from the run is refused."""
    from jaxlm.training.checkpoint import find_run_dir

    if not Path(path).exists():
        raise CheckpointError(f"{path}: no such run or checkpoint directory")
    if not Path(path).is_dir():
        raise CheckpointError(f"{path}: not a directory; give a run directory or RUN/checkpoints/STEP")
    try:
        run_dir, _ = find_run_dir(path)
    except FileNotFoundError as e:
        raise CheckpointError(f"{path}: not a run directory (no config.toml in it or its parents)") from e
    saved = load_config(run_dir / "config.toml")
    cfg = cli.load_config_from_args(args, path=run_dir / "config.toml")
    for f in dataclasses.fields(saved.model):
        ran, asked = getattr(saved.model, f.name), getattr(cfg.model, f.name)
        if ran != asked:
            raise ConfigError(f"model.{f.name}: the run was trained with {ran!r}, the flags ask for {asked!r}; "
                              "generation keeps the run's architecture (compute.* keys may change)")
    return cfg


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    texts = check_args(args)
    path = args.run or args.checkpoint
    cfg = run_config(path, args)
    from jaxlm.core.host import (
        tune_for_cpu_backend,  # JAX loads only once the flags are good
    )
    from jaxlm.nn.decode import Generator, SamplingParams, encode_prompt
    from jaxlm.training.checkpoint import find_run_dir, load_for_generation

    tune_for_cpu_backend()
    model, tok = load_for_generation(path, cfg, args.tokenizer)
    check_vocabulary(tok.vocab_size, cfg.model.vocab_size, f"--tokenizer {args.tokenizer}" if args.tokenizer else
                     str(find_run_dir(path)[0] / "tokenizer"))
    rows = [i for i in range(len(texts)) for _ in range(args.num_samples)]  # row r continues prompt rows[r]
    encoded = [encode_prompt(tok, text) for text in texts]
    check_lengths(encoded, len(rows), args.max_new_tokens, cfg.model.context_length)
    prompts = [encoded[i] for i in rows]
    gen, sampling = Generator(model, tok.vocab_size), SamplingParams(args.temperature, args.top_k, args.top_p)
    kw = dict(seed=args.seed, eot_id=tok.stop_ids, use_cache=not args.no_cache)
    if args.stream:
        for r, i in enumerate(rows):
            print(f"--- prompt {i} sample {r % args.num_samples}", file=sys.stderr)
            stream_row(tok, texts[i], lambda emit: gen.generate(
                [prompts[r]], args.max_new_tokens, sampling, sample_ids=[r], on_tokens=emit, **kw))
        return 0
    res = gen.generate(prompts, args.max_new_tokens, sampling, **kw)
    for r, i in enumerate(rows):
        print(f"--- prompt {i} sample {r % args.num_samples}", file=sys.stderr)
        print(texts[i] + tok.decode(res.tokens[r]))
    return 0


def check_vocabulary(tokenizer_size: int, vocab_size: int, tokenizer: str) -> None:
    """Every id the tokenizer can give has a row in the embedding (a mismatched tokenizer would look ids up past
    the end: JAX clamps them, so the output is silently wrong)."""
    if tokenizer_size > vocab_size:
        raise DataError(f"{tokenizer}: has token ids up to {tokenizer_size - 1}, but the run's model.vocab_size = "
                        f"{vocab_size} (the embedding's rows); it is not the tokenizer these weights were trained with")


# Host bytes per token of the output: the packed prompts, their device copy and the copy fetched back (int32
# each), and the Python list of ids returned (an 8-byte pointer and, past the cached small ints, a 32-byte int).
BYTES_PER_TOKEN = 3 * 4 + 8 + 32


def check_lengths(prompts: list[list[int]], rows: int, max_new_tokens: int, context: int) -> None:
    """--max-new-tokens within what this run can hold (positions are int32; each of the `rows` rows' tokens are
    kept in host memory until the end); a warning for each prompt longer than the context (the model sees its end)."""
    from jaxlm.core.limits import host_memory

    for i, p in enumerate(prompts):
        if len(p) > context:
            print(f"warning: prompt {i} is {len(p):,} tokens, longer than model.context_length = {context}: the "
                  f"model sees only its last {context}", file=sys.stderr)
    longest = min(max(map(len, prompts)), context)
    cli.check_option(longest + max_new_tokens <= MAX_STEPS, "--max-new-tokens", max_new_tokens,
                     f"must be at most {MAX_STEPS - longest:,} (a row's positions are int32)")
    need, have = rows * (longest + max_new_tokens) * BYTES_PER_TOKEN, host_memory()
    if have is not None and need > have[0]:
        fits = max(have[0] // (rows * BYTES_PER_TOKEN) - longest, 0)
        cli.check_option(False, "--max-new-tokens", max_new_tokens,
                         f"{rows} row(s) of {longest + max_new_tokens:,} tokens need about {need / 2**30:.1f} GiB of "
                         f"host memory, but {have[1]} {have[0] / 2**30:.1f} GiB; at most about {fits:,} fit")


def stream_row(tok, text: str, generate: Callable) -> None:
    """Print `text`, then each new character as soon as its bytes are complete; `generate(on_tokens)` runs
    one row (with that row's sample id, so the text equals the batched output)."""
    from jaxlm.nn.decode import StreamDecoder

    dec = StreamDecoder(tok)
    sys.stdout.write(text)

    def emit(tokens, active):
        if active[0]:
            sys.stdout.write(dec.push(tokens[0]))
            sys.stdout.flush()

    generate(emit)
    sys.stdout.write(dec.flush() + "\n")
