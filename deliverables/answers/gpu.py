"""The part-2 questions that need a GPU: memory_profiling (from `large`'s profile compiled for an H100,
`python -m deliverables.memory_profile`), nsys_profile and mixed precision (from the GPU campaign's
ROOT/gpu/results.json, `python -m deliverables.gpu`, else its command and the predicted H100 figures meanwhile).
"""

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
            out.append(f"- {mode.replace('_', ' ')}, context {t}: {r['instructions']:,} scheduled instructions; "
                       f"live bytes peak at {r['peak_live_bytes'] / 2**30:.2f} GiB at instruction {at:,} "
                       f"({100 * at / r['instructions']:.0f}% of the way, in the {where}), "
                       f"{(r['peak_live_bytes'] - r['argument_bytes']) / 2**30:.2f} GiB above the arguments; compiled "
                       f"total {r['total_bytes'] / 2**30:.2f} GiB.")
    return out + [""] if out else []


def reading(rows: dict[str, dict], params: int) -> list[str]:
    """How to read the train step's timeline: its arguments, activations and gradients."""
    r = rows.get(profile.label("train_step", "float32", profile.CONTEXTS[-1]))
    if not r:
        return []
    return prose("memory_reading", arguments=r["argument_bytes"] / 2**30, grads=4 * params / 2**30)


def peak_lines(rows: dict[str, dict], cfg) -> list[str]:
    """(b) each profiled step's compiled total by context, bfloat16 against float32; (c) the largest buffers at the
    longest context; one residual-stream activation's size beside them."""
    gib = lambda r: f"{r['total_bytes'] / 2**30:.2f} GiB" if r else "–"
    steps = [(m, d) for m in profile.MODES for d in profile.DTYPES]
    body = [[str(t), *(gib(rows.get(profile.label(m, d, t))) for m, d in steps)] for t in profile.CONTEXTS]
    out = ["(b) Peak memory, the compiled total per GPU (arguments + outputs + temporaries - donated):", "",
           table(["context", *(f"{m.replace('_', ' ')} {d}" for m, d in steps)], body, "lr"), ""]
    pairs = [(rows.get(profile.label(m, "bfloat16", t)), rows.get(profile.label(m, "float32", t)))
             for m in profile.MODES for t in profile.CONTEXTS]
    if ratios := [b["total_bytes"] / f["total_bytes"] for b, f in pairs if b and f]:
        out += [f"Mixed precision (bfloat16 compute) plans {min(ratios):.2f}x to {max(ratios):.2f}x the float32 "
                "memory: the parameters, gradients and AdamW moments stay float32 and bfloat16 copies of the weights "
                "are added, so only the activations shrink; where the state dominates, the saving is small.", ""]
    out += [f"(c) The largest buffers at context {profile.CONTEXTS[-1]}, from the compiled buffer assignment (the "
            "step's own values, not its parameters; equal ones counted together, usually one per layer), with the "
            "op and the source line in their metadata:", ""]
    for mode in profile.MODES:
        if (lbl := profile.label(mode, "float32", profile.CONTEXTS[-1])) in rows:
            body = [[f"{g['bytes'] / 2**20:,.1f}", f"`{g['shape']}`", str(g["count"]), f"`{g['op']}`",
                     f"`{g['source']}`"] for g in rows[lbl]["largest"][:5]]
            head = ["MiB each", "shape", "how many", "op (jax's name)", "source"]
            out += [f"{lbl}:", "", table(head, body, "lr"), ""]
    resid = {t: profile.BATCH * t * cfg.d_model * 4 for t in profile.CONTEXTS}
    return out + [f"One residual-stream activation (batch {profile.BATCH}, d_model {cfg.d_model}, float32) is "
                  "B x T x d x 4 bytes: " + ", ".join(f"{v / 2 ** 20:g} MiB at T = {t}" for t, v in resid.items())
                  + ". CS336 asks the same of its 2.7B model: its compiled peaks are on the "
                  "[compiled memory page](results/compiled/h100-80gb-memory.md).", ""]


def memory_profiling_section(root: Path) -> list[str]:
    rows = profile.stored(root / "compiled")
    if not rows:
        return ["### memory_profiling", "", f"**Not compiled yet**: `{PROFILE_COMMAND}` (the `gpu-compile` extra) "
                "compiles `large` at contexts 128, 256 and 512 and reads its buffer assignment.", ""]
    cfg = model(profile.PRESET)
    out = prose("memory_profiling", preset=profile.PRESET, cfg=cfg, batch=profile.BATCH, command=PROFILE_COMMAND,
                label=next(iter(rows.values()))["label"])
    return out + timeline_lines(rows) + reading(rows, flops.param_counts(cfg)["total"]) + peak_lines(rows, cfg)


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
    out += [f"From the campaign's trace of `{prof.get('model')}` (context {prof.get('context')}, "
            f"batch {prof.get('batch')}, {prof.get('dtype')}):", ""]
    out += kernel_lines(prof["forward"], "forward pass") + kernel_lines(prof["train_step"], "train step")
    if isinstance(prof.get("attention"), dict):
        out += kernel_lines(prof["attention"], "attention alone (softmax against the two matmuls)")
    return out + [""]


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
