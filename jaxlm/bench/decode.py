"""`python -m jaxlm.bench decode`: generation tokens/s of a random-init model, with and without the KV cache.

Tokens/s = batch x new tokens / wall time of a whole greedy generation (prefill
included, compilation excluded: one warm-up call first, then --repeats timed calls).
The model comes from the common config flags; its context_length is raised to
prompt + new tokens when smaller, so the figure measures the cache, not the
sliding window (past the window every step is a full forward).

`--framework torch|both` (from `python -m parity.bench decode`, which registers the
torch side) times torchref's reference generation of the same weights in the same
process, alternating the two call by call, and checks that the greedy tokens agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from jaxlm import cli
from jaxlm.bench import core
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.files import write_json

MODES = ("cache", "no-cache")


def bench(cfg: ModelConfig, compute: ComputeConfig, *, batch: int, prompt_tokens: int, new_tokens: int, repeats: int,
          seed: int = 0, modes=MODES, frameworks=("jax",)) -> dict:
    """Greedy tokens/s per mode and framework (the mean and spread of the timed calls), jax/torch ratios."""
    import jax
    import numpy as np
    from flax import nnx

    from jaxlm.nn.model import TransformerLM

    model = TransformerLM(cfg, compute, rngs=nnx.Rngs(seed))
    prompts = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(batch, prompt_tokens)).tolist()
    out = {"model": dataclasses.asdict(cfg), "compute": dataclasses.asdict(compute), "batch": batch,
           "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "device": str(jax.devices()[0].device_kind),
           "backend": jax.default_backend()}
    for mode in modes:
        runs = {fw: core.framework_side(fw).decode_runner(model, compute, prompts, new_tokens, mode == "cache")
                for fw in frameworks}
        tokens, first, times = {}, {}, {fw: [] for fw in frameworks}
        for fw, (run, _) in runs.items():
            t0 = time.perf_counter()
            tokens[fw] = run()  # compile + warm-up
            first[fw] = time.perf_counter() - t0
        for _ in range(repeats):  # alternate the frameworks so load changes hit both alike
            for fw, (run, _) in runs.items():
                t0 = time.perf_counter()
                run()
                times[fw].append(time.perf_counter() - t0)
        for fw in frameworks:
            t = np.array(times[fw])
            out.setdefault(fw, {})[mode] = {"seconds_mean": float(t.mean()), "seconds_std": float(t.std()),
                                            "first_call_seconds": first[fw],
                                            "tokens_per_second": batch * new_tokens / float(t.mean()),
                                            "compiled": runs[fw][1]()}
        if len(frameworks) == 2:
            out.setdefault("jax_torch", {})[mode] = {
                "speed": out["jax"][mode]["tokens_per_second"] / out["torch"][mode]["tokens_per_second"],
                "greedy_tokens_identical": tokens["jax"] == tokens["torch"],
                "first_difference": first_difference(tokens["jax"], tokens["torch"])}
    if "jax" in frameworks and all(m in out["jax"] for m in MODES):
        out["jax"]["speedup"] = out["jax"]["cache"]["tokens_per_second"] / out["jax"]["no-cache"]["tokens_per_second"]
    return out


def first_difference(a: list[list[int]], b: list[list[int]]) -> list[int] | None:
    """[row, token index] of the first token where two generations differ, or None."""
    for r, (x, y) in enumerate(zip(a, b)):
        for i in range(max(len(x), len(y))):
            if x[i:i + 1] != y[i:i + 1]:
                return [r, i]
    return None


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    cli.add_config_args(p)
    p.add_argument("--new-tokens", metavar="N", type=int, default=256, help="tokens generated per row")
    p.add_argument("--prompt-tokens", metavar="N", type=int, default=16, help="random prompt tokens per row")
    p.add_argument("--batch", metavar="N", type=int, default=1, help="rows generated together")
    p.add_argument("--repeats", metavar="N", type=int, default=3, help="timed generations per mode, after one warm-up")
    p.add_argument("--mode", choices=("both", *MODES), default="both", help="with the KV cache, without, or both")
    p.add_argument("--framework", default="jax", choices=["jax", "torch", "both"],
                   help="which side(s) to time; torch needs `python -m parity.bench decode`")
    p.add_argument("--threads", metavar="N", type=int, help="CPU threads for both frameworks (default: each one's own)")
    p.add_argument("--seed", metavar="N", type=int, default=0, help="seed of the weights and the prompts")
    p.add_argument("--json", metavar="PATH", help="also write the results here")


def main(args: argparse.Namespace) -> int:
    for flag in ("--new-tokens", "--prompt-tokens", "--batch", "--repeats", "--threads"):
        value = getattr(args, flag[2:].replace("-", "_"))
        cli.check_option(value is None or value >= 1, flag, value, "must be >= 1")
    frameworks = core.FRAMEWORKS if args.framework == "both" else (args.framework,)
    for fw in frameworks:
        core.framework_side(fw, "decode")  # a torch side that is not registered stops here in one line
    full = cli.load_config_from_args(args)
    cfg = full.model
    if cfg.context_length < args.prompt_tokens + args.new_tokens:
        cfg = dataclasses.replace(cfg, context_length=args.prompt_tokens + args.new_tokens)
    from jaxlm.core.host import limit_cpu_threads, tune_for_cpu_backend

    if args.threads:
        limit_cpu_threads(args.threads)

    tune_for_cpu_backend()
    modes = MODES if args.mode == "both" else (args.mode,)
    res = bench(cfg, full.compute, batch=args.batch, prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                repeats=args.repeats, seed=args.seed, modes=modes, frameworks=frameworks)
    print(f"model d_model={cfg.d_model} layers={cfg.num_layers} heads={cfg.num_heads} d_ff={cfg.d_ff} "
          f"vocab={cfg.vocab_size} context={cfg.context_length} dtype={full.compute.dtype}; {res['backend']} "
          f"({res['device']}); batch {args.batch}, prompt {args.prompt_tokens}, {args.new_tokens} new tokens")
    for mode in modes:
        for fw in frameworks:
            r = res[fw][mode]
            print(f"{fw:>5} {mode:>8}: {r['tokens_per_second']:10.1f} tokens/s  ({r['seconds_mean']:.3f} ± "
                  f"{r['seconds_std']:.3f} s per generation, first call {r['first_call_seconds']:.2f} s)")
        if "jax_torch" in res:
            r = res["jax_torch"][mode]
            same = "identical" if r["greedy_tokens_identical"] else f"differ first at [row, token] {r['first_difference']}"
            print(f"  {mode}: jax/torch tokens/s {r['speed']:.2f}x; greedy tokens {same}")
    if "speedup" in res.get("jax", {}):
        print(f"  speedup of the jax cache: {res['jax']['speedup']:.1f}x")
    if args.json:
        print(f"wrote {write_json(args.json, res)}")
    return 0
