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

from experiments.report.format import fmt, pct_change, value
from experiments.report.output import pyplot, shrink_png

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
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, pts in sorted(lines.items(), key=lambda kv: natural(kv[0])):
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


def growth(lines: dict, what: str, axis: str, show) -> list[str]:
    """'LABEL: from T 64 to 1024 (16x) peak memory went 45.02x (14.9 MiB to 671 MiB).' per line; `show` formats a y."""
    out = []
    for label, pts in sorted(lines.items(), key=lambda kv: natural(kv[0])):
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        if y0 > 0:
            out.append(f"{label}: from {axis} {x0:g} to {x1:g} ({x1 / x0:g}x) {what} went {y1 / y0:.2f}x "
                       f"({show(y0)} to {show(y1)}).")
    return out


def natural(label: str) -> list:
    """Sort key that orders 'context=64' before 'context=128'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label)]


def memory_vs_context(rows: list[dict], out: Path) -> list[str]:
    lines = lines_by(rows, "context", "memory_gb", (*SETTING, "batch"))
    if not lines:
        return ["**Missing: memory vs sequence length**: no benchmark rows measure memory at two or more contexts.", ""]
    sources = sorted({str(r["memory_source"]) for r in rows if r.get("memory_gb") is not None and r.get("memory_source")})
    named = f" ({', '.join(sources)})" if sources else ""
    line_plot(lines, "sequence length (tokens)", f"peak memory (GB){named}", out / "memory_vs_context.png")
    return (["![memory vs sequence length](figures/memory_vs_context.png)", "",
             f"Memory vs sequence length, memory as the benchmark measured it{named}:", ""]
            + [f"- {s}" for s in growth(lines, "peak memory", "T", lambda gb: fmt(gb * 1e9, "bytes"))] + [""])


def throughput_vs_batch(rows: list[dict], out: Path) -> list[str]:
    lines = lines_by(rows, "batch", "tokens_per_s", (*SETTING, "context"))
    if not lines:
        return ["**Missing: throughput vs batch**: no benchmark rows measure throughput at two or more batch sizes.", ""]
    line_plot(lines, "batch (sequences)", "tokens/s", out / "throughput_vs_batch.png")
    dtypes = {r.get("dtype") for r in rows if isinstance(r.get("tokens_per_s"), (int, float))}
    note = ([] if "bfloat16" in dtypes else
            ["No bfloat16 row was measured here, so the mixed-precision line is **pending** (a GPU run adds it)."])
    return (["![throughput vs batch](figures/throughput_vs_batch.png)", "", *note, "Throughput vs batch:", ""]
            + [f"- {s}" for s in growth(lines, "throughput", "B", lambda v: fmt(v, "count") + " tokens/s")] + [""])


BEFORE_AFTER = (("tokens_per_s", "tokens/s", False), ("memory_gb", "peak memory (GB)", True), ("step_ms", "step time (ms)", True))


def before_after_bars(runs: list[dict]) -> dict[str, dict[str, float]]:
    """technique -> {quantity: value}: the `optimizations` plan's before_after_* bench rows, else its training runs
    (seeds and batch sizes averaged per technique)."""
    plan = [r for r in runs if r.get("plan") == "optimizations" and r.get("status") == "ok"]
    bars: dict[str, dict[str, list[float]]] = {}
    for r in plan:
        label = str((r.get("axes") or {}).get("technique") or re.sub(r"(_b\d+)?(-s\d+)?$", "", r["name"]))
        if r["name"].startswith("before_after"):
            for row in r.get("bench_rows") or []:
                for q, _, _ in BEFORE_AFTER:
                    if row.get("status") == "ok" and isinstance(row.get(q), (int, float)):
                        bars.setdefault(label, {}).setdefault(q, []).append(float(row[q]))
    if not bars:  # no bench before/after: the training runs' throughput, memory and step time
        for r in plan:
            label = str((r.get("axes") or {}).get("technique") or re.sub(r"(-s\d+)?$", "", r["name"]))
            mem = value(r, "peak_memory") or value(r, "max_rss_bytes")
            for q, v in (("tokens_per_s", value(r, "tokens_per_s")), ("memory_gb", mem and mem / 1e9),
                         ("step_ms", (value(r, "step_time") or 0) * 1e3 or None)):
                if r.get("kind") != "bench" and v is not None:
                    bars.setdefault(label, {}).setdefault(q, []).append(v)
    return {k: {q: statistics.mean(v) for q, v in qs.items()} for k, qs in bars.items()}


def before_after(runs: list[dict], out: Path) -> list[str]:
    bars = before_after_bars(runs)
    qs = [(q, t, lower) for q, t, lower in BEFORE_AFTER if sum(q in b for b in bars.values()) >= 2]
    if len(bars) < 2 or not qs:
        return ["**Missing: before/after**: the `optimizations` plan has fewer than two completed settings here.", ""]
    names = sorted(bars, key=lambda n: n != "float32")  # the baseline first
    plt = pyplot()
    fig, axs = plt.subplots(1, len(qs), figsize=(4.2 * len(qs), 3.8), squeeze=False)
    for ax, (q, title, lower) in zip(axs[0], qs):
        ax.bar(range(len(names)), [bars[n].get(q, float("nan")) for n in names],
               color=["#888" if i == 0 else "#3a7" for i in range(len(names))])
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"{title}, {'lower' if lower else 'higher'} is better", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "before_after.png", dpi=80)
    plt.close(fig)
    shrink_png(out / "before_after.png")
    base, lines = bars[names[0]], []
    for n in names[1:]:
        parts = [f"{t} {p:+.0f}%" for q, t, _ in qs if (p := pct_change(bars[n].get(q), base.get(q))) is not None]
        if parts:
            lines.append(f"- {n}: " + ", ".join(parts))
    return ["![before and after](figures/before_after.png)", "",
            f"Before/after: each technique of the `optimizations` plan against `{names[0]}` (grey), change in %:", "",
            *lines, ""]


def required(runs: list[dict], out: Path) -> list[str]:
    out = Path(out) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    rows = bench_rows(runs)
    return (["### The required plots", ""] + memory_vs_context(rows, out) + throughput_vs_batch(rows, out)
            + before_after(runs, out))
