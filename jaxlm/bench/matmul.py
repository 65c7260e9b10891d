"""`python -m jaxlm.bench matmul`: the train step's projection matmuls, one by one, in GFLOP/s.

Every projection of the model (q/k/v/output, the feed-forward's in and out, the output head) at
the step's B x T tokens, in the three forms a train step runs: the forward product x @ W.T, the input
gradient g @ W and the weight gradient g.T @ x. With `--framework both` a plugged-in side's product on
the same float32 operands runs beside each (parity's: the PyTorch reference's `@`), the two in alternating
blocks of calls, so a change of load hits both alike. Run it twice, with `--threads 1` and without, to see
how each library's matmuls scale from one core to all of them (docs/benchmarks.md, "Where the CPU step
goes"). Needs the core install; a plugged-in side, the extra its `--framework` help names.
"""

from __future__ import annotations

import argparse
import statistics

from jaxlm import cli
from jaxlm.bench import sides
from jaxlm.bench.timing import Load, time_calls, withheld
from jaxlm.core.config import ModelConfig
from jaxlm.core.files import write_json

FORMS = {  # name: (what the train step computes, the operand shapes from (tokens, d_in, d_out), the product of
    # two operands, written once for the arrays of every side alike)
    "forward": ("x @ W.T", lambda k, i, o: ((k, i), (o, i)), lambda x, w: x @ w.T),
    "input grad": ("g @ W", lambda k, i, o: ((k, o), (o, i)), lambda g, w: g @ w),
    "weight grad": ("g.T @ x", lambda k, i, o: ((k, o), (k, i)), lambda g, x: g.T @ x),
}


BLOCK = 10  # timed calls of one side in a row, after it has run untimed for timing.SETTLE_S


def projections(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Each distinct projection of the model: name -> (d_in, d_out)."""
    out = {"attention (q, k, v, output)": (cfg.d_model, cfg.d_model),
           "feed-forward in": (cfg.d_model, cfg.d_ff),
           "feed-forward out": (cfg.d_ff, cfg.d_model)}
    if cfg.vocab_size:
        out["output head"] = (cfg.d_model, cfg.vocab_size)
    return out


def bench(cfg: ModelConfig, tokens: int, repeats: int, frameworks=(sides.OWN,), seed: int = 0) -> list[dict]:
    """GFLOP/s of every projection in every form: the median of `repeats` calls, in blocks of `BLOCK` calls of each
    side in alternating order (settled first); with a second side, jax's GFLOP/s over its (`speed_vs_reference`),
    each row marked with the machine's load while it was timed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for name, (d_in, d_out) in projections(cfg).items():
        for form, (expr, shapes, product) in FORMS.items():
            a, b = (rng.standard_normal(s, dtype=np.float32) for s in shapes(tokens, d_in, d_out))
            calls = {fw: sides.load(fw).matmul_call(product, a, b) for fw in frameworks}
            times = {fw: [] for fw in frameworks}
            with Load() as load:
                for r in range(-(-repeats // BLOCK)):
                    for fw in (frameworks if r % 2 == 0 else frameworks[::-1]):
                        times[fw] += time_calls(calls[fw], BLOCK, settled=True).seconds
            flop = 2 * tokens * d_in * d_out
            row = {"projection": name, "form": form, "expr": expr, "m_k_n": f"{tokens}x{d_in}->{d_out}"}
            for fw in frameworks:
                row[f"{fw}_gflops"] = flop / statistics.median(times[fw]) / 1e9
            if len(frameworks) == 2:
                row.update(reference=frameworks[1],
                           speed_vs_reference=row[f"{frameworks[0]}_gflops"] / row[f"{frameworks[1]}_gflops"])
                load.mark(row)
            rows.append(row)
    return rows


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    cli.add_config_args(p)
    p.add_argument("--context", metavar="T", type=int, help="sequence length (default: model.context_length)")
    p.add_argument("--batch", metavar="B", type=int, default=4, help="batch size: the matmuls have B x T rows")
    p.add_argument("--repeats", metavar="N", type=int, default=40, help="timed calls of each matmul per framework")
    sides.add_framework_arg(p, "time")
    p.add_argument("--threads", metavar="N", type=int,
                   help="run on N CPUs (Linux; default: every CPU the process may use)")
    p.add_argument("--json", metavar="PATH", help="also write the rows here")


def main(args: argparse.Namespace) -> int:
    for flag in ("--context", "--batch", "--repeats", "--threads"):
        value = getattr(args, flag[2:])
        cli.check_option(value is None or value >= 1, flag, value, "must be >= 1")
    cfg = cli.load_config_from_args(args).model
    from jaxlm.core.host import describe, limit_cpu_threads

    if args.threads:
        limit_cpu_threads(args.threads)
    frameworks = tuple(sides.load_chosen(args.framework))  # after --threads; a missing extra stops here
    tokens = args.batch * (args.context or cfg.context_length)
    rows = bench(cfg, tokens, args.repeats, frameworks)
    host = describe()
    print(f"{host['cpu_model']} ({host['cpu_family_model'] or 'family unknown'}), "
          f"{args.threads or host['cpus']} CPU(s); "
          f"float32; GFLOP/s, median of {args.repeats} calls")
    for r in rows:
        line = f"{r['projection']:>28} {r['form']:>11} {r['m_k_n']:>18}: " + "  ".join(
            f"{fw} {r[f'{fw}_gflops']:6.0f}" for fw in frameworks)
        if "reference" in r:
            line += f"  jax/{r['reference']} {'busy' if r['busy'] else format(r['speed_vs_reference'], '.2f')}"
        print(line)
    note = withheld("jax/reference ratios", [r for r in rows if "reference" in r])
    if note:
        print(note)
    if args.json:
        print(f"wrote {write_json(args.json, {'host': host, 'threads': args.threads, 'tokens': tokens, 'rows': rows})}")
    return 0
