"""`python -m jaxlm.bench ops --target GPU`: where a GPU step's time would go, kernel by kernel, predicted from
the program XLA's GPU compiler builds for that GPU on any machine (no GPU needed).

    python -m jaxlm.bench ops --target h100-80gb --preset small --context 1024 --batch 8 \\
        --set compute.dtype=bfloat16 --json kernels.json

The Nsight-style summary of jaxlm.analysis.roofline over the compiled step (training's own, as
`python -m jaxlm.memory --target` compiles it): the kernels grouped (matmul, attention,
softmax/normalisation, other elementwise, optimizer update, collectives, copies), each group's predicted
time, share, FLOPs, bytes and what bounds it (compute, memory, launch, link), the step by pass and by part
of the model, the slowest ops (one op's kernels summed over the layers, as Nsight's kernel summary sums one
kernel's launches) and the slowest kernels, with the jax op and source line they come from. Predicted from the
compiled program, not measured: docs/benchmarks.md ("Predicted GPU time") says what the model leaves out.
"""

from __future__ import annotations

import argparse
import dataclasses

from jaxlm import cli
from jaxlm.analysis import hlo
from jaxlm.core.errors import UsageError
from jaxlm.core.files import write_json
from jaxlm.training import compiled as gpu

TOP = 15  # kernels listed at least


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("predict a GPU's kernels instead of profiling this machine (the gpu-compile extra)")
    which = g.add_mutually_exclusive_group()
    which.add_argument("--target", metavar="GPU[:N]", help="compile the step for N of a known GPU (h100-80gb, h200, "
                       "a100-40gb, a100-80gb, l4, rtx4090) and predict its kernels' times; nothing runs")
    which.add_argument("--target-config", metavar="FILE[:N]", help="the same for a GpuTargetConfigProto text file")


def predicted_kernels(cfg, target: gpu.Target, mode: str, top: int = TOP) -> dict:
    """The step compiled for `target` and its predicted kernel table (jaxlm.training.compiled.prediction)."""
    compiled, seconds, options = gpu.compile_step(cfg, target, mode)
    row = gpu.describe(compiled, target, cfg=cfg, mode=mode)
    if top > TOP:
        row.update(gpu.prediction(hlo.parse_module(compiled.as_text()), cfg, target, mode, top))
    c = cfg.compute
    return {"mode": mode, "batch": cfg.data.batch_size, "context": cfg.model.context_length, "dtype": c.dtype,
            "attention": c.attention, "remat": c.remat, "model": dataclasses.asdict(cfg.model),
            "compile_s": seconds, "compiler_options": options, "total_bytes": row["total_bytes"],
            "label": row["predicted_label"], **{k: row[k] for k in ("predicted_step_ms", "predicted_tokens_per_s",
                                                                     "predicted_mfu", "predicted_peak")},
            "groups": row["predicted_groups"], "phases": row["predicted_phases"],
            "components": row["predicted_components"], "ops": row["predicted_ops"], "top": row["predicted_top"],
            "notes": row["predicted_notes"]}


def _si(x: float) -> str:
    return f"{x / 1e12:.2f} T" if x >= 1e12 else f"{x / 1e9:.2f} G" if x >= 1e9 else f"{x / 1e6:.2f} M"


def format_kernels(r: dict) -> str:
    mfu = f", MFU {100 * r['predicted_mfu']:.0f}% of the {r['predicted_peak']} dense peak" if r["predicted_mfu"] else ""
    lines = [r["label"], f"step: {r['mode']}, batch {r['batch']}, context {r['context']}, {r['dtype']}, attention "
             f"{r['attention']}, remat {r['remat']}: {r['predicted_step_ms']:.3f} ms, "
             f"{r['predicted_tokens_per_s']:,.0f} tokens/s{mfu}; compiled memory {r['total_bytes'] / 2**30:.2f} GiB "
             f"per GPU (compiled in {r['compile_s']:.0f} s)", "",
             f"  {'kernel group':24s} {'ms':>9s} {'share':>6s} {'FLOPs':>9s} {'bytes':>9s} {'launches':>8s}  bound"]
    lines += [f"  {g['group']:24s} {g['predicted_ms']:9.3f} {100 * g['share']:5.1f}% {_si(g['flops']):>9s} "
              f"{_si(g['bytes']):>9s} {g['launches']:8d}  {g['bound'] or '-'}" for g in r["groups"]]
    for title, key in (("by pass", "phases"), ("by part of the model", "components")):
        lines += ["", f"  {title}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in r[key].items())]
    lines += ["", f"  slowest {len(r['ops'])} ops (an op's kernels summed over the layers and launches):",
              f"  {'ms':>9s} {'share':>6s}  {'model part':26s} {'pass':9s} {'x':>4s}  jax op / source"]
    lines += [f"  {o['predicted_ms']:9.3f} {100 * o['share']:5.1f}%  {o['component'][:26]:26s} {o['phase']:9s} "
              f"{o['launches']:4d}  {o['op'][-60:]}  {o['source']}" for o in r["ops"]]
    lines += ["", f"  slowest {len(r['top'])} kernels (ms per step = per launch x launches):",
              f"  {'ms':>9s} {'share':>6s}  {'group':22s} {'bound':7s} {'x':>4s}  kernel / jax op / source"]
    lines += [f"  {k['predicted_ms']:9.3f} {100 * k['share']:5.1f}%  {k['group']:22s} {k['bound']:7s} "
              f"{k['count']:4d}  {k['kernel']} ({k['kind'][:28]}) {k['op'][-60:]}  {k['source']}" for k in r["top"]]
    lines += [f"  note: {n}" for n in r["notes"]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """`ops --target`: compile, predict, print (and --json)."""
    t = gpu.parse_target(args.target, args.target_config)
    gpu.require_compiler()
    cli.check_option(args.framework == "jax", "--framework", args.framework, "--target compiles JAX steps only")
    cli.check_option(args.mode in ("train_step", "forward"), "--mode", args.mode,
                     "with --target: train_step or forward (the eval step training runs)")
    for flag in ("--batch", "--top", "--context"):
        value = getattr(args, flag[2:])
        cli.check_option(value is None or value >= 1, flag, value, "must be >= 1")
    cfg = gpu.with_shape(cli.load_config_from_args(args), args.batch, args.context)
    if t.device is None:
        raise UsageError(f"{t.flag}: {t.description} has no achieved rates in jaxlm.analysis.devices, so its "
                             "kernels cannot be priced; name a GPU of the table (--target)")
    r = {"target": t.name, "gpus": t.count, **predicted_kernels(cfg, t, args.mode, max(TOP, args.top))}
    print(format_kernels(r))
    if args.json:
        print(f"wrote {write_json(args.json, r)}")
    return 0
