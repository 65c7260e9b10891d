"""`python -m jaxlm.bench model`: model steps over a sweep of settings and shapes (docs/benchmarks.md).

The model comes from the common config flags (--config, --preset, --set); the sweep axes
(--context, --batch, --mode, --dtype, --attention, --remat) default to the config's values, and a
train step is training's own for that config (optimizer, accumulation, LoRA, QAT). Needs the core
install; a plugged-in side (`--framework`) the extra its help names; `--target` the 'gpu-compile' extra.
Examples:
  python -m jaxlm.bench model --preset small --context 128 256 512 1024 --mode forward forward_backward \\
      --dtype float32 bfloat16 --framework both --json runs/bench/small.json
  python -m jaxlm.bench model --preset small --context 1024 --mode train_step --dtype bfloat16 --find-max-batch
  python -m jaxlm.bench model --set model.d_model=64 --set model.num_layers=2 --context 64 --batch 1 1000 \\
      --memory-limit-gb 0.5          # the second row is marked OOM without running
  python -m jaxlm.bench model --target h100-80gb --preset small --context 1024 --batch 8 --mode train_step \\
      --dtype bfloat16 --remat none full --attention xla cudnn   # compiled for an H100 on any machine, no timing
A signal (SIGTERM, Ctrl-C) stops a sweep between rows and keeps the rows done: the table and the --json file
hold them, and one line says how many (exit 130).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path

from jaxlm import cli
from jaxlm.analysis.flops import MODES
from jaxlm.analysis.memory import search_largest
from jaxlm.bench import measure, output, sides  # import no framework
from jaxlm.core.config import ComputeConfig, Config
from jaxlm.core.errors import UserError
from jaxlm.core.stop import Interrupted, StopFlag
from jaxlm.predict.target import add_target_args

COMPUTE_CHOICES = {name: typing.get_args(tp) for name, tp in typing.get_type_hints(ComputeConfig).items()}


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    cli.add_config_args(p)
    p.add_argument("--context", metavar="T", type=int, nargs="+",
                   help="sequence lengths (default: model.context_length)")
    p.add_argument("--batch", metavar="B", type=int, nargs="+", default=[4], help="batch sizes")
    p.add_argument("--mode", metavar="MODE", nargs="+", choices=MODES,
                   help="what one step runs (default: forward; with --target, train_step)")
    p.add_argument("--dtype", metavar="DTYPE", nargs="+", choices=COMPUTE_CHOICES["dtype"],
                   help="compute dtypes (default: compute.dtype)")
    p.add_argument("--attention", metavar="KIND", nargs="+",
                   help="xla | cudnn | auto | window:N | cudnn+window:N (default: compute.attention)")
    p.add_argument("--remat", metavar="POLICY", nargs="+", choices=COMPUTE_CHOICES["remat"],
                   help="rematerialisation policies, JAX only (default: compute.remat)")
    sides.add_framework_arg(p)
    p.add_argument("--warmup", metavar="N", type=int, default=5, help="untimed steps before timing")
    p.add_argument("--steps", metavar="N", type=int, default=10, help="timed steps per row")
    p.add_argument("--seed", metavar="N", type=int, default=0, help="seed of the weights and the batch")
    p.add_argument("--peak-tflops", metavar="X", type=float,
                   help="device peak for MFU (default: the device table, jaxlm.analysis.devices)")
    p.add_argument("--memory-limit-gb", metavar="GB", type=float,
                   help="mark rows whose estimated memory exceeds this as OOM without running them (default: no limit)")
    p.add_argument("--find-max-batch", action="store_true",
                   help="largest batch that fits per setting and context (galloping, then bisection)")
    p.add_argument("--max-batch-limit", metavar="N", type=int, default=4096, help="upper bound of --find-max-batch")
    p.add_argument("--breakdown", action="store_true", help="time attention / feed-forward / head standalone (JAX)")
    p.add_argument("--memory-profile", metavar="DIR",
                   help="write pprof device-memory profiles and live-buffer listings")
    p.add_argument("--json", metavar="PATH", help="write the rows and the run's metadata here")
    p.add_argument("--csv", metavar="PATH", help="write the rows here")
    p.add_argument("--threads", metavar="N", type=int, help="run on N CPUs (the process's CPU affinity, which XLA's "
                   "thread pool follows, and OMP_NUM_THREADS; Linux) (default: every CPU the process may use)")
    p.add_argument("--quiet", action="store_true", help="no per-row progress lines")
    add_target_args(p, "report every row's compiled memory plan and predicted step time instead of timing it")
    sides.add_plugin_args(p)


def check_args(args: argparse.Namespace, cfg: Config) -> None:
    """Fill the axes from the config and stop, in one line naming the option, on a value out of range."""
    args.context = args.context or [cfg.model.context_length]
    args.mode = args.mode or ["train_step" if args.target or args.target_config else "forward"]
    args.dtype = args.dtype or [cfg.compute.dtype]
    args.attention = args.attention or [cfg.compute.attention]
    args.remat = args.remat or [cfg.compute.remat]
    for flag, values in (("--context", args.context), ("--batch", args.batch)):
        cli.check_option(min(values) >= 1, flag, min(values), "every size must be >= 1")
    cli.check_option(args.steps >= 1, "--steps", args.steps, "must be >= 1")
    cli.check_option(args.warmup >= 0, "--warmup", args.warmup, "must be >= 0")
    cli.check_option(args.max_batch_limit >= 1, "--max-batch-limit", args.max_batch_limit, "must be >= 1")
    cli.check_option(args.threads is None or args.threads >= 1, "--threads", args.threads, "must be >= 1")
    cli.check_option(args.memory_limit_gb is None or args.memory_limit_gb > 0, "--memory-limit-gb",
                     args.memory_limit_gb, "must be > 0")
    cli.check_option(args.peak_tflops is None or args.peak_tflops > 0, "--peak-tflops", args.peak_tflops, "must be > 0")
    for attention in args.attention:
        try:
            measure.parse_attention(attention)
        except ValueError as e:
            raise UserError(f"--attention: {e}") from None
    for flag, path in (("--json", args.json), ("--csv", args.csv)):
        output.check_output(flag, path)
    cli.check_option(not args.calibration or bool(args.target or args.target_config), "--calibration",
                     args.calibration, "calibrates predicted times: give --target or --target-config")


def settings_from(args, compute: ComputeConfig) -> list[measure.BenchCase]:
    out = []
    for fw in sides.chosen(args.framework):
        remats = args.remat if fw == sides.OWN else ["none"]  # remat is jaxlm's; other sides run without
        for mode in args.mode:
            for dtype in args.dtype:
                for attn in args.attention:
                    for remat in remats:
                        out.append(measure.BenchCase(fw, mode, dtype, attn, remat, compute=compute))
    return out


def progress_line(row: dict) -> None:
    status = f"{row['step_ms']:.2f} ms" if row.get("step_ms") else (row.get("error") or "")
    print(f"[bench] {row['framework']} {row['mode']} {row['dtype']} {row['attention']} remat={row['remat']} "
          f"T={row['context']} B={row['batch']}: {row['status']} {status}", flush=True)


def max_batch_rows(args, settings, base, opts, meta: dict, on_row) -> list[dict]:
    """The largest batch per setting and context (recorded in meta), then one row at each."""
    found = []
    for s in settings:
        for context in args.context:
            best = search_largest(measure.batch_fits(s, base, context, opts), args.max_batch_limit)
            found.append((s, context, best))
            print(f"[max batch] {s.label} T={context}: {best}", flush=True)
    meta["max_batch"] = [{"setting": s.label, "context": c, "max_batch": b} for s, c, b in found]
    rows = []
    for s, context, best in found:
        if best > 0:
            rows.append({**measure.run_one(s, base, context, best, opts), "max_batch": True})
            if on_row:
                on_row(rows[-1])
    measure.add_speed_ratios(rows)
    return rows


def extras(args, settings, base, meta: dict) -> None:
    """--breakdown (the first JAX setting at every shape) and --memory-profile (the first shape)."""
    jax_settings = [s for s in settings if s.framework == sides.OWN] or [measure.BenchCase()]
    if args.breakdown:
        from jaxlm.bench.breakdown import component_breakdown, format_breakdown

        for context in args.context:
            for batch in args.batch:
                comp = component_breakdown(*jax_settings[0].configs(base, context), batch, context,
                                           warmup=args.warmup, steps=args.steps)
                meta.setdefault("breakdown", []).append(comp)
                print(f"\ncomponent breakdown ({jax_settings[0].dtype}, T={context}, B={batch}):")
                print(format_breakdown(comp))
    if args.memory_profile:
        from jaxlm.bench.memory_profile import memory_profile

        others = [fw for fw in sides.chosen(args.framework) if fw != sides.OWN]
        for path in memory_profile(*jax_settings[0].configs(base, args.context[0]), args.batch[0], args.context[0],
                                   args.memory_profile, other_sides=others):
            print(f"[memory profile] {path}")


def write_outputs(args, rows: list[dict], meta: dict) -> None:
    if args.json:
        print(f"wrote {output.write_rows(rows, args.json, meta)}")
    if args.csv:
        print(f"wrote {output.write_csv(rows, args.csv)}")


def compiled_sweep(args, cfg: Config, name: str) -> int:
    """--target: every row compiled for the target GPU (train_step, or forward as the eval step); no timing.
    Stopped by a signal, it keeps the rows compiled so far (jaxlm.predict.rows.compiled_rows). Exit 1 when no
    row could be compiled (each row's error says why)."""
    from jaxlm.predict import calibration, target
    from jaxlm.predict.rows import BENCH_COLUMNS, compiled_rows

    t = target.parse_target(args.target, args.target_config)
    target.require_compiler()
    cli.check_option(args.framework == "jax", "--framework", args.framework, "--target compiles JAX steps only")
    for mode in args.mode:
        cli.check_option(mode in ("train_step", "forward"), "--mode", mode,
                         "with --target: train_step or forward (the eval step training runs)")
    cal = calibration.resolve(args.calibration, t.name, log=print)
    meta = {"options": vars(args), "model_config": dataclasses.asdict(cfg.model), "target": t.name, "label": t.label,
            "calibration": cal and cal.label}

    def progress(s, r: dict) -> None:
        what = f"{r['total_gib']:.3f} GiB per GPU" if r["status"] == "ok" else r.get("error", "")
        print(f"[compiled] {s.label} T={r['context']} B={r['batch']}: {r['status']} {what}", flush=True)

    def save(rows: list[dict]) -> str:
        print(f"\n{t.label}; predicted_* columns: {t.predicted_label}" + (f"; {cal.label}" if cal else ""))
        print(output.format_table(rows, BENCH_COLUMNS))
        write_outputs(args, rows, meta)
        return "the table above" + (f" and {args.json}" if args.json else "")

    rows = compiled_rows(settings_from(args, cfg.compute), cfg, args.context, args.batch, t, name,
                         args.max_batch_limit if args.find_max_batch else None, None if args.quiet else progress, save,
                         cal)
    save(rows)
    if rows and all(r["status"] != "ok" for r in rows):
        raise UserError(f"no row compiled: all {len(rows)} are invalid (first: {rows[0]['error']})")
    return 0


def timed_rows(args, settings, base, opts, meta: dict) -> list[dict]:
    """The timed sweep (or the largest batches); a signal stops it after the row in progress, keeping the rows
    done in the table and --json / --csv files (one line says how many, exit 130)."""
    kept: list[dict] = []
    total = len(settings) * len(args.context) * len(args.batch)

    def save(rows: list[dict]) -> str:
        print()
        print(output.format_table(rows))
        write_outputs(args, rows, meta)
        return "the table above" + "".join(f" and {f}" for f in (args.json, args.csv) if f)

    with StopFlag() as flag:
        flag.on_abort.append(lambda: f"{len(kept)} rows kept in {save(kept)}")

        def on_row(row: dict) -> None:
            kept.append(row)
            if not args.quiet:
                progress_line(row)
            if flag.signal:
                raise Interrupted(f"{flag.signal}: stopped after {len(kept)} of {total} rows; kept in {save(kept)}")

        if args.find_max_batch:
            return max_batch_rows(args, settings, base, opts, meta, on_row)
        return measure.run_sweep(base, settings, args.context, args.batch, opts, on_row=on_row)


def main(args: argparse.Namespace) -> int:
    cfg = cli.load_config_from_args(args)
    check_args(args, cfg)
    if args.target or args.target_config:
        return compiled_sweep(args, cfg, args.preset or (Path(args.config).stem if args.config else "default"))
    from jaxlm.core.host import describe, limit_cpu_threads, tune_for_cpu_backend

    if args.threads:
        limit_cpu_threads(args.threads)  # before the JAX backend starts: XLA sizes its thread pool then
    tune_for_cpu_backend()
    sides.load_chosen(args.framework)  # after --threads (a side's threads follow it); a missing extra stops here
    base = cfg.model
    name = args.preset or (Path(args.config).stem if args.config else "default")
    opts = measure.Options(warmup=args.warmup, steps=args.steps, memory_limit_gb=args.memory_limit_gb,
                           peak_tflops=args.peak_tflops, model_name=name + ("*" if args.overrides else ""),
                           seed=args.seed, run=cfg, side_args=vars(args))
    settings = settings_from(args, cfg.compute)
    meta = {"options": vars(args), "model_config": dataclasses.asdict(base), "threads": args.threads,
            "host": describe()}
    rows = timed_rows(args, settings, base, opts, meta)
    print()
    print(output.format_table(rows))
    extras(args, settings, base, meta)
    meta["host"]["load_avg_1m_end"] = describe()["load_avg_1m"]  # other work on the machine skews timings
    write_outputs(args, rows, meta)
    return 0
