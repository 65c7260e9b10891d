"""The GPU campaign's profiler step: trace capture and its op-level summary.

The summary answers from a JAX/XLA trace what the curriculum asks of Nsight Systems: the top kernels by
time, the share of matmul kernels in a forward pass against a train step, and softmax against matmul time
inside attention. Kernels are the device's stream events on a GPU; on a CPU, XLA's op events on its
executor threads. A kernel counts as a matmul when its name says so (gemm, cuBLAS, CUTLASS, xmma, nvjet,
dot; on CPU the YNNPACK fusions XLA uses for dots).
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from pathlib import Path

from experiments.gpu.steps import TINY, Context, attention_fns

MATMUL = re.compile(r"gemm|cublas|cutlass|xmma|nvjet|wgmma|\bdot|dot_|matmul|ynn", re.IGNORECASE)
TOP = 10


def _events(trace_dir: Path) -> list[tuple[str, float]]:
    """(kernel or op name, microseconds) of the device's work in the newest trace under trace_dir."""
    files = sorted(trace_dir.glob("plugins/profile/*/*.trace.json.gz"))
    if not files:
        return []
    data = json.load(gzip.open(files[-1]))
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
        if gpu and proc.startswith("/device:GPU") and "Stream" in thread:
            out.append((e["name"], float(e.get("dur", 0))))
        elif not gpu and thread.startswith(("tf_XLAPjRtCpuClient", "tf_XLAEigen")):
            out.append((e["name"], float(e.get("dur", 0))))
    return out


def summarise(events: list[tuple[str, float]]) -> dict:
    total = sum(d for _, d in events) or 1.0
    by_name = collections.Counter()
    for name, dur in events:
        by_name[name] += dur
    matmul = sum(d for n, d in by_name.items() if MATMUL.search(n))
    return {"total_us": total, "matmul_share": matmul / total,
            "top": [{"name": n, "us": d, "share": d / total, "matmul": bool(MATMUL.search(n))}
                    for n, d in by_name.most_common(TOP)]}


def _trace(fn, args, advance, trace_dir: Path, calls: int = 3) -> dict:
    import jax

    for _ in range(2):  # warm-up outside the trace
        out = fn(*args)
        jax.block_until_ready(out)
        args = advance(args, out)
    with jax.profiler.trace(str(trace_dir)):
        for i in range(calls):
            with jax.profiler.StepTraceAnnotation("step", step_num=i):
                out = fn(*args)
                jax.block_until_ready(out)
            args = advance(args, out)
    return summarise(_events(trace_dir))


def profile_summary(ctx) -> dict:
    """Trace a forward pass and a train step of `small` (bfloat16 on a GPU) and attention alone."""
    import jax
    import jax.numpy as jnp

    from jaxlm.bench import steps
    from jaxlm.core.config import ComputeConfig, ModelConfig

    cfg, T, B = (TINY, 32, 2) if ctx.smoke else (ModelConfig.from_name("small"), 1024, 4)
    compute = ComputeConfig(dtype="bfloat16" if ctx.gpu else "float32")
    res = {"model": "tiny" if ctx.smoke else "small", "context": T, "batch": B, "dtype": compute.dtype}
    for mode in ("forward", "train_step"):
        step = steps.build_step(mode, cfg, compute, B, T)
        res[mode] = _trace(steps.compile_step(step), step.args, step.advance, ctx.scratch / "traces" / mode)
    shape = (B, T, cfg.num_heads, cfg.head_dim)
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(compute.dtype) for key in keys)
    fwd, _ = attention_fns("xla", None)
    res["attention"] = _trace(fwd, (q, k, v), lambda a, o: a, ctx.scratch / "traces" / "attention")
    return res


def run_profile(ctx: Context) -> dict:
    return profile_summary(ctx)


def estimate_profile(smoke: bool) -> float:
    return 8.0 if smoke else 40.0
