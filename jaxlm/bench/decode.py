"""`python -m jaxlm.bench decode`: generation tokens/s of a random-init model, with and without the KV cache.

Tokens/s = batch x new tokens / wall time of a whole greedy generation (prefill
included, compilation excluded: one warm-up call first, then --repeats timed calls).
The model comes from the common config flags; its context_length is raised to
prompt + new tokens when smaller, so the figure measures the cache, not the
sliding window (past the window every step is a full forward).

`--framework` with a plugged-in side (`jaxlm.bench.sides`; parity's: the PyTorch reference's
generation of the same weights) times it in the same process, alternating the two call by call,
and checks that the greedy tokens agree. Needs the core install; a plugged-in side, the extra its
`--framework` help names.
"""

from __future__ import annotations

import argparse
import dataclasses

from jaxlm import cli
from jaxlm.bench import sides
from jaxlm.bench.timing import Load, time_calls, timed, withheld
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.files import write_json

MODES = ("cache", "no-cache")


def bench(cfg: ModelConfig, compute: ComputeConfig, *, batch: int, prompt_tokens: int, new_tokens: int, repeats: int,
          seed: int = 0, modes=MODES, frameworks=(sides.OWN,)) -> dict:
    """Greedy tokens/s per mode and side (the mean and spread of the timed calls); with a second side, the ratio
    of jax's tokens/s to its (`speed_vs_reference`), marked when the machine was busy."""
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
        runs = {fw: sides.load(fw).decode_runner(model, compute, prompts, new_tokens, mode == "cache")
                for fw in frameworks}
        tokens, first, times = {}, {}, {fw: [] for fw in frameworks}
        for fw, (run, _) in runs.items():
            tokens[fw], first[fw] = timed(run)  # compile + warm-up
        with Load() as load:
            for _ in range(repeats):  # alternate the sides so load changes hit both alike
                for fw, (run, _) in runs.items():
                    times[fw] += time_calls(run, 1).seconds
        for fw in frameworks:
            t = np.array(times[fw])
            out.setdefault(fw, {})[mode] = {"seconds_mean": float(t.mean()), "seconds_std": float(t.std()),
                                            "first_call_seconds": first[fw],
                                            "tokens_per_second": batch * new_tokens / float(t.mean()),
                                            "compiled": runs[fw][1]()}
        if len(frameworks) == 2:
            own, ref = frameworks
            speed = out[own][mode]["tokens_per_second"] / out[ref][mode]["tokens_per_second"]
            out.setdefault("compared", {})[mode] = load.mark({
                "reference": ref, "speed_vs_reference": speed,
                "greedy_tokens_identical": tokens[own] == tokens[ref],
                "first_difference": first_difference(tokens[own], tokens[ref])})
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
    sides.add_framework_arg(p, "time")
    p.add_argument("--threads", metavar="N", type=int, help="CPU threads for both frameworks (default: each one's own)")
    p.add_argument("--seed", metavar="N", type=int, default=0, help="seed of the weights and the prompts")
    p.add_argument("--json", metavar="PATH", help="also write the results here")


def main(args: argparse.Namespace) -> int:
    for flag in ("--new-tokens", "--prompt-tokens", "--batch", "--repeats", "--threads"):
        value = getattr(args, flag[2:].replace("-", "_"))
        cli.check_option(value is None or value >= 1, flag, value, "must be >= 1")
    full = cli.load_config_from_args(args)
    cfg = full.model
    if cfg.context_length < args.prompt_tokens + args.new_tokens:
        cfg = dataclasses.replace(cfg, context_length=args.prompt_tokens + args.new_tokens)
    from jaxlm.core.host import limit_cpu_threads, tune_for_cpu_backend

    if args.threads:
        limit_cpu_threads(args.threads)
    frameworks = tuple(sides.load_chosen(args.framework))  # after --threads; a missing extra stops here
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
        if "compared" in res:
            r = res["compared"][mode]
            same = ("identical" if r["greedy_tokens_identical"] else
                    f"differ first at [row, token] {r['first_difference']}")
            what = f"jax/{r['reference']} tokens/s"
            ratio = withheld(what, [r]) or f"{what} {r['speed_vs_reference']:.2f}x"
            print(f"  {mode}: {ratio}; greedy tokens {same}")
    if "speedup" in res.get("jax", {}):
        print(f"  speedup of the jax cache: {res['jax']['speedup']:.1f}x")
    if args.json:
        print(f"wrote {write_json(args.json, res)}")
    return 0
