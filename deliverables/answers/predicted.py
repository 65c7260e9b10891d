"""The part-2 speed questions answered with predicted H100 figures until a GPU measures them.

benchmarking_script (b), the forward/backward and feed-forward/attention split, nsys_profile (a)-(e) and
the mixed-precision timings, from the steps compiled for an H100 on this machine and priced kernel by kernel
(`python -m deliverables.compiled_time`, kept in ROOT/compiled/h100-80gb.json with their kernel tables):
every figure is labelled a prediction. Measured GPU figures (the GPU campaign's ROOT/gpu/results.json)
stand beside them, and in the answer's place, where they exist.
"""

from __future__ import annotations

from pathlib import Path

from deliverables.answers.accounting import model
from deliverables.common import table
from deliverables.compiled_time import SIZE_BATCH, SIZE_CONTEXT, SIZES, stored
from jaxlm.analysis.flops import forward_flops

TARGET = "h100-80gb"
COMMAND = f"python -m deliverables.compiled_time --target {TARGET} --only sizes mixed-precision"
ATTENTION = ("attention projections", "attention matmuls", "attention softmax and mask", "attention (cuDNN, fused)")
SOFTMAX_FLOPS = 5  # per attention score: the max, subtract, exp, sum and divide of a softmax


def ms(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def sizes(root: Path) -> dict[tuple[str, str], dict]:
    """(preset, mode) -> the size's step compiled for the H100 with its prediction; {} before it is compiled."""
    return {tuple(label.split(", ")): r for label, r in stored("sizes", TARGET, root / "compiled").items()}


def pending(what: str) -> list[str]:
    return [f"**Not predicted yet** ({what}): the steps compiled for an H100, with their predicted kernel tables, "
            f"are not in the compiled store; on any machine with the `gpu-compile` extra:", "",
            f"```bash\n{COMMAND}\n```", ""]


def label(rows: dict) -> str:
    return next(iter(rows.values()))["predicted_label"]


def matmul_share(row: dict) -> float:
    """Time in matmul kernels: the matmul group and attention's own matmuls (QK^T, PV; cuDNN's fused kernel)."""
    groups = {g["group"]: g["share"] for g in row["predicted_groups"]}
    comps = row["predicted_components"]
    attention = sum(comps.get(c, 0.0) for c in ("attention matmuls", "attention (cuDNN, fused)"))
    return groups.get("matmul", 0.0) + attention / row["predicted_step_ms"]


def size_section(root: Path, measured: dict[tuple[str, str], float]) -> list[str]:
    """(b) per size: the predicted eval-step forward and the train step split into its passes; `measured`:
    (preset, "forward" | "forward_backward") -> ms on a GPU, shown beside."""
    rows = sizes(root)
    if not rows:
        return pending("the size table")
    out = [f"**Predicted, not measured**: every time below is {label(rows)} (the roofline over each kernel at the "
           "H100's achieved rates, docs/benchmarks.md \"Predicted GPU time\"), at context "
           f"{SIZE_CONTEXT}, batch {SIZE_BATCH}, float32 (TF32 matmuls, JAX's default). *forward*: the eval step "
           "(forward and loss); the train step's forward, backward and AdamW update are its kernels by pass.", ""]
    head = ["model", "forward (ms)", "train step (ms)", "its forward", "its backward", "its optimizer",
            "tokens/s", "MFU"] + (["measured forward (ms)", "measured fwd + bwd (ms)"] if measured else [])
    body = []
    for preset in SIZES:
        f, t = rows.get((preset, "forward")), rows.get((preset, "train_step"))
        if not (f and t):
            continue
        ph = t["predicted_phases"]
        cells = [preset, ms(f["predicted_step_ms"]), ms(t["predicted_step_ms"]), ms(ph.get("forward", 0)),
                 ms(ph.get("backward", 0) + ph.get("recompute", 0)), ms(ph.get("optimizer", 0)),
                 f"{t['predicted_tokens_per_s']:,.0f}", pct(t["predicted_mfu"])]
        if measured:
            cells += [ms(measured[k]) if k in measured else "–" for k in ((preset, "forward"),
                                                                          (preset, "forward_backward"))]
        body.append(cells)
    ratios = [r["predicted_phases"].get("backward", 0) / r["predicted_phases"]["forward"]
              for (p, m), r in rows.items() if m == "train_step" and r["predicted_phases"].get("forward")]
    return out + [table(head, body, "lr"), ""] + [
        f"The predicted backward pass takes {min(ratios):.1f}x to {max(ratios):.1f}x the forward's time (the FLOP "
        "count says 2x, two matmuls per forward matmul; the memory-bound elementwise kernels, which the FLOP count "
        "leaves out, move the ratio either way).", ""]


def breakdown_section(root: Path) -> list[str]:
    """Where each size's predicted train step goes: feed-forward against attention, time against FLOPs."""
    rows = sizes(root)
    if not rows:
        return []
    body = []
    for preset in SIZES:
        t = rows.get((preset, "train_step"))
        if not t:
            continue
        c, total = t["predicted_components"], t["predicted_step_ms"]
        attention = sum(c.get(k, 0.0) for k in ATTENTION)
        fl = forward_flops(model(preset), SIZE_CONTEXT)
        body.append([preset, pct(c.get("feed-forward", 0) / total), pct(attention / total),
                     pct(c.get("output head and loss", 0) / total), pct(c.get("norms", 0) / total),
                     pct(c.get("optimizer and clipping", 0) / total),
                     f"{c.get('feed-forward', 0) / attention:.2f}", f"{fl.ffn / fl.attention:.2f}"])
    return ["#### Where the predicted train step goes, by part of the model", "",
            "Shares of each size's predicted train step (kernels placed by the model code they come from); the "
            "last two columns set the feed-forward's time against attention's (projections, scores, softmax) "
            "and against their FLOP ratio:", ""] + [table(
        ["model", "feed-forward", "attention", "output head and loss", "norms", "optimizer", "FFN/attention time",
         "FFN/attention FLOPs"], body, "lr"), ""] + [
        "Attention takes a larger share of the time than of the FLOPs: its softmax and mask run at memory "
        "bandwidth over B x H x T x T scores, which the FLOP count leaves out.", ""]


def _op(o: dict) -> str:
    return f"`{o['op'][-60:]}` ({o['component']}, {o['source'] or o['group']}; {o['launches']} launches, " \
           f"{pct(o['share'])})"


def nsys_lines(root: Path) -> list[str]:
    """nsys_profile (a)-(e) from the predicted kernel tables of `small`'s eval step and train step."""
    rows = sizes(root)
    f, t = rows.get(("small", "forward")), rows.get(("small", "train_step"))
    if not (f and t):
        return pending("the kernel tables")
    others = [o for o in f["predicted_ops"] if not o["flops"]][:4]
    comps = f["predicted_components"]
    mm, sm = comps.get("attention matmuls", 0.0), comps.get("attention softmax and mask", 0.0)
    cfg = model("small")
    attn_flops = forward_flops(cfg, SIZE_CONTEXT).attention_core
    soft_flops = SOFTMAX_FLOPS * cfg.num_layers * cfg.num_heads * SIZE_CONTEXT**2
    share = {m: ", ".join(f"{p} {pct(matmul_share(rows[(p, m)]))}" for p in SIZES if (p, m) in rows)
             for m in ("forward", "train_step")}
    return [f"**Predicted answers, not measurements**: {label(rows)}, from the kernel tables of `small` at context "
            f"{SIZE_CONTEXT}, batch {SIZE_BATCH}, float32 (`python -m jaxlm.bench ops --target {TARGET} --preset "
            f"small --context {SIZE_CONTEXT} --batch {SIZE_BATCH} --mode forward` prints the same table). A kernel "
            "here is one of the compiled program's launches; an op sums its launches over the layers, as Nsight's "
            "kernel summary sums one kernel's.", "",
            f"- (a) The forward pass (eval step) is predicted at {ms(f['predicted_step_ms'])} ms, the train step at "
            f"{ms(t['predicted_step_ms'])} ms; Python's timer on this CPU measures XLA:CPU, a different machine, so "
            "the comparison waits for a GPU.",
            f"- (b) Most predicted time in the forward pass: {_op(f['predicted_ops'][0])}; in the train step: "
            f"{_op(t['predicted_ops'][0])}.",
            "- (c) Non-matmul ops with the most predicted time in the forward pass: "
            + "; ".join(_op(o) for o in others) + ".",
            f"- (d) Share of the predicted time in matmul kernels, forward: {share['forward']}; train step: "
            f"{share['train_step']}. The train step adds the backward's matmuls and the AdamW update and gradient "
            f"clipping ({pct(t['predicted_components'].get('optimizer and clipping', 0) / t['predicted_step_ms'])} "
            "for `small`), memory-bound elementwise passes over every parameter.",
            f"- (e) Inside attention in the forward pass: softmax and mask {ms(sm)} ms against {ms(mm)} ms for the "
            f"two matmuls (QK^T, PV), a time ratio of {sm / mm:.2f}, while their FLOPs are in the ratio "
            f"{soft_flops / attn_flops:.3f} (about {SOFTMAX_FLOPS} per score against 4 d_head per score for the "
            "matmuls): the softmax reads and writes every score from memory, so its time follows bytes, not "
            "FLOPs.", ""]


def mixed_precision_lines(root: Path) -> list[str]:
    """benchmarking_mixed_precision (c): predicted float32 against bfloat16, `small`, context 512, batch 8."""
    rows = stored("mixed-precision", TARGET, root / "compiled")
    pairs = [(m, rows.get(f"{m}, float32"), rows.get(f"{m}, bfloat16")) for m in ("forward", "train_step")]
    pairs = [(m, f, b) for m, f, b in pairs if f and b]
    if not pairs:
        return []
    return [f"Predicted, not measured ({label(rows)}), `small` at context 512, batch 8: "
            + "; ".join(f"{m.replace('_', ' ')} {ms(f['predicted_step_ms'])} ms in float32 (TF32 matmuls) against "
                        f"{ms(b['predicted_step_ms'])} ms in bfloat16 "
                        f"({f['predicted_step_ms'] / b['predicted_step_ms']:.2f}x)" for m, f, b in pairs)
            + ". bfloat16 halves the bytes of every activation and doubles the tensor cores' rate over TF32.", ""]
