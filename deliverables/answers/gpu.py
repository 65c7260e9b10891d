"""memory_profiling, nsys_profile and mixed precision: GPU records, compiled profiles, numpy (docs/report.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deliverables import memory_profile as profile
from deliverables.answers import prose
from deliverables.answers.accounting import model
from deliverables.answers.predicted import mixed_precision_lines, nsys_lines
from deliverables.common import table
from jaxlm.analysis import flops
from jaxlm.core.files import read_json

TARGET = "h100-80gb"
PROFILE_COMMAND = f"python -m deliverables.memory_profile --target {TARGET}"


def timeline_lines(rows: dict[str, dict]) -> list[str]:
    """Where each float32 step's live bytes peak, in which phase, against its arguments and compiled total."""
    out = []
    for mode, t in ((m, t) for m in profile.MODES for t in profile.CONTEXTS):
        if r := rows.get(profile.label(mode, "float32", t)):
            at = r["peak_position"]
            where = next((name for name, (a, b) in r["phases"].items() if a <= at <= b), "?")
            out += prose("timeline_row", mode=mode.replace("_", " "), t=t, steps=r["instructions"], at=at,
                         peak=r["peak_live_bytes"] / 2**30, share=100 * at / r["instructions"], where=where,
                         above=(r["peak_live_bytes"] - r["argument_bytes"]) / 2**30, total=r["total_bytes"] / 2**30)
    return out


def largest_buffers(rows: dict[str, dict]) -> list[str]:
    """The five largest buffers of each float32 step at the longest context."""
    out = []
    for mode in profile.MODES:
        if (lbl := profile.label(mode, "float32", profile.CONTEXTS[-1])) in rows:
            body = [[f"{g['bytes'] / 2**20:,.1f}", f"`{g['shape']}`", str(g["count"]), f"`{g['op']}`",
                     f"`{g['source']}`"] for g in rows[lbl]["largest"][:5]]
            head = ["MiB each", "shape", "how many", "op (jax's name)", "source"]
            out += [f"{lbl}:", "", table(head, body, "lr"), ""]
    return out


def memory_profiling_section(root: Path) -> list[str]:
    """memory_profiling (a)-(c) from `large`'s steps compiled for an H100 (`python -m deliverables.memory_profile`)."""
    rows = profile.stored(root / "compiled")
    if not rows:
        return ["### memory_profiling", "", *prose("not_compiled", command=PROFILE_COMMAND, does="compiles `large` at "
                                                   "contexts 128, 256 and 512 and reads its buffer assignment")]
    cfg = model(profile.PRESET)
    row = lambda mode, dtype, t: rows.get(profile.label(mode, dtype, t))  # a step's profile, or None
    train = row("train_step", "float32", profile.CONTEXTS[-1])
    reading = prose("memory_reading", arguments=train["argument_bytes"] / 2**30,
                    grads=4 * flops.param_counts(cfg)["total"] / 2**30) if train else []
    steps = [(m, d) for m in profile.MODES for d in profile.DTYPES]
    gib = lambda r: f"{r['total_bytes'] / 2**30:.2f} GiB" if r else "–"
    totals = table(["context", *(f"{m.replace('_', ' ')} {d}" for m, d in steps)],
                   [[str(t), *(gib(row(m, d, t)) for m, d in steps)] for t in profile.CONTEXTS], "lr")
    pairs = [(row(m, "bfloat16", t), row(m, "float32", t)) for m in profile.MODES for t in profile.CONTEXTS]
    ratios = [b["total_bytes"] / f["total_bytes"] for b, f in pairs if b and f]
    ratio = prose("bf16_ratio", low=min(ratios), high=max(ratios)) if ratios else []
    resid = ", ".join(f"{profile.BATCH * t * cfg.d_model * 4 / 2**20:g} MiB at T = {t}" for t in profile.CONTEXTS)
    return prose("memory_profiling", preset=profile.PRESET, cfg=cfg, batch=profile.BATCH, command=PROFILE_COMMAND,
                 label=next(iter(rows.values()))["label"], timeline=timeline_lines(rows),
                 reading=reading, totals=totals, ratio=ratio, longest=profile.CONTEXTS[-1],
                 largest=largest_buffers(rows), resid=resid)


def campaign(root: Path) -> dict:
    """The GPU campaign's results by step (ROOT/gpu/results.json), each step's result dict, or {}."""
    steps = (read_json(root / "gpu" / "results.json", default=None) or {}).get("steps") or {}
    return {k: (v.get("result", v) if isinstance(v, dict) else v) for k, v in steps.items()}


def kernel_lines(summary: dict, what: str) -> list[str]:
    out = [f"- {what}: {summary.get('total_us', 0) / 1e3:.2f} ms of device time over the traced calls, "
           f"{100 * summary.get('matmul_share', 0):.0f}% in matmul kernels. Top kernels:"]
    return out + [f"  - `{k['name'][:80]}`: {100 * k['share']:.1f}%{' (matmul)' if k.get('matmul') else ''}"
                  for k in (summary.get("top") or [])[:5]]


def nsys_section(root: Path) -> list[str]:
    prof = campaign(root).get("profile")
    out = prose("nsys")
    if not isinstance(prof, dict) or "forward" not in prof:
        lines = nsys_lines(root)
        said = ("Answered below by prediction: no GPU campaign results are" if lines[0].startswith("**Predicted")
                else "**Pending**: no GPU campaign results")
        return out + prose("nsys_pending", said=said, root=root) + lines
    kernels = kernel_lines(prof["forward"], "forward pass") + kernel_lines(prof["train_step"], "train step")
    if isinstance(prof.get("attention"), dict):
        kernels += kernel_lines(prof["attention"], "attention alone (softmax against the two matmuls)")
    return out + prose("nsys_measured", p=prof, kernels=kernels)


def accumulation() -> list[tuple[str, float]]:
    """The question's four loops: 1000 additions of 0.01 with float32/float16 accumulators and summands."""
    out = []
    for label, acc, add in (("float32 += float32", np.float32, np.float32),
                            ("float16 += float16", np.float16, np.float16),
                            ("float32 += float16", np.float32, np.float16),
                            ("float32 += float32(float16)", np.float32, None)):
        s = acc(0)
        for _ in range(1000):
            s += acc(np.float16(0.01)) if add is None else add(0.01)
        out.append((label, float(s)))
    return out


def mixed_precision_section(root: Path) -> list[str]:
    rows = [[f"`{label}`", f"{v:.7g}", f"{v - 10:+.2e}"] for label, v in accumulation()]
    bench = {k: v for k, v in campaign(root).items() if k in ("bench_bf16", "bench_f32")}
    predicted = [] if bench else mixed_precision_lines(root)
    c = ("The campaign's bench tables in both dtypes are in its report ([results/gpu/report.md]"
         "(results/gpu/report.md)), sections bench_bf16 and bench_f32." if bench else
         ("" if predicted else "**Pending**: ") + "bfloat16 against float32 timings are GPU figures (XLA:CPU "
         "computes bfloat16 through float32)" + (", answered below by prediction" if predicted else "")
         + "; `python -m deliverables.gpu --only bench_bf16 bench_f32` measures the size table in both on a GPU.")
    rows = table(["accumulator += summand", "sum", "error"], rows, "lr")
    return prose("mixed_precision", table=rows, c=c) + predicted
