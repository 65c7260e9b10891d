"""The GPU campaign's `profile` step: a profiler trace's top kernels (what the curriculum asks of Nsight Systems), and
per kernel group the roofline's prediction against the trace; the train step's calibration (CALIBRATION_FILE)."""

from __future__ import annotations

import collections
import gzip
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp

from deliverables.gpu import predict
from deliverables.gpu.predict import Event
from deliverables.gpu.steps import TINY, Context, attention_fns
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.files import write_json
from jaxlm.predict.roofline import device_rates
from jaxlm.predict.roofline import predict as roofline

CALIBRATION_FILE = "calibration.json"
MATMUL = re.compile(r"gemm|cublas|cutlass|xmma|nvjet|wgmma|\bdot|dot_|matmul|ynn", re.IGNORECASE)
TOP = 10
CALLS = 3  # traced calls per program
PROFILE_OPTIONS = {"xla_gpu_enable_command_buffer": ""}  # in a CUDA graph a trace names the graph, not its kernels


def read_events(path: Path | None) -> list[Event]:
    """The device's work in a trace: the GPU's stream kernels (copies included), or on a CPU the XLA ops (events
    that name their HLO instruction) on its executor threads."""
    if path is None:
        return []
    data = json.load(gzip.open(path))
    events = data["traceEvents"] if isinstance(data, dict) else data
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    gpu = any(p.startswith("/device:GPU") for p in procs.values())
    out = []
    for e in events:
        if e.get("ph") != "X" or e["name"].startswith("end: "):
            continue
        proc, thread = procs.get(e["pid"], ""), threads.get((e["pid"], e.get("tid")), "")
        args = e.get("args") or {}
        if (gpu and proc.startswith("/device:GPU") and "Stream" in thread) or (
                not gpu and thread.startswith(("tf_XLAPjRtCpuClient", "tf_XLAEigen")) and "hlo_op" in args):
            out.append(Event(e["name"], float(e.get("dur", 0)), args.get("hlo_op", ""), args.get("hlo_module", "")))
    return out


def summarise(events: list[Event]) -> dict:
    total = sum(e.us for e in events) or 1.0
    by_name = collections.Counter()
    for e in events:
        by_name[e.name] += e.us
    matmul = sum(d for n, d in by_name.items() if MATMUL.search(n))
    return {"total_us": total, "matmul_share": matmul / total,
            "top": [{"name": n, "us": d, "share": d / total, "matmul": bool(MATMUL.search(n))}
                    for n, d in by_name.most_common(TOP)]}


def _trace(fn, args, advance, trace_dir: Path) -> Path | None:
    """CALLS calls of `fn` traced (after two outside the trace); the newest trace file under trace_dir."""
    for _ in range(2):  # warm-up outside the trace
        args = advance(args, jax.block_until_ready(fn(*args)))
    with jax.profiler.trace(str(trace_dir)):
        for i in range(CALLS):
            with jax.profiler.StepTraceAnnotation("step", step_num=i):
                out = jax.block_until_ready(fn(*args))
            args = advance(args, out)
    files = sorted(trace_dir.glob("plugins/profile/*/*.trace.json.gz"))
    return files[-1] if files else None


def _compile(step, gpu: bool) -> tuple[object, str]:
    """The step compiled for tracing: with command buffers off on a GPU (PROFILE_OPTIONS), or as it is when the
    compiler refuses the option (the note says so: the groups' kernels may then go unmatched)."""
    from jaxlm.bench import steps

    if not gpu:
        return steps.compile_step(step), "default compiler options (no command buffers on a CPU)"
    try:
        return step.jitted.lower(*step.args).compile(compiler_options=PROFILE_OPTIONS), "command buffers off"
    except Exception as e:  # an XLA that does not take the option: trace what it compiles by default
        return steps.compile_step(step), f"command buffers as compiled by default ({type(e).__name__}: {e})"[:300]


def traced_program(ctx: Context, mode: str, cfg, compute, batch: int, context: int) -> dict:
    """One mode of the benchmark's step traced: the op-level summary and, per kernel group, its roofline against
    the trace. The trace and the optimised program text stay in the scratch folder (their paths: `files`)."""
    from jaxlm.bench import steps

    step = steps.build_step(mode, cfg, compute, batch, context)
    compiled, options = _compile(step, ctx.gpu)
    folder = ctx.scratch / "traces" / mode
    trace = _trace(compiled, step.args, step.advance, folder)
    events = read_events(trace)
    text = compiled.as_text() or ""
    program = folder / "program.hlo.txt.gz"
    with gzip.open(program, "wt") as f:
        f.write(text)
    device, label = predict.target()
    prediction, module = roofline(text, device_rates(device)), predict.module_name(text)
    res = summarise(events)
    res["roofline"] = {**predict.compare(prediction, events, CALLS, module), "label": label, "compiler": options,
                       "calls": CALLS}
    model = "the tiny smoke model" if ctx.smoke else "small"
    source = (f"python -m deliverables.gpu --only profile: {mode} of {model}, context {context}, batch "
              f"{batch}, {compute.dtype}, on {ctx.device}")
    # a run without a GPU calibrates nothing: its name matches no device, so no `--target` command takes it
    name = device.name if ctx.gpu else f"no GPU ({ctx.device})"
    res["calibration"] = predict.calibrate(prediction, events, CALLS, module, name, source).as_dict()
    res["files"] = {"trace": str(trace) if trace else None, "program": str(program)}
    return res


def run_profile(ctx: Context) -> dict:
    """Trace a forward pass and a train step of `small` (bfloat16 on a GPU) and attention alone."""
    cfg, T, B = (TINY, 32, 2) if ctx.smoke else (ModelConfig.from_name("small"), 1024, 4)
    compute = ComputeConfig(dtype="bfloat16" if ctx.gpu else "float32")
    res = {"model": "tiny" if ctx.smoke else "small", "context": T, "batch": B, "dtype": compute.dtype}
    for mode in ("forward", "train_step"):
        res[mode] = traced_program(ctx, mode, cfg, compute, B, T)
    # the train step's calibration, the file every later `--target` prediction for this GPU reads once committed
    # (python -m deliverables.gpu.merge puts it in jaxlm.predict.calibration.CALIBRATIONS)
    write_json(ctx.out / CALIBRATION_FILE, res["train_step"]["calibration"])
    shape = (B, T, cfg.num_heads, cfg.head_dim)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(compute.dtype) for key in keys)
    fwd, _ = attention_fns("xla", None)
    res["attention"] = summarise(read_events(_trace(fwd, (q, k, v), lambda a, o: a, ctx.scratch / "traces" /
                                                    "attention")))
    return res
