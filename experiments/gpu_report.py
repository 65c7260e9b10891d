"""The GPU campaign's profiler step (trace capture and its op-level summary) and every step's Markdown.

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

    from experiments.gpu_steps import TINY, _attention_fns
    from jaxlm.bench import jax_side
    from jaxlm.config import ComputeConfig, ModelConfig

    cfg, T, B = (TINY, 32, 2) if ctx.smoke else (ModelConfig.from_name("small"), 1024, 4)
    compute = ComputeConfig(dtype="bfloat16" if ctx.gpu else "float32")
    res = {"model": "tiny" if ctx.smoke else "small", "context": T, "batch": B, "dtype": compute.dtype}
    for mode in ("forward", "train_step"):
        step = jax_side.build_step(mode, cfg, compute, B, T)
        res[mode] = _trace(jax_side.compile_step(step), step.args, step.advance, ctx.scratch / "traces" / mode)
    shape = (B, T, cfg.num_heads, cfg.head_dim)
    q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(compute.dtype) for key in jax.random.split(jax.random.key(0), 3))
    fwd, _ = _attention_fns("xla", None)
    res["attention"] = _trace(fwd, (q, k, v), lambda a, o: a, ctx.scratch / "traces" / "attention")
    return res


# --------------------------------------------------------------------------- Markdown


def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join("-" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _f(x, fmt: str = ".3g"):
    return None if x is None else format(x, fmt)


def _pm(mean, std):
    return None if mean is None else f"{mean:.3g} +- {std or 0:.2g}"


def _attention(res: dict) -> str:
    rows = [[r["context"], r["window"] or "none", r["batch"], r["implementation"], _f(r.get("out_rel_err"), ".2e"),
             _f(r.get("grad_rel_err"), ".2e"), _pm(r.get("fwd_ms"), r.get("fwd_ms_std")),
             _pm(r.get("fwd_bwd_ms"), r.get("fwd_bwd_ms_std")), r["status"] if r["status"] == "ok" else
             f"{r['status']}: {r.get('reason', '')}"] for r in res["rows"]]
    return ("bfloat16 inputs, compared by ||out - ref|| / ||ref|| with the float32 xla attention on the same "
            f"inputs; {res.get('tokens_per_call', '?')} tokens per call (batch = tokens / context), "
            f"{res.get('heads', '?')} heads of {res.get('head_dim', '?')}.\n\n"
            + _table(["context", "window", "batch", "kernel", "out rel. err", "grad rel. err", "forward ms",
                      "fwd+bwd ms", "status"], rows))


def _bench(res: dict) -> str:
    rows = [[r["model"], r["mode"], r.get("attention"), r.get("remat"), r["context"], r.get("batch"),
             r["status"] if r["status"] == "ok" else f"{r['status']}: {(r.get('error') or '')[:80]}",
             _pm(r.get("step_ms"), r.get("step_ms_std")), _f(r.get("tokens_per_s"), ",.0f"),
             None if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
             _f(r.get("memory_gb")) if r.get("memory_source") == "memory_stats" else None,
             _f(r.get("estimate_gb")), _f(r.get("jaxlm_memory_estimate_gb"))] for r in res["rows"]]
    return ("Memory columns: device peak (the device's peak bytes in use since the process started), XLA's "
            "compiled estimate (`memory_analysis()` of this step), jaxlm.memory's analytic estimate.\n\n"
            + _table(["model", "mode", "attention", "remat", "context", "batch", "status", "step ms",
                      "tokens/s", "MFU", "device peak GB", "XLA estimate GB", "jaxlm.memory GB"], rows))


def _max_batch(res: dict) -> str:
    rows = [[r["attention"], r["remat"], r["context"], r.get("predicted"), r.get("ladder"), r.get("largest_ok"),
             r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')}"] for r in res["rows"]]
    return ("Predicted: jaxlm.memory's largest batch for the device's memory; then one-step runs at the "
            "ladder's batches, up to the first that fails.\n\n"
            + _table(["attention", "remat", "context", "predicted", "ladder", "largest that ran", "status"], rows))


def _profile(res: dict) -> str:
    parts = [f"`{res['model']}`, context {res['context']}, batch {res['batch']}, {res['dtype']}."]
    for mode in ("forward", "train_step", "attention"):
        s = res[mode]
        parts += ["", f"**{mode}**: matmul kernels take {100 * s['matmul_share']:.1f}% of "
                      f"{s['total_us'] / 1e3:.2f} ms of device time over the traced calls"
                  + (" (the rest of attention alone is the softmax, masking and scaling)." if mode == "attention" else "."),
                  "", _table(["kernel / op", "ms", "share", "matmul"],
                             [[f"`{t['name'][:70]}`", f"{t['us'] / 1e3:.3f}", f"{100 * t['share']:.1f}%",
                               "yes" if t["matmul"] else ""] for t in s["top"]])]
    return "\n".join(parts)


def _shakespeare(res: dict) -> str:
    hit = res.get("reached")
    first = f"reached at step {hit['step']}, {hit['seconds']:.0f} s after launch" if hit else "not reached"
    return (f"Command: `{res['command']}`\n\nRun: {res['status']}, {res['wall_s']:.0f} s wall in all (data "
            f"preparation and compilation included). Validation loss {res['target']}: {first}.\n\n"
            + _table(["step", "val loss", "s since launch"],
                     [[e["step"], _f(e["val_loss"], ".4f"), _f(e["seconds"], ".0f")] for e in res["rows"]]))


SECTIONS = {"attention": _attention, "bench_bf16": _bench, "bench_f32": _bench, "techniques": _bench,
            "max_batch": _max_batch, "profile": _profile, "shakespeare": _shakespeare}


def section(name: str, res: dict) -> str:
    text = SECTIONS[name](res)
    return text + (f"\n\nCut short: {res['cut']}." if res.get("cut") else "")
