"""Command line: `python -m jaxlm.bench [options]` or `python -m jaxlm.bench plot RESULTS.json --out DIR`.

The model comes from the usual config flags (--config, --preset, --set); the sweep axes
(--context, --batch, --mode, --dtype, --attention, --remat) default to the config's values.
Examples (docs/benchmarks.md has more):
  python -m jaxlm.bench --preset small --context 128 256 512 1024 --mode forward forward_backward \\
      --dtype float32 bfloat16 --framework both --json runs/bench/small.json --plot runs/bench/plots
  python -m jaxlm.bench --preset small --context 1024 --mode train_step --dtype bfloat16 --find-max-batch
  python -m jaxlm.bench --set model.d_model=64 --set model.num_layers=2 --context 64 --batch 1 1000 \\
      --memory-limit-gb 0.5          # the second row is marked OOM without running
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

# Before JAX is imported anywhere: allocate GPU memory on demand so torch can share the
# device and memory_stats() peaks reflect what the step used, not a 75 % preallocation.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from jaxlm import cli  # noqa: E402
from jaxlm.bench import core  # noqa: E402  (imports no framework)
from jaxlm.flops import MODES  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jaxlm.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_config_args(p)
    p.add_argument("--context", type=int, nargs="+", default=None, help="sequence lengths (default: model.context_length)")
    p.add_argument("--batch", type=int, nargs="+", default=[4], help="batch sizes (default: 4)")
    p.add_argument("--mode", nargs="+", default=["forward"], choices=MODES)
    p.add_argument("--dtype", nargs="+", default=None, choices=["float32", "bfloat16"], help="default: compute.dtype")
    p.add_argument("--attention", nargs="+", default=None,
                   help="xla | cudnn | auto | window:N | cudnn+window:N (default: compute.attention)")
    p.add_argument("--remat", nargs="+", default=None,
                   help="none | full | dots_saveable | offload, JAX only (default: compute.remat)")
    p.add_argument("--framework", default="jax", choices=["jax", "torch", "both"])
    p.add_argument("--no-compile", action="store_true", help="run torchref eagerly (no torch.compile)")
    p.add_argument("--torch-optimizer", default="torch", choices=["torch", "torchref"])
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: flops.PEAK_FLOPS)")
    p.add_argument("--memory-limit-gb", type=float, default=None,
                   help="mark rows whose estimated memory exceeds this as OOM without running them")
    p.add_argument("--find-max-batch", action="store_true",
                   help="largest batch that fits per setting and context (doubling, then bisection)")
    p.add_argument("--max-batch-limit", type=int, default=4096)
    p.add_argument("--breakdown", action="store_true", help="time attention / feed-forward / head standalone (JAX)")
    p.add_argument("--memory-profile", metavar="DIR", help="pprof device-memory profiles and live-buffer listings")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--csv", metavar="PATH")
    p.add_argument("--plot", metavar="DIR", help="write PNG figures from this sweep's rows")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for both frameworks (torch.set_num_threads; XLA's intra-op pool), "
                        "for fair CPU comparisons on a shared machine")
    p.add_argument("--quiet", action="store_true", help="no per-row progress lines")
    return p.parse_args(argv)


def settings_from(args) -> list[core.Setting]:
    frameworks = ["jax", "torch"] if args.framework == "both" else [args.framework]
    out = []
    for fw in frameworks:
        remats = args.remat if fw == "jax" else ["none"]
        for mode in args.mode:
            for dtype in args.dtype:
                for attn in args.attention:
                    core.parse_attention(attn)  # fail early on a typo
                    for remat in remats:
                        out.append(core.Setting(fw, mode, dtype, attn, remat, compile=not args.no_compile))
    return out


def set_cpu_threads(n: int) -> None:
    """Both frameworks on n CPU threads. XLA reads its flags when JAX initialises its CPU backend,
    so this must run before the first JAX computation (the CLI calls it first thing)."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen={'true' if n > 1 else 'false'} " \
                              f"intra_op_parallelism_threads={n}".strip()
    os.environ["OMP_NUM_THREADS"] = str(n)
    if importlib.util.find_spec("torch") is not None:  # optional: the torch extra
        import torch  # noqa: PLC0415 (torch does not initialise JAX)

        torch.set_num_threads(n)


def main_plot(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxlm.bench plot")
    p.add_argument("results", help="a --json file written by a sweep")
    p.add_argument("--out", required=True, help="directory for the PNG files")
    a = p.parse_args(argv)
    from jaxlm.bench.plots import plot_results

    for path in plot_results(core.read_rows(a.results), a.out):
        print(path)
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "plot":
        return main_plot(argv[1:])
    args = parse_args(argv)
    if args.threads:
        set_cpu_threads(args.threads)
    from jaxlm.host import tune_for_cpu_backend

    tune_for_cpu_backend()  # after set_cpu_threads: XLA flags must be set before the backend starts
    cfg = cli.load_config_from_args(args)
    base = cfg.model
    args.context = args.context or [base.context_length]
    args.dtype, args.attention, args.remat = (args.dtype or [cfg.compute.dtype], args.attention or [cfg.compute.attention],
                                              args.remat or [cfg.compute.remat])
    name = args.preset or (Path(args.config).stem if args.config else "default")
    opts = core.Options(warmup=args.warmup, steps=args.steps, memory_limit_gb=args.memory_limit_gb,
                        peak_tflops=args.peak_tflops, model_name=name + ("*" if args.overrides else ""),
                        seed=args.seed, torch_optimizer=args.torch_optimizer)
    settings = settings_from(args)
    meta = {"argv": argv, "model_config": dataclasses.asdict(base), "threads": args.threads}
    progress = None if args.quiet else (lambda r: print(
        f"[bench] {r['framework']} {r['mode']} {r['dtype']} {r['attention']} remat={r['remat']} "
        f"T={r['context']} B={r['batch']}: {r['status']} "
        + (f"{r['step_ms']:.2f} ms" if r.get("step_ms") else (r.get("error") or "")), flush=True))

    if args.find_max_batch:
        found = []
        for s in settings:
            for context in args.context:
                best = core.find_max_batch(core.batch_fits(s, base, context, opts), limit=args.max_batch_limit)
                found.append({"setting": s.label, "context": context, "max_batch": best})
                print(f"[max batch] {s.label} T={context}: {best}", flush=True)
        meta["max_batch"] = found
        rows = []
        for s in settings:
            for f in found:
                if f["setting"] == s.label and f["max_batch"] > 0:
                    row = core.run_one(s, base, f["context"], f["max_batch"], opts)
                    row["max_batch"] = True
                    rows.append(row)
                    if progress:
                        progress(row)
        core.add_speed_ratios(rows)
    else:
        rows = core.run_sweep(base, settings, args.context, args.batch, opts, on_row=progress)

    print()
    print(core.format_table(rows))
    if args.breakdown:
        from jaxlm.bench.breakdown import component_breakdown, format_breakdown

        for s in [s for s in settings if s.framework == "jax"][:1] or [core.Setting()]:
            for context in args.context:
                for batch in args.batch:
                    comp = component_breakdown(*s.configs(base, context), batch, context,
                                               warmup=args.warmup, steps=args.steps)
                    meta.setdefault("breakdown", []).append(comp)
                    print(f"\ncomponent breakdown ({s.dtype}, T={context}, B={batch}):")
                    print(format_breakdown(comp))
    if args.memory_profile:
        from jaxlm.bench.memory import memory_profile

        s = next((s for s in settings if s.framework == "jax"), core.Setting())
        for path in memory_profile(*s.configs(base, args.context[0]), args.batch[0], args.context[0],
                                   args.memory_profile, torch_too=args.framework in ("torch", "both")):
            print(f"[memory profile] {path}")
    if args.json:
        print(f"wrote {core.write_rows(rows, args.json, meta)}")
    if args.csv:
        print(f"wrote {core.write_csv(rows, args.csv)}")
    if args.plot:
        from jaxlm.bench.plots import plot_results

        for path in plot_results(rows, args.plot):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
