"""The part-2 speed answers predicted for an H100 until a GPU measures them, each labelled so (docs/report.md)."""

from __future__ import annotations

from pathlib import Path

from deliverables.answers import prose
from deliverables.answers.accounting import model
from deliverables.common import table
from deliverables.compiled_time import NSYS_PRESETS, SIZE_BATCH, SIZE_CONTEXT, SIZES, stored
from jaxlm.analysis.devices import DEVICES
from jaxlm.analysis.flops import forward_flops
from jaxlm.predict.roofline import device_rates

TARGET = "h100-80gb"
COMMAND = f"python -m deliverables.compiled_time --target {TARGET} --only sizes mixed-precision"
ATTENTION = ("attention projections", "attention matmuls", "attention softmax and mask", "attention (cuDNN, fused)")
SOFTMAX_FLOPS = 5  # per attention score: the max, subtract, exp, sum and divide of a softmax
LAUNCH_MS = 1e3 * device_rates(DEVICES[TARGET]).launch_seconds  # the roofline's cost of one kernel launch


def ms(v: float) -> str:
    """Milliseconds without exponents: 3 significant digits below 100, whole numbers above."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def sizes(root: Path) -> dict[tuple[str, str], dict]:
    """(preset, mode) -> the size's step compiled for the H100 with its prediction; {} before it is compiled."""
    return {tuple(label.split(", ")): r for label, r in stored("sizes", TARGET, root / "compiled").items()}


def label(rows: dict) -> str:
    return next(iter(rows.values()))["predicted_label"]


def matmul_share(row: dict) -> float:
    """Time in matmul kernels: the matmul group and attention's own matmuls (QK^T, PV; cuDNN's fused kernel)."""
    groups = {g["group"]: g["share"] for g in row["predicted_groups"]}
    comps = row["predicted_components"]
    attention = sum(comps.get(c, 0.0) for c in ("attention matmuls", "attention (cuDNN, fused)"))
    return groups.get("matmul", 0.0) + attention / row["predicted_step_ms"]


def size_section(root: Path, measured: dict[tuple[str, str], float]) -> list[str]:
    """benchmarking_script (b) predicted, with `measured` ((preset, mode) -> GPU ms) beside where there is some."""
    rows = sizes(root)
    if not rows:
        return prose("pending", what="the size table", command=COMMAND)
    head = ["model", "forward (ms)", "train step (ms)", "its forward", "its backward", "its optimizer",
            "tokens/s", "MFU"] + (["measured forward (ms)", "measured fwd + bwd (ms)"] if measured else [])
    body, parts = [], []
    for preset in SIZES:
        f, t = rows.get((preset, "forward")), rows.get((preset, "train_step"))
        if t:
            c, total = t["predicted_components"], t["predicted_step_ms"]
            attention = sum(c.get(k, 0.0) for k in ATTENTION)
            fl = forward_flops(model(preset), SIZE_CONTEXT)
            shares = (c.get("feed-forward", 0), attention, c.get("output head and loss", 0), c.get("norms", 0),
                      c.get("optimizer and clipping", 0))
            parts.append([preset, *(pct(v / total) for v in shares), f"{c.get('feed-forward', 0) / attention:.2f}",
                          f"{fl.ffn / fl.attention:.2f}"])
        if not (f and t):
            continue
        ph = t["predicted_phases"]
        body.append([preset, ms(f["predicted_step_ms"]), ms(t["predicted_step_ms"]), ms(ph.get("forward", 0)),
                     ms(ph.get("backward", 0) + ph.get("recompute", 0)), ms(ph.get("optimizer", 0)),
                     f"{t['predicted_tokens_per_s']:,.0f}", pct(t["predicted_mfu"])]
                    + ([ms(measured[(preset, m)]) if (preset, m) in measured else "–"
                        for m in ("forward", "forward_backward")] if measured else []))
    ratios = [r["predicted_phases"].get("backward", 0) / r["predicted_phases"]["forward"]
              for (p, m), r in rows.items() if m == "train_step" and r["predicted_phases"].get("forward")]
    return prose("sizes_predicted", label=label(rows), context=SIZE_CONTEXT, batch=SIZE_BATCH,
                 table=table(head, body, "lr"), low=min(ratios), high=max(ratios),
                 parts=table(["model", "feed-forward", "attention", "output head and loss", "norms", "optimizer",
                              "FFN/attention time", "FFN/attention FLOPs"], parts, "lr"))


def _short(o: dict) -> str:
    return f"`{o['op'].rsplit('/', 1)[-1]}` ({o['component']}) {pct(o['share'])}"


def _op(o: dict) -> str:
    return f"`{o['op'][-60:]}` ({o['component']}, {o['source'] or o['group']}; {o['launches']} launches, " \
           f"{pct(o['share'])})"


def launch_lines(train: dict[str, dict]) -> str:
    """Each launch-bound kernel group, and the op with the most launches with the share its launches cost."""
    out = []
    for preset, r in train.items():
        bound = [g for g in r["predicted_groups"] if g.get("bound") == "launch" and g.get("launches")]
        o = max(r["predicted_ops"], key=lambda o: o["launches"])
        share = min(1.0, o["launches"] * LAUNCH_MS / o["predicted_ms"]) if o.get("predicted_ms") else 0.0
        out.append(f"`{preset}`: " + "".join(f"the {g['group']} group is launch-bound ({g['launches']} launches, "
                                             f"{pct(g['share'])} of the step); " for g in bound)
                   + f"`{o['op'].rsplit('/', 1)[-1]}` ({o['component']}) launches {o['launches']} kernels of "
                   f"{1e3 * o['predicted_ms'] / o['launches']:.1f} µs on average, {pct(share)} of its "
                   f"time the {1e3 * LAUNCH_MS:.0f} µs cost of each launch")
    return "; ".join(out)


def nsys_table(rows: dict[tuple[str, int, str], dict]) -> str:
    """nsys_profile (a), (b), (d), (e) per model and context."""
    body = []
    for (preset, t, mode), f in sorted(rows.items()):
        s = rows.get((preset, t, "train_step"))
        if mode != "forward" or not s:
            continue
        cfg, comps = model(preset), f["predicted_components"]
        mm, sm = comps.get("attention matmuls", 0.0), comps.get("attention softmax and mask", 0.0)
        flops = SOFTMAX_FLOPS * cfg.num_layers * cfg.num_heads * t**2 / forward_flops(cfg, t).attention_core
        body.append([f"{preset}, {t}", ms(f["predicted_step_ms"]), ms(s["predicted_step_ms"]),
                     _short(f["predicted_ops"][0]), _short(s["predicted_ops"][0]), pct(matmul_share(f)),
                     pct(matmul_share(s)), f"{sm / mm if mm else float('nan'):.2f} ({flops:.3f})"])
    return table(["model, context", "(a) forward ms", "train step ms", "(b) top op, forward", "(b) top op, train step",
                  "(d) matmul share, forward", "(d) train step", "(e) softmax / matmul time (FLOPs)"], body, "lr")


def nsys_lines(root: Path) -> list[str]:
    """nsys_profile (a)-(e) from the predicted kernel tables of `small` and `large` along the context."""
    rows = {}  # (preset, context, mode) -> the step compiled for the H100 with its predicted kernel table
    for name, r in stored("nsys", TARGET, root / "compiled").items():
        preset, mode, context = name.split(", ")
        rows[(preset, int(context.split()[-1]), mode)] = r
    if not rows:
        return prose("pending", what="the kernel tables", command=COMMAND)
    longest = max(t for _, t, _ in rows)
    others = {p: [o for o in rows[(p, longest, "forward")]["predicted_ops"] if not o["flops"]][:3]
              for p in NSYS_PRESETS if (p, longest, "forward") in rows}
    train = {p: rows[(p, SIZE_CONTEXT, "train_step")] for p in NSYS_PRESETS if (p, SIZE_CONTEXT, "train_step") in rows}
    others = "; ".join(f"`{p}`: " + ", ".join(_op(o) for o in os) for p, os in others.items())
    return prose("nsys_predicted", label=label(rows), batch=SIZE_BATCH, target=TARGET, table=nsys_table(rows),
                 longest=longest, others=others, context=SIZE_CONTEXT, launches=launch_lines(train))


def mixed_precision_lines(root: Path) -> list[str]:
    """benchmarking_mixed_precision (c): predicted float32 against bfloat16, `small`, context 512, batch 8."""
    rows = stored("mixed-precision", TARGET, root / "compiled")
    pairs = [(m, rows.get(f"{m}, float32"), rows.get(f"{m}, bfloat16")) for m in ("forward", "train_step")]
    pairs = [(m, f, b) for m, f, b in pairs if f and b]
    if not pairs:
        return []
    return prose("mixed_precision_predicted", label=label(rows), pairs="; ".join(
        f"{m.replace('_', ' ')} {ms(f['predicted_step_ms'])} ms in float32 (TF32 matmuls) against "
        f"{ms(b['predicted_step_ms'])} ms in bfloat16 ({f['predicted_step_ms'] / b['predicted_step_ms']:.2f}x)"
        for m, f, b in pairs))
