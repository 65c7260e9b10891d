"""`python -m jaxlm.bench ops --target GPU`: where a GPU step's time would go, kernel by kernel, predicted from
the program XLA's GPU compiler builds for that GPU on any machine (no GPU needed).

    python -m jaxlm.bench ops --target h100-80gb --preset small --context 1024 --batch 8 \\
        --set compute.dtype=bfloat16 --json kernels.json

The Nsight-style summary of jaxlm.predict.roofline over the compiled step (training's own, as
`python -m jaxlm.memory --target` compiles it): the kernels grouped (matmul, attention,
softmax/normalisation, loss, other elementwise, optimizer update, collectives, copies), each group's predicted
time, share, FLOPs, bytes and what bounds it (compute, memory, launch, link, host), the step by pass and by
part of the model, the slowest ops (one op's kernels summed over the layers, as Nsight's kernel summary sums one
kernel's launches) and the slowest kernels, with the jax op and source line they come from (a cuDNN call by its
name). Predicted from the compiled program, not measured: docs/benchmarks.md ("Predicted GPU time") says what
the model leaves out. A step that does not fit the GPU is said to, with no time.
"""

from __future__ import annotations

import argparse

from jaxlm import cli
from jaxlm.core.errors import UsageError
from jaxlm.core.files import write_json
from jaxlm.core.stop import Interrupted, StopFlag
from jaxlm.core.units import si
from jaxlm.predict import calibration, target
from jaxlm.predict.compile import with_shape
from jaxlm.predict.rows import kernel_table

TOP = 15  # ops and kernels listed without --top


def format_kernels(r: dict) -> str:
    head = (f"step: {r['mode']}, batch {r['batch']}, context {r['context']}, {r['dtype_label']}, attention "
            f"{r['attention']}, remat {r['remat']}")
    memory = f"compiled memory {r['total_bytes'] / 2**30:.2f} GiB per GPU (compiled in {r['compile_s']:.0f} s)"
    if r["predicted_step_ms"] is None:
        return "\n".join([r["label"], f"{head}: no predicted time; {memory}"])
    mfu = f", MFU {100 * r['predicted_mfu']:.0f}% of the {r['predicted_peak']} dense peak" if r["predicted_mfu"] else ""
    lines = [r["label"], f"{head}: {r['predicted_step_ms']:.3f} ms, {r['predicted_tokens_per_s']:,.0f} tokens/s{mfu}; "
             f"{memory}", "",
             f"  {'kernel group':24s} {'ms':>9s} {'share':>6s} {'FLOPs':>9s} {'bytes':>9s} {'launches':>8s}  bound"]
    lines += [f"  {g['group']:24s} {g['predicted_ms']:9.3f} {100 * g['share']:5.1f}% {si(g['flops']):>9s} "
              f"{si(g['bytes']):>9s} {g['launches']:8d}  {g['bound'] or '-'}" for g in r["groups"]]
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
    """`ops --target`: compile, predict, print (and --json). A signal during the compile (which cannot be
    interrupted) stops after it, in one line, with nothing written."""
    t = target.parse_target(args.target, args.target_config)
    target.require_compiler()
    cli.check_option(args.framework == "jax", "--framework", args.framework, "--target compiles JAX steps only")
    cli.check_option(args.mode in ("train_step", "forward"), "--mode", args.mode,
                     "with --target: train_step or forward (the eval step training runs)")
    cfg = with_shape(cli.load_config_from_args(args), args.batch, args.context)
    if t.device is None:
        raise UsageError(f"{t.flag}: {t.description} has no rates in jaxlm.analysis.devices, so its kernels cannot "
                         "be priced; name a GPU of the table (--target) or give a .toml --target-config with rates")
    cal = calibration.resolve(args.calibration, t.name, log=print)
    with StopFlag() as flag:
        print(f"[compiling] {args.mode} for {t.description}" + (f" x{t.count}" if t.count > 1 else "") + " (XLA's "
              "GPU compiler: seconds for a small model, minutes for a large one)", flush=True)
        r = {"target": t.name, "gpus": t.count, **kernel_table(cfg, t, args.mode, args.top or TOP, cal)}
        if flag.signal:
            raise Interrupted(f"{flag.signal} during the compile for {t.name}: stopped; nothing written")
    print(format_kernels(r))
    if args.json:
        print(f"wrote {write_json(args.json, r)}")
    return 0
