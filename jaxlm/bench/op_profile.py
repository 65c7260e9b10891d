"""`python -m jaxlm.bench ops`: where a step's time goes, op by op, from a profile of the compiled step.

The JAX side traces the benchmark's own step (`jaxlm.bench.steps.build_step`: for `train_step`, training's
own step) with `jax.profiler` while XLA:CPU records every executed thunk
(`--xla_cpu_enable_xprof_traceme`, set here before JAX starts), then reads each thunk's time from
the trace and what it computes from the compiled HLO (its op and the `op_name` JAX wrote: the einsum,
`jvp(...)` for the forward pass, `transpose(jvp(...))` for the backward pass). `--framework` with a
plugged-in side profiles that side's step with its own profiler (parity's: the PyTorch reference's compiled
step). Needs the core install; a plugged-in side, the extra its `--framework` help names.

Categories, the same on both sides: projection matmuls (every `x @ W.T`, the output head included)
forward / backward, attention matmuls (QK^T, PV), the loss (ops on (tokens, vocab) arrays that are not
matmuls), the optimizer (clipping, AdamW, metrics: everything outside the forward and backward passes),
copies and transposes, and the remaining element-wise work and reductions (norms, RoPE, activations,
softmax). Times are the ops' own (exclusive) times per step, so on a quiet machine they sum to about
the step time; the wall time per profiled step is reported beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile
from collections import Counter

from jaxlm import cli
from jaxlm.analysis.flops import MODES
from jaxlm.bench import sides
from jaxlm.bench.output import check_output
from jaxlm.bench.timing import time_calls
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.files import write_json

CATEGORIES = (
    "projection matmuls, forward", "projection matmuls, backward", "attention matmuls, forward",
    "attention matmuls, backward", "loss (logits to cross-entropy)", "element-wise and reductions, forward",
    "element-wise and reductions, backward", "copies and transposes", "optimizer, clipping, metrics",
    "dispatch and bookkeeping",  # another side's own: the Python and autograd time of its wrappers
)
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%(\S+) = (\S+) (\S+?)\((.*)")
_NO_THUNK = {"bitcast", "parameter", "constant", "get-tuple-element", "tuple"}  # no work at run time


@dataclasses.dataclass(frozen=True)
class HloOp:
    """One instruction of the compiled module: what `category` needs to place it."""

    shape: str  # e.g. "f32[768,384]{1,0}"
    opcode: str  # dot, fusion, copy, ...
    op_name: str  # JAX's name stack, e.g. "jit(train_step)/transpose(jvp(ki,oi->ko))/dot_general"
    operand_shapes: tuple[str, ...]


def parse_hlo(text: str) -> dict[str, HloOp]:
    """Instruction name -> HloOp for the instructions XLA:CPU runs as thunks: every computation's but
    the fusion bodies' (whose instructions run inside their fusion's thunk), less those that do no work."""
    computations: dict[str, list[re.Match]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"(?:ENTRY )?%(\S+) .*\{$", line)
        if head and not line.startswith(" "):
            current = computations.setdefault(head.group(1), [])
        elif current is not None and (m := _INSTRUCTION.match(line)):
            current.append(m)
    fused = {c for ms in computations.values() for m in ms if m.group(3) == "fusion"
             for c in re.findall(r"calls=%([\w.\-]+)", m.group(4))}
    lines = [m for c, ms in computations.items() for m in ms]
    shapes = {m.group(1): m.group(2) for m in lines}
    ops = {}
    for m in (m for c, ms in computations.items() if c not in fused for m in ms if m.group(3) not in _NO_THUNK):
        name_stack = re.search(r'op_name="([^"]*)"', m.group(4))
        operands = re.findall(r"%([\w.\-]+)", m.group(4).split("), ")[0])
        ops[m.group(1)] = HloOp(m.group(2), m.group(3), name_stack.group(1) if name_stack else "",
                                tuple(shapes.get(o, "") for o in operands))
    return ops


def category(op: HloOp, vocab_size: int) -> str:
    """Which of CATEGORIES a compiled instruction belongs to (see the module docstring)."""
    backward = "transpose(jvp(" in op.op_name
    last = op.op_name.rsplit("/", 1)[-1]
    if last == "dot_general" or op.opcode == "dot":
        kind = "attention" if re.search(r"\(B\w*,B\w*->", op.op_name) else "projection"
        return f"{kind} matmuls, {'backward' if backward else 'forward'}"
    if any(re.search(rf"[\[,]{vocab_size}\]", s) for s in (op.shape, *op.operand_shapes)):
        return "loss (logits to cross-entropy)"
    if op.opcode in ("copy", "transpose") or last == "transpose" or "copy" in op.opcode:
        return "copies and transposes"
    if op.op_name and "jvp(" not in op.op_name:
        return "optimizer, clipping, metrics"
    return f"element-wise and reductions, {'backward' if backward else 'forward'}"


def per_step(durations: list[float], steps: int, statistic: str) -> float:
    """Seconds per step of one op from its durations in time order (k per step when it runs k times a step):
    the mean, or with "min" the sum over its k runs of the fastest of each across the steps, which on a
    shared machine estimates the op's time without the stalls other processes cause."""
    if statistic == "min" and durations and len(durations) % steps == 0:
        k = len(durations) // steps
        return sum(min(durations[i::k]) for i in range(k))
    return sum(durations) / steps


def summarize(times: dict[str, list[float]], place, describe, steps: int, wall_s: float, top: int,
              statistic: str) -> dict:
    """{step_ms, ops_ms, categories: {name: ms per step}, top: [[op, category, ms per step], ...]}."""
    ms = {name: 1e3 * per_step(d, steps, statistic) for name, d in times.items()}
    cats = Counter()
    for name, value in ms.items():
        cats[place(name)] += value
    slowest = sorted(ms, key=ms.get, reverse=True)[:top]
    return {"step_ms": 1e3 * wall_s / steps, "ops_ms": sum(ms.values()), "statistic": statistic,
            "categories": {c: cats[c] for c in CATEGORIES if c in cats},
            "top": [[describe(name), place(name), ms[name]] for name in slowest]}


def thunk_seconds(trace_dir: str, names) -> dict[str, list[float]]:
    """Each named thunk's durations (seconds, in time order), from the Perfetto trace `jax.profiler.trace` wrote.

    XLA:CPU runs some thunks (its Eigen dots) asynchronously: their event covers the launch only, and an
    instant "end: NAME" marks completion, so such a thunk is timed from its start to its end event (time
    that other thunks may share)."""
    path = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)[0]
    with gzip.open(path) as fh:
        events = json.load(fh)
    events = sorted((e for e in (events["traceEvents"] if isinstance(events, dict) else events) if "ts" in e),
                    key=lambda e: e["ts"])
    starts: dict[str, list[tuple[float, float]]] = {}
    ends: dict[str, list[float]] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name in names:
            starts.setdefault(name, []).append((e["ts"], e["dur"]))
        elif name.startswith("end: ") and name[5:] in names:
            ends.setdefault(name[5:], []).append(e["ts"])
    times = {}
    for name, runs in starts.items():
        done = ends.get(name, [])
        times[name] = [max(dur, done[i] - ts if i < len(done) else 0.0) / 1e6 for i, (ts, dur) in enumerate(runs)]
    return times


def op_profile(mode: str, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, *, steps: int,
               warmup: int, top: int, statistic: str) -> dict:
    """Profile `steps` calls of the JAX step (after `warmup`): the per-category and top op times per step."""
    import jax

    from jaxlm.bench import steps as jax_steps

    step = jax_steps.build_step(mode, cfg, compute, batch, context)
    compiled = jax_steps.compile_step(step)
    hlo = parse_hlo(compiled.as_text())
    args = [step.args]

    def call():
        out = compiled(*args[0])
        args[0] = step.advance(args[0], out)
        return out

    time_calls(call, 0, warmup=warmup, wait=jax.block_until_ready)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            wall = sum(time_calls(call, steps, wait=jax.block_until_ready).seconds)
        times = thunk_seconds(trace_dir, hlo)
    if not times:
        raise RuntimeError("the trace holds no XLA:CPU op events: the backend started before "
                           "--xla_cpu_enable_xprof_traceme was set (run the command in a fresh process)")
    describe = lambda name: f"{name} {hlo[name].shape.split('{')[0]} {hlo[name].op_name.rsplit(')/', 1)[-1][-40:]}"  # noqa: E731
    return summarize(times, lambda name: category(hlo[name], cfg.vocab_size), describe, steps, wall, top, statistic)


def add_args(p: argparse.ArgumentParser) -> None:
    from jaxlm.predict.target import add_target_args

    p.description = __doc__
    cli.add_config_args(p)
    add_target_args(p, "predict its kernels' times")  # the GPU's kernels, predicted (jaxlm.bench.kernels)
    p.add_argument("--context", metavar="T", type=int, help="sequence length (default: model.context_length)")
    p.add_argument("--batch", metavar="B", type=int, default=4, help="batch size")
    p.add_argument("--mode", choices=MODES, default="train_step", help="which step to profile")
    sides.add_framework_arg(p, "profile")
    p.add_argument("--warmup", metavar="N", type=int, default=3, help="steps run before the profiled ones")
    p.add_argument("--steps", metavar="N", type=int, default=10, help="profiled steps")
    p.add_argument("--top", metavar="N", type=int, help="slowest single ops listed per side (default: 12; with "
                   "--target the slowest 15 ops and kernels)")
    p.add_argument("--statistic", choices=("mean", "min"), default="mean",
                   help="per op: the mean over the profiled steps, or the fastest (an estimate of the quiet-machine "
                   "time)")
    p.add_argument("--threads", metavar="N", type=int, help="CPU threads for both frameworks (default: each one's own)")
    p.add_argument("--json", metavar="PATH", help="also write the results here")


def format_side(name: str, res: dict) -> str:
    lines = [f"{name}: {res['step_ms']:.2f} ms per profiled step (wall), ops {res['ops_ms']:.2f} ms "
             f"({res['statistic']} per op)"]
    for cat, ms in sorted(res["categories"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {ms:9.3f} ms  {100 * ms / res['ops_ms']:5.1f} %  {cat}")
    lines.append(f"  slowest {len(res['top'])} ops:")
    lines += [f"  {ms:9.3f} ms  {op[:70]:70s}  {cat}" for op, cat, ms in res["top"]]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    for flag in ("--batch", "--steps", "--top", "--threads", "--context"):
        value = getattr(args, flag[2:])
        cli.check_option(value is None or value >= 1, flag, value, "must be >= 1")
    check_output("--json", args.json)
    if args.target or args.target_config:
        from jaxlm.bench import kernels

        return kernels.main(args)
    cli.check_option(not args.calibration, "--calibration", args.calibration,
                     "calibrates predicted times: give --target or --target-config")
    cli.check_option(args.warmup >= 0, "--warmup", args.warmup, "must be >= 0")
    full = cli.load_config_from_args(args)
    context = args.context or full.model.context_length
    cfg = dataclasses.replace(full.model, context_length=max(context, full.model.context_length))
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_enable_xprof_traceme=true".strip()
    from jaxlm.core.host import limit_cpu_threads, tune_for_cpu_backend

    if args.threads:
        limit_cpu_threads(args.threads)
    chosen = sides.load_chosen(args.framework)  # after --threads; a missing extra stops here
    tune_for_cpu_backend()
    kw = dict(steps=args.steps, warmup=args.warmup, top=args.top or 12, statistic=args.statistic)
    res = {"mode": args.mode, "batch": args.batch, "context": context, "model": dataclasses.asdict(cfg),
           "threads": args.threads}
    for fw, side in chosen.items():
        profile = op_profile if fw == sides.OWN else side.op_profile
        res[fw] = profile(args.mode, cfg, full.compute, args.batch, context, **kw)
        print(format_side(fw, res[fw]))
    if args.json:
        print(f"wrote {write_json(args.json, res)}")
    return 0
