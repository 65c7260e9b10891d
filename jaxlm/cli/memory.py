"""`python -m jaxlm.memory`: one step's memory per device and the largest batch that fits (jaxlm.analysis.memory),
or, with --target, the GPU compiler's own plan for the step and its predicted time (jaxlm.predict).

    python -m jaxlm.memory --preset large --context 1024 --batch 4 --dtype bfloat16 --device h100-80gb
    python -m jaxlm.memory --target h100-80gb --preset small --context 1024 --batch 8 --dtype bfloat16 --json

How far the estimate is from the compilers' plans: docs/results/compiled/h100-80gb-validation.md
(`python -m deliverables.memory_validation`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys

from jaxlm import cli
from jaxlm.analysis.devices import DEVICES
from jaxlm.analysis.flops import MODES, param_counts
from jaxlm.analysis.memory import (
    BACKENDS,
    DEFAULT_USABLE,
    ComputeConfig,
    Mesh,
    ModelConfig,
    estimate,
    largest_batch,
    usable_share,
)
from jaxlm.core.errors import UsageError
from jaxlm.core.units import si
from jaxlm.predict import calibration, target
from jaxlm.predict import compile as gpu

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_size(text: str) -> float:
    """'24GiB', '80GB', '512 MiB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 24GiB or 80GB, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def add_args(parser: argparse.ArgumentParser) -> None:
    cli.add_config_args(parser)
    s = parser.add_argument_group("the step")
    s.add_argument("--context", type=cli.bounded(int, 1), help="sequence length (default: model.context_length)")
    s.add_argument("--batch", type=cli.bounded(int, 1), help="global batch in sequences (default: data.batch_size)")
    s.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype (default: compute.dtype)")
    s.add_argument("--remat", choices=("none", "full", "dots_saveable", "offload"), help="default: compute.remat")
    s.add_argument("--attention", choices=("xla", "cudnn"), help="default: compute.attention")
    s.add_argument("--mode", choices=MODES, default="train_step", help="which step")
    s.add_argument("--estimator", choices=BACKENDS, default="gpu", help="whose compiler the estimate follows: XLA's "
                   "GPU compiler's plan (H100) or XLA:CPU's (float32 without remat only)")
    s.add_argument("--devices", type=cli.bounded(int, 1), default=1,
                   help="devices the batch is split over (parallel.fsdp other than 1 also shards the state)")
    d = parser.add_argument_group("the device (for the largest batch)")
    where = d.add_mutually_exclusive_group()
    where.add_argument("--device", choices=sorted(DEVICES), help="a known device's memory (jaxlm.analysis.devices)")
    where.add_argument("--memory", type=parse_size, metavar="SIZE", help="memory per device, e.g. 24GiB or 80GB")
    d.add_argument("--usable", type=cli.bounded(float, 0, 1, open_low=True),
                   help=f"share of the device's memory a step may plan for (default: JAX's GPU allocator share, "
                        f"XLA_PYTHON_CLIENT_MEM_FRACTION or {DEFAULT_USABLE})")
    g = target.add_target_args(parser, "report the compiler's plan and the predicted step time; the memory is the "
                               "GPU's (not --device / --memory)")
    g.add_argument("--find-max-batch", action="store_true", help="with --target: the largest batch that fits, "
                   "by compiling (a few compiles)")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON instead of a table")


def _configs(args) -> tuple[ModelConfig, ComputeConfig, int, int, Mesh, int]:
    """The model, compute, context, global batch, mesh and gradient-accumulation count the flags describe."""
    cfg = cli.load_config_from_args(args)
    context = args.context or cfg.model.context_length
    model = dataclasses.replace(cfg.model, context_length=max(context, cfg.model.context_length))
    chosen = {k: getattr(args, k) for k in ("dtype", "remat", "attention") if getattr(args, k)}
    try:
        compute = dataclasses.replace(cfg.compute, **chosen)
    except Exception as e:  # e.g. cudnn at float32: the config's one-line reason
        raise UsageError(str(e)) from None
    batch, accum = args.batch or cfg.data.batch_size, cfg.train.grad_accum
    cli.check_option(batch % accum == 0, "--batch", batch, f"must divide into train.grad_accum = {accum} micro-batches")
    return model, compute, context, batch, Mesh(args.devices, cfg.parallel.fsdp != 1), accum


def report(cfg: ModelConfig, compute: ComputeConfig, context: int, batch: int, mode: str, mesh: Mesh,
           capacity: float | None, usable: float | None, device: str | None, backend: str = "gpu") -> dict:
    est = estimate(cfg, batch, context, compute, mode, mesh, backend=backend)
    out = {"parameters": param_counts(cfg)["total"], "mode": mode, "estimator": backend, "context": context,
           "batch": batch,
           "batch_per_device": est.batch_per_device, "devices": mesh.devices, "fsdp": mesh.fsdp,
           "dtype": compute.dtype, "attention": compute.attention, "remat": compute.remat,
           "remat_applied": compute.remat_policy,
           "state_bytes": est.state, "activation_bytes": est.activations, "peak_bytes": est.total}
    if capacity is not None:
        usable = usable_share() if usable is None else usable
        out.update(device=device, capacity_bytes=capacity, usable=usable, fits=est.total <= capacity * usable,
                   largest_batch=largest_batch(cfg, context, capacity * usable, compute, mode, mesh, backend=backend))
    return out


def format_report(r: dict, cfg: ModelConfig) -> str:
    lines = [f"model: {cfg.num_layers} layers, d_model {cfg.d_model}, {cfg.num_heads} heads, d_ff {cfg.d_ff}, "
             f"vocab {cfg.vocab_size}: {r['parameters'] / 1e6:.1f}M parameters",
             f"step: {r['mode']}, batch {r['batch']}"
             + (f" in {r['grad_accum']} micro-batches of {r['micro_batch']}" if "grad_accum" in r else "")
             + f" ({r['batch_per_device']} per device on {r['devices']} "
             f"device{'s' if r['devices'] > 1 else ''}{', FSDP' if r['fsdp'] else ''}), context {r['context']}, "
             f"{r['dtype']}, attention {r['attention']}, remat {r['remat']}"
             + (f" (applied as {r['remat_applied']}: scanned layers)" if r["remat_applied"] != r["remat"] else ""), "",
             f"{'estimated bytes per device':40s} {'':>10s}"]
    lines += [f"  {k:38s} {si(v, 'B'):>10s}" for k, v in r["state_bytes"].items()]
    acts = r["activation_bytes"]
    lines.append(f"  {'activations':38s} {si(sum(acts.values()), 'B'):>10s}")
    lines += [f"    {k:36s} {si(v, 'B'):>10s}" for k, v in acts.items() if v]
    lines += [f"  {'predicted peak':38s} {si(r['peak_bytes'], 'B'):>10s}"]
    if "capacity_bytes" in r:
        name = r["device"] or "the given memory"
        lines += ["", f"{name}: {si(r['capacity_bytes'], 'B')}, of which {100 * r['usable']:.0f}% usable "
                      f"({si(r['capacity_bytes'] * r['usable'], 'B')}): batch {r['batch']} "
                      f"{'fits' if r['fits'] else 'does NOT fit'}",
                  f"largest batch that fits: {r['largest_batch']} (global, at context {r['context']}"
                  + (f", in {r['grad_accum']} micro-batches" if "grad_accum" in r else "") + ")"]
    return "\n".join(lines)


DESCRIPTION = """Estimate the memory of one train step per device (parameters, gradients, AdamW moments,
activations by component) and the largest batch that fits a device (docs/memory.md); with --target, compile
the step for a GPU and report the compiler's own plan."""


def target_report(args) -> dict:
    """The compiled plan of the step the flags describe, for --target / --target-config, beside the estimate."""
    t = target.parse_target(args.target, args.target_config)
    if args.device or args.memory:
        given = f"--device {args.device}" if args.device else f"--memory {si(args.memory, 'B')}"
        raise UsageError(f"{given}: with {t.flag} the memory is the target's ({si(t.memory_bytes, 'B')}); give one or "
                         "the other (another memory size: --target-config FILE with its device_memory_size)")
    target.require_compiler()
    cal = calibration.resolve(args.calibration, t.name, log=lambda m: print(m, file=sys.stderr))
    cli.check_option(args.devices in (1, t.count), "--devices", args.devices,
                     f"with a target the GPU count comes from it ({t.name}:{t.count})")
    model, compute, context, batch, _, accum = _configs(args)
    cfg = gpu.with_shape(cli.load_config_from_args(args), batch, context, dtype=compute.dtype,
                         remat=compute.remat, attention=compute.attention)
    r = {"parameters": param_counts(model)["total"], "mode": args.mode, "context": context, "batch": batch,
         "dtype": compute.dtype, "attention": compute.attention, "remat": compute.remat,
         **gpu.compiled_row(cfg, t, args.mode, args.usable, calibration=cal)}
    est = estimate(model, batch // accum, context, compute, args.mode, Mesh(t.count, cfg.parallel.fsdp != 1),
                   backend=args.estimator)
    r["estimate_bytes"] = est.total
    if args.find_max_batch:
        r["largest_batch"] = gpu.largest_batch(cfg, t, args.mode, fraction=args.usable)
    return r


def format_target_report(r: dict) -> str:
    gib = lambda x: f"{x / 2**30:.2f} GiB" if x >= 2**30 else f"{x / 2**20:.1f} MiB"  # noqa: E731
    dtypes = ", ".join(f"{k} {v}" for k, v in r["matmul_dtypes"].items())
    lines = [r["label"], f"step: {r['mode']}, batch {r['batch']}, context {r['context']}, {r['dtype_label']}, "
             f"attention {r['attention']}, remat {r['remat']}; {r['parameters'] / 1e6:.1f}M parameters; compiled in "
             f"{r['compile_s']:.1f} s", "", "bytes per GPU"]
    lines += [f"  {k:10s} {gib(r[k + '_bytes']):>12s}" for k in ("argument", "output", "alias", "temp")]
    lines += [f"  {'total':10s} {gib(r['total_bytes']):>12s}   (argument + output + temp - alias)",
              f"  {'estimate':10s} {gib(r['estimate_bytes']):>12s}   (python -m jaxlm.memory without --target)", "",
              f"matmuls {r['matmuls']} ({dtypes}); cuDNN attention calls {r['cudnn_attention_calls']}"]
    if "collectives" in r:
        lines.append("collectives (static count): "
                     + ", ".join(f"{op} {c['count']}" for op, c in r["collectives"].items()))
    if "compiler_options" in r:
        lines.append(f"compiled with {r['compiler_options']}: XLA's Triton GEMM tiler, untuned without a GPU, found "
                     "no tile sizes for a matmul of this shape; its matmuls are cuBLAS calls")
    lines.append(f"fits: {'yes' if r['fits'] else 'NO'} ({gib(r['total_bytes'])} of {gib(r['usable_bytes'])} usable: "
                 f"{r['usable_fraction']:.2f} of {gib(r['capacity_bytes'])}, JAX's allocator share)")
    if "largest_batch" in r:
        lines.append(f"largest batch that fits: {r['largest_batch']} (by compiling)")
    if r.get("predicted_step_ms"):
        mfu = f", MFU {100 * r['predicted_mfu']:.0f}% of the {r['predicted_peak']} peak" if r["predicted_mfu"] else ""
        lines += ["", r["predicted_label"], f"  step {r['predicted_step_ms']:.2f} ms, "
                  f"{r['predicted_tokens_per_s']:,.0f} tokens/s{mfu} (kernel by kernel: python -m jaxlm.bench ops "
                  "--target ...)"]
    else:
        label = r["predicted_label"]
        lines += ["", label if label.startswith("no prediction") else f"no predicted time: {label}"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = cli.ArgumentParser(command="jaxlm.memory", description=DESCRIPTION,
                                formatter_class=cli.HelpFormatter)
    add_args(parser)
    args = parser.parse_args(argv)
    if args.target or args.target_config:
        r = target_report(args)
        print(json.dumps(r, indent=1) if args.json else format_target_report(r))
        return 0
    if args.find_max_batch or args.calibration:
        flag = "--find-max-batch: it compiles the step" if args.find_max_batch else "--calibration: it scales " \
            "predicted GPU times"
        raise UsageError(f"{flag}, so it needs --target or --target-config")
    cfg, compute, context, batch, mesh, accum = _configs(args)
    capacity = DEVICES[args.device].memory_bytes if args.device else args.memory
    r = report(cfg, compute, context, batch // accum, args.mode, mesh, capacity, args.usable, args.device,
               args.estimator)
    if accum > 1:  # the step holds one micro-batch at a time: its figures, the batch and largest batch as a whole
        r.update(grad_accum=accum, micro_batch=r["batch"], batch=batch)
        if "largest_batch" in r:
            r["largest_batch"] *= accum
    print(json.dumps(r, indent=1) if args.json else format_report(r, cfg))
    return 0
