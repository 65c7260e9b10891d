"""The part-2 questions that need a GPU: memory_profiling, nsys_profile, mixed precision.

Each answer uses what the records hold: the 2.7B model's memory compiled for an H100 by `python -m
deliverables.compiled_memory` (ROOT/compiled/h100-80gb.json) and the GPU campaign's results
(ROOT/gpu/results.json, `python -m deliverables.gpu`). Where the campaign is absent it says why the question
needs a GPU, gives the exact command, and answers with the predicted H100 figures meanwhile
(deliverables.answers.predicted). The float16 accumulation is computed here (numpy).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from deliverables.answers.accounting import model
from deliverables.answers.predicted import mixed_precision_lines, nsys_lines
from deliverables.common import table
from jaxlm.analysis import memory
from jaxlm.core.config import ComputeConfig
from jaxlm.core.files import read_json
from jaxlm.core.units import si

MODEL, BATCH, CONTEXTS, TARGET = "2.7B", 4, (128, 256, 512), "h100-80gb"
SECTION = "2.7B"  # deliverables.compiled_memory's section: forward and train step, float32 and bfloat16, batch 4
MEMORY_COMMAND = f"python -m deliverables.compiled_memory --target {TARGET} --only {SECTION}"
MODES, DTYPES = ("forward", "train_step"), ("float32", "bfloat16")


def compiled_rows(root: Path) -> dict[tuple, dict]:
    """(mode, dtype, context) -> the MODEL step compiled for TARGET, from deliverables.compiled_memory's cache of
    compiled figures (ROOT/compiled/TARGET.json, kept per jax version); {} when not compiled yet."""
    from deliverables.compiled_memory import cached
    from jaxlm.predict.target import parse_target

    label = parse_target(TARGET).label
    out = {}
    for name, row in cached(SECTION, TARGET, root / "compiled").items():
        mode, dtype, context = re.fullmatch(r"(\w+), (\w+), context (\d+)", name).groups()
        out[(mode, dtype, int(context))] = {**row, "label": label}
    return out


def memory_table(rows: dict[tuple, dict], value) -> list[str]:
    head = ["context", *(f"{m.replace('_', ' ')} {d}" for m in MODES for d in DTYPES)]
    body = [[str(t), *(value(rows.get((m, d, t)), m, d, t) for m in MODES for d in DTYPES)] for t in CONTEXTS]
    return [table(head, body, "lr"), ""]


def estimated(row, mode: str, dtype: str, t: int) -> str:
    est = memory.estimate(model(MODEL, t), BATCH, t, ComputeConfig(dtype=dtype), mode=mode)
    return si(est.state_total + est.activation_total, "B")


def memory_profiling_section(root: Path) -> list[str]:
    rows = compiled_rows(root)
    out = ["### memory_profiling", "",
           "(a) The memory timeline: `python -m jaxlm.bench model --preset 2.7B --context 512 --batch 4 "
           "--mode train_step "
           "--memory-profile DIR` writes the device memory profile of a forward pass and of a train step "
           "(`jax.profiler.save_device_memory_profile`, pprof) and the compiled step's buffer assignment; on a GPU, "
           "TensorBoard's memory viewer on a trace (`--set 'log.profile_steps=[10,12]'` in training) shows the "
           "timeline, where the forward's rise (activations kept), the backward's fall (activations freed as "
           "gradients appear) and the optimizer's flat top (moments updated in place) are told apart. It needs a GPU: "
           "XLA:CPU has no device allocator whose timeline means anything for an accelerator.", ""]
    if rows:
        label = next(iter(rows.values())).get("label") or f"compiled for {TARGET}"
        out += [f"(b) Peak memory of the {MODEL} model at batch {BATCH}, {label}: bytes per GPU of the compiled "
                "program (arguments + outputs + temporaries - donated), no allocator overhead:", ""]
        out += memory_table(rows, lambda r, *_: si(r["total_bytes"], "B") if r else "–")
        pairs = [(rows.get((m, "float32", t)), rows.get((m, "bfloat16", t))) for m in MODES for t in CONTEXTS]
        ratios = [b["total_bytes"] / f["total_bytes"] for f, b in pairs if f and b]
        if ratios:
            out += [f"(c) bfloat16 against float32: {min(ratios):.2f}x to {max(ratios):.2f}x the memory. "
                    "The parameters, "
                    "gradients and AdamW moments stay float32 (mixed precision keeps a float32 master copy and adds "
                    "bfloat16 copies of the weights), so only the activations halve; where the state dominates, the "
                    "saving is small.", ""]
    else:
        out += ["(b), (c) **Pending: the figures compiled for an H100** (the GPU compiler's memory plan of each step, "
                "made on any machine with the `gpu-compile` extra):", "", f"```bash\n{MEMORY_COMMAND}\n```", "",
                "Until then, `jaxlm.memory`'s analytic estimate of the same steps (an estimate, not a "
                "measurement):", ""]
        out += memory_table({}, estimated)
    resid = {t: BATCH * t * model(MODEL).d_model * 4 for t in CONTEXTS}
    return out + [f"(d) One residual-stream activation of the {MODEL} model (batch {BATCH}, "
                  f"d_model {model(MODEL).d_model}, float32) is B x T x d x 4 bytes: "
                  + ", ".join(f"{v / 2 ** 20:g} MiB at T = {t}" for t, v in resid.items()) + ".", ""]


def campaign(root: Path) -> dict:
    """The GPU campaign's results by step (ROOT/gpu/results.json), each step's result dict, or {}."""
    steps = (read_json(root / "gpu" / "results.json", default=None) or {}).get("steps") or {}
    return {k: (v.get("result", v) if isinstance(v, dict) else v) for k, v in steps.items()}


def kernel_lines(summary: dict, what: str) -> list[str]:
    top = summary.get("top") or []
    out = [f"- {what}: {summary.get('total_us', 0) / 1e3:.2f} ms of device time over the traced calls, "
           f"{100 * summary.get('matmul_share', 0):.0f}% in matmul kernels. Top kernels:"]
    return out + [f"  - `{k['name'][:80]}`: {100 * k['share']:.1f}%{' (matmul)' if k.get('matmul') else ''}"
                  for k in top[:5]]


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
            "bfloat16 has float32's range, so no "
            "overflow, but only 8 bits of mantissa, so the norms still run in float32.", "",
            "(c) " + ("The campaign's bench tables in both dtypes are in its report ([results/gpu/report.md]"
                      "(results/gpu/report.md)), sections bench_bf16 and bench_f32." if bench else
                      ("" if predicted else "**Pending**: ") + "bfloat16 against float32 timings are GPU figures "
                      "(XLA:CPU computes bfloat16 through float32)" + (", answered below by prediction" if predicted
                                                                        else "")
                      + "; `python -m deliverables.gpu --only bench_bf16 bench_f32` measures the size table in both on "
                      "a GPU."),
            ""] + predicted
