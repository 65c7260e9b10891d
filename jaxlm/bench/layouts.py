"""`python -m jaxlm.bench parallel`: the real train step on a mesh, compiled apart, measured per device.

Each row is one mesh layout (the config's ``parallel.*``, or each `--layout`) of the
train step `jaxlm.training.loop.build` jits: compile time, step time (unless --compile-only),
per-device memory read from the compiled SPMD program's memory_analysis (arguments =
this device's shard of the train state plus its batch rows; temporaries; outputs
aliased to the donated state), the per-device parameter + optimizer bytes from the
state's shardings, and the collectives in the compiled HLO (static count and result
bytes of all-reduce, all-gather, reduce-scatter, collective-permute, all-to-all; an
op inside a loop body, e.g. the scanned layers, counts once), and for pipelines the
GPipe bubble fraction, analytic ((P - 1) / (M + P - 1)) and, when the step runs, measured: the
step time lost against the same devices without a pipeline, 1 - t(data x P) / t(pipeline P).
Without a pipeline a device runs its batch rows through all L layers, which is the same work as
M ticks of L/P layers on B/M rows, so the difference is the M + P - 1 - M idle ticks (on
simulated CPU devices, which share the host's cores, the ticks where a stage has no
micro-batch yet still compute on zeros, so the bubble shows as that wasted work).

    python -m jaxlm.bench parallel --devices 8 --preset large --context 256 --batch 8 --compile-only \\
        --layout data=8 fsdp=8 tensor=4,data=2

--devices N simulates N CPU devices (XLA's host platform device count); it must come
before anything initialises JAX, which this command does only after parsing.
"""

from __future__ import annotations

import argparse
import os
import time

from jaxlm import cli
from jaxlm.analysis.memory import compiled_memory
from jaxlm.bench.timing import time_calls
from jaxlm.core.config import MESH_AXES, load_config
from jaxlm.core.errors import UsageError
from jaxlm.core.files import write_json
from jaxlm.predict.program import collectives


def parse_layout(text: str) -> dict[str, int]:
    """"tensor=4,data=2" -> {"tensor": 4, "data": 2} (the other axes: 1)."""
    sizes = {k: 1 for k in MESH_AXES}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in MESH_AXES or not value.lstrip("-").isdigit():
            raise UsageError(f"--layout {text!r}: expected AXIS=N[,AXIS=N...] with AXIS in {', '.join(MESH_AXES)}")
        sizes[key] = int(value)
    return sizes


def state_bytes_per_device(abstract_state) -> int:
    """Bytes of the largest per-device shard set of the train state (parameters + optimizer + the rest)."""
    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree.leaves(abstract_state):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += int(np.prod(shape)) * leaf.dtype.itemsize
    return total


def measure(cfg, context: int, steps: int, compile_only: bool) -> dict:
    """One row: compile, memory and collectives of cfg's train step on its mesh; step time unless compile_only."""
    import jax
    import numpy as np

    from jaxlm.core import sharding
    from jaxlm.nn.pipeline import bubble_fraction
    from jaxlm.training.loop import build

    mesh = sharding.make_mesh(cfg=cfg.parallel)
    sharding.check_layout(cfg, mesh)
    b = build(cfg, mesh)
    B, T = cfg.data.batch_size, context
    x = jax.ShapeDtypeStruct((B, T), np.int32, sharding=sharding.batch_sharding(mesh))
    t0 = time.perf_counter()
    compiled = b.step_fn.lower(b.abstract, x, x).compile()
    row = {"layout": ",".join(f"{k}={v}" for k, v in mesh.shape.items() if v > 1) or "1 device",
           "scan_layers": cfg.compute.scan_layers, "compile_s": time.perf_counter() - t0,
           "state_mb_per_device": state_bytes_per_device(b.abstract) / 2**20}
    m = compiled_memory(compiled)
    if m is not None:
        row.update(argument_mb=m.argument / 2**20, temp_mb=m.temp / 2**20, output_mb=m.output / 2**20,
                   alias_mb=m.alias / 2**20)
    row["collectives"] = collectives(compiled.as_text())
    if mesh.shape["pipeline"] > 1:
        row.update(bubble=bubble_fraction(mesh.shape["pipeline"], cfg.parallel.microbatches),
                   microbatches=cfg.parallel.microbatches)
    if not compile_only:
        state = jax.jit(b.make_state, out_shardings=b.shardings)()
        tok = np.random.default_rng(0).integers(0, cfg.model.vocab_size, (B, T + 1)).astype(np.int32)
        xs, ys = sharding.global_batch(tok[:, :-1], mesh), sharding.global_batch(tok[:, 1:], mesh)
        held = [state]

        def call():
            held[0], metrics = b.step_fn(held[0], xs, ys)
            return metrics

        times = time_calls(call, steps, warmup=1, wait=jax.block_until_ready).seconds
        row.update(step_ms=1e3 * float(np.median(times)), tokens_per_s=B * T / float(np.median(times)))
    return row


def add_args(p: argparse.ArgumentParser) -> None:
    cli.add_config_args(p)
    p.add_argument("--devices", metavar="N", type=int, help="simulate N CPU devices (default: the real ones)")
    p.add_argument("--layout", metavar="AXES", nargs="+",
                   help="mesh layouts such as data=8 fsdp=8 tensor=4,data=2 (default: the config's parallel.*)")
    p.add_argument("--context", metavar="T", type=int, help="sequence length (default: model.context_length)")
    p.add_argument("--batch", metavar="B", type=int, help="global batch (default: data.batch_size)")
    p.add_argument("--steps", metavar="N", type=int, default=3, help="timed steps per row, after one warm-up")
    p.add_argument("--microbatches", metavar="M", type=int, nargs="+",
                   help="pipeline layouts: one row per number of micro-batches (default: parallel.microbatches)")
    p.add_argument("--compile-only", action="store_true", help="compile and read memory; run nothing")
    p.add_argument("--json", metavar="PATH", help="also write the rows here")


def _row_line(r: dict) -> str:
    coll = " ".join(f"{op}={c['count']}/{c['bytes'] / 2**20:.1f}MiB"
                    for op, c in r["collectives"].items() if c["count"])
    step = f"{r['step_ms']:9.1f} ms/step" if "step_ms" in r else "    (compile only)"
    return (f"{r['layout']:<22} scan={str(r['scan_layers']):<5} compile {r['compile_s']:6.1f} s {step}  state/device "
            f"{r['state_mb_per_device']:9.1f} MiB  args {r.get('argument_mb', float('nan')):9.1f} MiB  temp "
            f"{r.get('temp_mb', float('nan')):9.1f} MiB  {coll or 'no collectives'}"
            + (f"  M={r['microbatches']} bubble {r['bubble']:.2f} (analytic)" if "bubble" in r else "")
            + (f" {r['bubble_measured']:.2f} (measured against {r['reference_layout']})"
               if "bubble_measured" in r else ""))


def _unpipelined(args: argparse.Namespace, over: list[str], cfg) -> dict:
    """The bubble's reference row: the same devices and batch with the pipeline axis folded into data."""
    p = cfg.parallel
    data = p.data * p.pipeline if p.data > 0 else -1  # -1: the rest of the devices, now including the stages'
    ref = load_config(args.config, [*over, "parallel.pipeline=1", f"parallel.data={data}", "parallel.microbatches=1"],
                      preset=args.preset)
    return measure(ref, ref.model.context_length, args.steps, compile_only=False)


def main(args: argparse.Namespace) -> int:
    if args.devices is not None:
        cli.check_option(args.devices >= 1, "--devices", args.devices, "must be >= 1")
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}"
    cli.check_option(args.steps >= 1, "--steps", args.steps, "must be >= 1")
    extra = [f"data.batch_size={args.batch}"] if args.batch else []
    if args.context:
        extra.append(f"model.context_length={args.context}")
    layouts = [parse_layout(t) for t in args.layout] if args.layout else [{}]
    rows, refs = [], {}
    for sizes in layouts:  # a layout wins over --set parallel.*
        over = [*extra, *args.overrides, *(f"parallel.{k}={v}" for k, v in sizes.items())]
        cfg = load_config(args.config, over, preset=args.preset)
        micro = args.microbatches if args.microbatches and cfg.parallel.pipeline > 1 else [cfg.parallel.microbatches]
        for m in micro:
            cfg = load_config(args.config, [*over, f"parallel.microbatches={m}"], preset=args.preset)
            row = measure(cfg, cfg.model.context_length, args.steps, args.compile_only)
            if "bubble" in row and "step_ms" in row:
                if row["layout"] not in refs:  # one reference per layout, shared by its micro-batch counts
                    refs[row["layout"]] = _unpipelined(args, over, cfg)
                ref = refs[row["layout"]]
                row.update(bubble_measured=1 - ref["step_ms"] / row["step_ms"], reference_layout=ref["layout"],
                           reference_step_ms=ref["step_ms"])
            print(_row_line(row), flush=True)
            rows.append(row)
    if args.json:
        print(f"wrote {write_json(args.json, {'rows': rows})}")
    return 0
