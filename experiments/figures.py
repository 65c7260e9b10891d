"""The three plots CS395T requires, drawn from every plan's records for the written report.

memory vs sequence length and throughput vs batch (one line per compute dtype, so
with and without mixed precision) come from benchmark rows; before/after compares
the optimisation runs with their baseline. A plot the records cannot support is
named as missing with the reason, never drawn from made-up points.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from experiments.report import _plt, fmt, shrink_png, value
from experiments.report.format import QUANTITIES

SETTING = ("framework", "mode", "dtype", "attention", "remat")


def bench_rows(runs: list[dict]) -> list[dict]:
    return [row for r in runs for row in r.get("bench_rows") or [] if row.get("status") == "ok"]


def lines_by(rows: list[dict], x: str, y: str, fixed: tuple[str, ...]) -> dict[str, list[tuple[float, float]]]:
    """label -> sorted (x, y) points, a line per combination of `fixed` fields with >= 2 distinct x."""
    groups: dict[str, dict[float, list[float]]] = {}
    for r in rows:
        if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float)) and math.isfinite(r[y]):
            label = " ".join(f"{k}={r[k]}" if k in ("batch", "context") else str(r[k]) for k in fixed if r.get(k) is not None)
            groups.setdefault(label, {}).setdefault(float(r[x]), []).append(float(r[y]))
    return {k: sorted((a, statistics.mean(v)) for a, v in pts.items()) for k, pts in groups.items() if len(pts) >= 2}


def line_plot(lines: dict, xlabel: str, ylabel: str, path: Path, logx: bool = True) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, pts in sorted(lines.items()):
        ax.plot(*zip(*pts), marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    shrink_png(path)


def growth(lines: dict, what: str, axis: str) -> list[str]:
    out = []
    for label, pts in sorted(lines.items()):
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        if y0 > 0:
            out.append(f"{label}: from {axis} {x0:g} to {x1:g} ({x1 / x0:g}x) {what} went {y1 / y0:.2f}x "
                       f"({fmt(y0, 'g')} to {fmt(y1, 'g')}).")
    return out


def memory_vs_context(rows: list[dict], out: Path) -> list[str]:
    lines = lines_by(rows, "context", "memory_gb", (*SETTING, "batch"))
    if not lines:
        return ["**Missing: memory vs sequence length**: no benchmark rows measure memory at two or more contexts.", ""]
    line_plot(lines, "sequence length (tokens)", "peak memory (GB)", out / "memory_vs_context.png")
    return (["![memory vs sequence length](figures/memory_vs_context.png)", "", "Memory vs sequence length:", ""]
            + [f"- {s}" for s in growth(lines, "peak memory", "T")] + [""])


def throughput_vs_batch(rows: list[dict], out: Path) -> list[str]:
    lines = lines_by(rows, "batch", "tokens_per_s", (*SETTING, "context"))
    if not lines:
        return ["**Missing: throughput vs batch**: no benchmark rows measure throughput at two or more batch sizes.", ""]
    line_plot(lines, "batch (sequences)", "tokens/s", out / "throughput_vs_batch.png")
    dtypes = {r.get("dtype") for r in rows if isinstance(r.get("tokens_per_s"), (int, float))}
    note = ([] if "bfloat16" in dtypes else
            ["No bfloat16 row was measured here, so the mixed-precision line is **pending** (a GPU run adds it)."])
    return (["![throughput vs batch](figures/throughput_vs_batch.png)", "", *note, "Throughput vs batch:", ""]
            + [f"- {s}" for s in growth(lines, "throughput", "B")] + [""])


def before_after(runs: list[dict], out: Path) -> list[str]:
    """Bars per optimisation setting (seeds averaged): throughput, peak memory, validation loss."""
    ok = [r for r in runs if r.get("plan") == "optimizations" and r.get("status") == "ok" and r.get("kind") != "bench"]
    by: dict[str, list[dict]] = {}
    for r in ok:
        by.setdefault(re.sub(r"-s\d+$", "", r["name"]), []).append(r)
    qs = [q for q in ("tokens_per_s", "peak_memory", "max_rss_bytes", "eval_loss") if any(value(r, q) for r in ok)][:3]
    if len(by) < 2 or not qs:
        return ["**Missing: before/after**: the `optimizations` plan has fewer than two completed settings here.", ""]
    plt = _plt()
    fig, axs = plt.subplots(1, len(qs), figsize=(4.2 * len(qs), 3.8), squeeze=False)
    names = list(by)
    for ax, q in zip(axs[0], qs):
        vals = [statistics.mean([v for r in by[n] if (v := value(r, q)) is not None] or [float("nan")]) for n in names]
        ax.bar(range(len(names)), vals, color=["#888" if i == 0 else "#3a7" for i in range(len(names))])
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        title, _, lower = QUANTITIES[q]
        ax.set_title(f"{title} ({'lower' if lower else 'higher'} is better)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "before_after.png", dpi=80)
    plt.close(fig)
    shrink_png(out / "before_after.png")
    return [f"![before and after](figures/before_after.png)", "",
            f"Before/after: the `optimizations` plan's settings (grey: `{names[0]}`, the first in the plan), mean over seeds.", ""]


def required(runs: list[dict], out: Path) -> list[str]:
    out = Path(out) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    rows = bench_rows(runs)
    return (["### The required plots", ""] + memory_vs_context(rows, out) + throughput_vs_batch(rows, out)
            + before_after(runs, out))
