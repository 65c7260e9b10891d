"""`python -m jaxlm.bench decode`: generation tokens/s of a random-init model, with and without the KV cache.

Tokens/s = batch x new tokens / wall time of a whole greedy generation (prefill
included, compilation excluded: one warm-up call first, then --repeats timed calls).
The model comes from the common config flags; its context_length is raised to
prompt + new tokens when smaller, so the figure measures the cache, not the
sliding window (past the window every step is a full forward).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from jaxlm import cli
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.files import write_json

MODES = ("cache", "no-cache")


def bench(cfg: ModelConfig, compute: ComputeConfig, *, batch: int, prompt_tokens: int, new_tokens: int, repeats: int,
          seed: int = 0, modes=MODES) -> dict:
    """Greedy tokens/s per mode, the mean and spread of the timed calls, and each step's compilation count."""
    import jax
    import numpy as np
    from flax import nnx

    from jaxlm.nn.decode import Generator, SamplingParams
    from jaxlm.nn.model import TransformerLM

    gen = Generator(TransformerLM(cfg, compute, rngs=nnx.Rngs(seed)), cfg.vocab_size)  # generate's masked sampling
    prompts = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(batch, prompt_tokens)).tolist()
    greedy = SamplingParams(temperature=0.0)
    out = {"model": dataclasses.asdict(cfg), "compute": dataclasses.asdict(compute), "batch": batch,
           "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "device": str(jax.devices()[0].device_kind),
           "backend": jax.default_backend()}
    for mode in modes:
        t0 = time.perf_counter()
        gen.generate(prompts, new_tokens, greedy, use_cache=mode == "cache")  # compile + warm-up
        first = time.perf_counter() - t0
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            gen.generate(prompts, new_tokens, greedy, use_cache=mode == "cache")
            times.append(time.perf_counter() - t0)
        t = np.array(times)
        out[mode] = {"seconds_mean": float(t.mean()), "seconds_std": float(t.std()), "first_call_seconds": first,
                     "tokens_per_second": batch * new_tokens / float(t.mean())}
    out["compiled"] = gen.compiled_sizes()
    if all(m in out for m in MODES):
        out["speedup"] = out["cache"]["tokens_per_second"] / out["no-cache"]["tokens_per_second"]
    return out


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    cli.add_config_args(p)
    p.add_argument("--new-tokens", metavar="N", type=int, default=256, help="tokens generated per row")
    p.add_argument("--prompt-tokens", metavar="N", type=int, default=16, help="random prompt tokens per row")
    p.add_argument("--batch", metavar="N", type=int, default=1, help="rows generated together")
    p.add_argument("--repeats", metavar="N", type=int, default=3, help="timed generations per mode, after one warm-up")
    p.add_argument("--mode", choices=("both", *MODES), default="both", help="with the KV cache, without, or both")
    p.add_argument("--seed", metavar="N", type=int, default=0, help="seed of the weights and the prompts")
    p.add_argument("--json", metavar="PATH", help="also write the results here")


def main(args: argparse.Namespace) -> int:
    for flag in ("--new-tokens", "--prompt-tokens", "--batch", "--repeats"):
        value = getattr(args, flag[2:].replace("-", "_"))
        cli.check_option(value >= 1, flag, value, "must be >= 1")
    full = cli.load_config_from_args(args)
    cfg = full.model
    if cfg.context_length < args.prompt_tokens + args.new_tokens:
        cfg = dataclasses.replace(cfg, context_length=args.prompt_tokens + args.new_tokens)
    from jaxlm.core.host import tune_for_cpu_backend

    tune_for_cpu_backend()
    modes = MODES if args.mode == "both" else (args.mode,)
    res = bench(cfg, full.compute, batch=args.batch, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                repeats=args.repeats, seed=args.seed, modes=modes)
    print(f"model d_model={cfg.d_model} layers={cfg.num_layers} heads={cfg.num_heads} d_ff={cfg.d_ff} "
          f"vocab={cfg.vocab_size} context={cfg.context_length} dtype={full.compute.dtype}; {res['backend']} "
          f"({res['device']}); batch {args.batch}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens")
    for mode in modes:
        r = res[mode]
        print(f"{mode:>9}: {r['tokens_per_second']:10.1f} tokens/s  ({r['seconds_mean']:.3f} ± {r['seconds_std']:.3f} s "
              f"per generation, first call {r['first_call_seconds']:.2f} s)")
    if "speedup" in res:
        print(f"  speedup of the cache: {res['speedup']:.1f}x   compilations: {res['compiled']}")
    if args.json:
        print(f"wrote {write_json(args.json, res)}")
    return 0
