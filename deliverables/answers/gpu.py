"""The part-2 questions that need a GPU: memory_profiling (from `large`'s profile compiled for an H100,
`python -m deliverables.memory_profile`), nsys_profile and mixed precision (from the GPU campaign's
ROOT/gpu/results.json, `python -m deliverables.gpu`, else its command and the predicted H100 figures meanwhile).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from deliverables import memory_profile as profile
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
    grads = 4 * params / 2**30
    return [f"How to read them: the train step holds its arguments (the parameters, AdamW's two moments and the "
            f"batch, {r['argument_bytes'] / 2**30:.2f} GiB) from start to end. On top, the forward keeps each layer's "
            "activations for the backward, so the line rises through the forward; the backward frees them layer by "
            f"layer while it writes the gradients, which end as large as the parameters ({grads:.2f} GiB in "
            "float32) and all stay live until the update, since gradient clipping needs their global norm first; "
            "the update consumes them as it writes the new state into the donated buffers. Where the activations "
            "outweigh the gradients (the longest context) the peak is where the backward begins; where they do not, "
            "it moves to where the update begins. The eval step keeps no activations across layers: each layer's "
            "buffers are reused by the next, so its line stays within a few hundred MiB of the arguments.", ""]


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
    out = ["### memory_profiling", ""]
    if not rows:
        return out + [f"**Not compiled yet**: `{PROFILE_COMMAND}` (the `gpu-compile` extra) compiles `large` at "
                      "contexts 128, 256 and 512 and reads its buffer assignment.", ""]
    label = next(iter(rows.values()))["label"]
    cfg = model(profile.PRESET)
    out += [f"The `{profile.PRESET}` preset ({cfg.num_layers} layers, d_model {cfg.d_model}, vocabulary "
            f"{cfg.vocab_size:,}) at batch {profile.BATCH}, the eval step (forward and loss) and the full AdamW train "
            f"step, {label}: `{PROFILE_COMMAND}` compiles each step with XLA's dump on and reads the buffer "
            "assignment and the live ranges of the scheduled program (every figure on "
            f"[its page](results/compiled/{profile.PRESET}-memory-profile.md)). A GPU's allocator timeline "
            "(PyTorch's memory snapshot, or JAX's device memory profile) needs a GPU; this is the compiler's plan.",
            "", "(a) **Memory timeline, compiled, not a CUDA trace**: the bytes of every value live at each "
            "instruction of the compiled schedule (from the instruction that defines it to its last use), float32, "
            "a line per context:", "",
            f"![memory timeline](results/compiled/{profile.PRESET}-memory-timeline.png)", ""]
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


NSYS = (("(a)", "the forward pass's total time against the Python timing", "`bench_bf16` and `profile`"),
        ("(b)", "the kernel with the most GPU time in a forward pass, and in a full step", "`profile`"),
        ("(c)", "the non-matmul kernels that still take noticeable time in the forward pass", "`profile`"),
        ("(d)", "how the matmul share changes from a forward pass to a training step with AdamW", "`profile`"),
        ("(e)", "softmax against matmul time inside attention, set against their FLOPs", "`profile` (attention alone)"))


def nsys_section(root: Path) -> list[str]:
    prof = campaign(root).get("profile")
    out = ["### nsys_profile", "",
           "The questions ask for CUDA kernels and their times: only a GPU runs kernels (XLA:CPU runs its own fused "
           "loops, whose times say nothing about cuBLAS, cuDNN or the GPU's memory bandwidth). jaxlm answers them "
           "from a JAX profiler trace (the same CUPTI kernel records Nsight Systems shows) in the GPU campaign "
           "(docs/gpu.md), `python -m deliverables.gpu`, whose steps answer:", ""]
    out += [table(["question", "asks", "campaign step"], [list(q) for q in NSYS], "lr"), ""]
    if not isinstance(prof, dict) or "forward" not in prof:
        lines = nsys_lines(root)
        said = ("Answered below by prediction: no GPU campaign results are" if lines[0].startswith("**Predicted")
                else "**Pending**: no GPU campaign results")
        return out + [f"{said} under `{root}/gpu/`. On one NVIDIA GPU `python -m deliverables.gpu --only profile "
                      "bench_bf16` measures them (about a minute of the 9-minute campaign; "
                      "`nsys profile python -m deliverables.gpu --only profile` "
                      "gives the same kernels in Nsight Systems' own timeline).", ""] + lines
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
    return ["### mixed_precision_accumulation", "",
            "Adding 0.01 a thousand times (the exact sum is 10), computed here with numpy:", ""]\
        + [table(["accumulator += summand", "sum", "error"], rows, "lr"), ""] + [
            "A float16 accumulator loses most: near 10, float16's spacing is 2^-7 ≈ 0.0078, so each 0.01 is "
            "rounded to a multiple of it. A float16 summand in a float32 accumulator keeps only float16's error "
            "in 0.01 itself. Hence mixed precision computes in 16 bits but accumulates (matmul sums, norms, "
            "softmax, the loss, the optimizer) in float32.", "",
            "### benchmarking_mixed_precision", "",
            "(a) jaxlm's policy (`Precision`, [techniques/mixed-precision.md](techniques/mixed-precision.md)): the "
            "parameters stay float32; each matmul casts its inputs to the compute dtype and returns it (bfloat16); "
            "RMSNorm, the softmax and the loss compute in float32; the gradients are float32, as the parameters are. "
            "(b) A layer norm's mean and variance are sums over d elements, and its 1/sqrt(variance) amplifies their "
            "rounding error; in float16 the square of any value above 256 overflows its maximum of 65,504. "
            "bfloat16 has float32's range, so no overflow, but only 8 bits of mantissa, so the norms still run in "
            "float32.", "",
            "(c) " + ("The campaign's bench tables in both dtypes are in its report ([results/gpu/report.md]"
                      "(results/gpu/report.md)), sections bench_bf16 and bench_f32." if bench else
                      ("" if predicted else "**Pending**: ") + "bfloat16 against float32 timings are GPU figures "
                      "(XLA:CPU computes bfloat16 through float32)" + (", answered below by prediction" if predicted
                                                                        else "")
                      + "; `python -m deliverables.gpu --only bench_bf16 bench_f32` measures the size table in both on "
                      "a GPU."),
            ""] + predicted
