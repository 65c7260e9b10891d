"""`--memory-profile DIR`: what holds memory in a forward pass and in a train step; and the check of
the estimator (jaxlm.memory) against `memory_analysis()` (`python -m jaxlm.memory validate`).

Writes, for mode in (forward, train_step):
- `jax_{mode}.prof`: `jax.profiler.save_device_memory_profile` (pprof; view with
  `pprof -http=: jax_train_step.prof` or upload to a pprof viewer). It records
  the buffers live at the moment it is called, i.e. right after the step with
  its outputs held, not the transient peak inside the step;
- `jax_{mode}_buffers.txt`: the compiled step's `memory_analysis()` (the
  temp bytes are the in-step transient peak) and the largest live arrays
  (`jax.live_arrays()` by size, with shape and dtype);
- what each plugged-in side asked for writes (`memory_snapshot`; parity's: an allocation
  history on a GPU, a note on the CPU).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax

from jaxlm.bench import sides, steps
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.training.tracking import peak_memory_bytes


def _describe_analysis(compiled) -> list[str]:
    try:
        m = compiled.memory_analysis()
    except Exception as e:  # some backends have none
        return [f"memory_analysis unavailable: {e}"]
    if m is None:
        return ["memory_analysis unavailable on this backend"]
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes")
    lines = [f"  {f:32s} {getattr(m, f) / 2**20:12.3f} MiB" for f in fields if hasattr(m, f)]
    total = steps.compiled_memory_bytes(compiled)
    if total is not None:
        lines.append(f"  {'total (arg+out+temp-alias)':32s} {total / 2**20:12.3f} MiB")
    return lines


def _live_arrays(top: int) -> list[str]:
    arrays = sorted(jax.live_arrays(), key=lambda a: a.nbytes, reverse=True)
    total = sum(a.nbytes for a in arrays)
    lines = [f"live arrays: {len(arrays)}, {total / 2**20:.3f} MiB in all; the {min(top, len(arrays))} largest:"]
    for a in arrays[:top]:
        lines.append(f"  {a.nbytes / 2**20:10.3f} MiB  {str(a.dtype):9s} {tuple(a.shape)}")
    return lines


def memory_profile(cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, out_dir: str | Path, *,
                   other_sides: tuple[str, ...] = (), top: int = 25) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for mode in ("forward", "train_step"):
        step = steps.build_step(mode, cfg, compute, batch, context)
        compiled = steps.compile_step(step)
        outputs = compiled(*step.args)
        jax.block_until_ready(outputs)
        prof = out / f"jax_{mode}.prof"
        try:
            jax.profiler.save_device_memory_profile(str(prof))
            written.append(prof)
        except Exception as e:  # keep the text report even if pprof output fails
            (out / f"jax_{mode}.prof.error.txt").write_text(f"save_device_memory_profile failed: {e}\n")
        lines = [f"{mode}: {dataclasses.asdict(cfg)} {dataclasses.asdict(compute)}", f"batch {batch}, context {context}, device {steps.device_kind()}",
                 "", "compiled memory_analysis():"] + _describe_analysis(compiled)
        peak = peak_memory_bytes()
        lines.append(f"  runtime peak_bytes_in_use (process): {peak / 2**20:.3f} MiB" if peak is not None
                     else "  runtime peak: not available on this backend")
        lines += ["", *_live_arrays(top)]
        txt = out / f"jax_{mode}_buffers.txt"
        txt.write_text("\n".join(lines) + "\n")
        written.append(txt)
        del outputs, step, compiled
    for name in other_sides:  # plugged-in sides (jaxlm.bench.sides) write their own
        written.append(sides.load(name).memory_snapshot(cfg, compute, batch, context, out))
    return written


# --------------------------------------------------------------------------- estimator validation

# (d_model, num_layers, num_heads, vocab_size, context, batch): float32 train steps without remat, where
# XLA:CPU's memory_analysis() is faithful; head size 64 as in the presets, except where noted by the shape.
VALIDATION_ROWS = (
    (256, 4, 4, 1000, 128, 4), (256, 4, 4, 1000, 256, 4), (256, 4, 4, 1000, 512, 2), (256, 8, 4, 1000, 128, 8),
    (512, 4, 8, 1000, 256, 4), (512, 4, 8, 10000, 128, 4), (384, 6, 6, 5000, 256, 4), (512, 2, 8, 10000, 256, 2),
    (256, 4, 4, 10000, 128, 16), (128, 4, 2, 1000, 256, 8), (512, 8, 8, 10000, 512, 1), (768, 2, 12, 10000, 256, 2),
    (256, 4, 4, 4000, 1024, 1), (384, 4, 6, 2000, 128, 8),
)
MARK_BEGIN, MARK_END = "<!-- validation table: begin -->", "<!-- validation table: end -->"


def validation_row(d: int, layers: int, heads: int, vocab: int, context: int, batch: int,
                   mode: str = "train_step") -> dict:
    """One row: the estimator's peak against the compiled step's memory_analysis() (temp + arguments +
    outputs - aliased), float32, xla attention, no remat."""
    from jaxlm.analysis import memory

    cfg = ModelConfig(vocab_size=vocab, context_length=context, d_model=d, num_layers=layers, num_heads=heads)
    compiled = steps.compile_step(steps.build_step(mode, cfg, ComputeConfig(), batch, context))
    measured = steps.compiled_memory_bytes(compiled)
    est = memory.estimate(cfg, batch, context, ComputeConfig(), mode, backend="cpu").total
    return dict(d_model=d, layers=layers, heads=heads, vocab=vocab, context=context, batch=batch, mode=mode,
                estimate_bytes=est, measured_bytes=measured, error=est / measured - 1)


def validation_table(rows: list[dict]) -> str:
    lines = ["| d_model | layers | heads | vocab | context | batch | estimate MiB | memory_analysis MiB | error |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['d_model']} | {r['layers']} | {r['heads']} | {r['vocab']} | {r['context']} | {r['batch']} "
                     f"| {r['estimate_bytes'] / 2**20:.1f} | {r['measured_bytes'] / 2**20:.1f} | {100 * r['error']:+.1f}% |")
    errs = [abs(r["error"]) for r in rows]
    within = sum(e <= 0.10 for e in errs)
    lines += ["", f"{len(rows)} rows; mean absolute error {100 * sum(errs) / len(errs):.1f}%, largest "
                  f"{100 * max(errs):.1f}%; {within} of {len(rows)} within 10%. Measured with jax {jax.__version__} "
                  f"on {steps.device_kind()}."]
    return "\n".join(lines)


def write_validation(text: str, out: Path) -> None:
    """Replace the table between the markers in `out` (or append it with its markers)."""
    from jaxlm.core.files import write_between_markers

    write_between_markers(out, text, MARK_BEGIN, MARK_END)


def validate_main(argv: list[str]) -> int:
    from jaxlm import cli

    parser = cli.ArgumentParser(prog="python -m jaxlm.memory validate", formatter_class=cli.HelpFormatter,
                                description="Compare the memory estimate with XLA's memory_analysis() of the "
                                            "compiled float32 train step on this machine's backend, row by row; "
                                            "with --target, with the GPU compiler's plan of each step.")
    parser.add_argument("--out", type=Path, help="write the table into this Markdown file (between its markers)")
    parser.add_argument("--rows", type=cli.bounded(int, 1), help="first N rows only (default: all)")
    parser.add_argument("--target", metavar="GPU", help="compile for this GPU (the gpu-compile extra): h100-80gb, ...")
    parser.add_argument("--cache", type=Path, metavar="JSON", help="with --target: keep the compiled figures here "
                        "and reuse them (per row, target and jax version)")
    parser.add_argument("--calibrate", action="store_true", help="with --target: fit the estimator's GPU_BYTES on "
                        "compiled two-layer probes (jaxlm.bench.gpu_validation.PROBES) and print them")
    args = parser.parse_args(argv)
    if args.target:
        from jaxlm.bench import gpu_validation

        if args.calibrate:
            from jaxlm.bench import target as gpu

            fitted = gpu_validation.calibrate(gpu.parse_target(args.target), args.cache)
            print("GPU_BYTES = {\n" + "".join(f"    {k}: {v},\n" for k, v in fitted.items()) + "}")
        else:
            print(gpu_validation.validate(args.target, args.out, args.cache, args.rows))
        return 0
    args.rows = args.rows or len(VALIDATION_ROWS)
    rows = []
    for i, shape in enumerate(VALIDATION_ROWS[:args.rows]):
        rows.append(validation_row(*shape))
        r = rows[-1]
        print(f"[{i + 1}/{args.rows}] {shape}: estimate {r['estimate_bytes'] / 2**20:.1f} MiB, "
              f"memory_analysis {r['measured_bytes'] / 2**20:.1f} MiB ({100 * r['error']:+.1f}%)", flush=True)
    table = validation_table(rows)
    if args.out:
        write_validation(table, args.out)
        print(f"wrote {args.out}")
    else:
        print(table)
    return 0
