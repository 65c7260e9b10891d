"""Line figures of benchmark rows (a line never joins two studies, models, settings or memory sources), and the
optimisation runs' before/after that the written report's figure 4 draws; intervals are 95 %."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from deliverables.report.bench import bench_rows as tagged_bench_rows
from deliverables.report.bench import row_stats
from deliverables.report.format import fmt
from deliverables.report.noise import Family, judged
from deliverables.report.output import pyplot, save_figure
from deliverables.report.seeds import Stats, resolved

SETTING = ("mode", "dtype", "attention", "remat")  # the fields named in a line's label


def bench_rows(runs: list[dict]) -> list[dict]:
    return [row for row in tagged_bench_rows(runs) if row.get("status") == "ok"]


def line_label(row: dict, fixed: str, where: str) -> str:
    """'246k params, train_step float32, B=16 (cpu)': the model, the setting, the fixed axis, the device."""
    setting = " ".join([str(row[k]) for k in SETTING if row.get(k) not in (None, "xla", "none")]
                       + ([row["compute_set"]] if row.get("compute_set") else []))
    model = f"{fmt(row['params'], 'count')} params, " if row.get("params") else ""
    study = f"{row['plan']}: " if row.get("plan") else ""
    return f"{study}{model}{setting}, {fixed}={row.get(fixed)} ({where})"


def lines_by(rows: list[dict], x: str, fixed: str, y) -> dict[str, list[tuple[float, float, float]]]:
    """label -> sorted (x, y, 95 % half-width) points; `y(row)` gives (value, half-width, where) or None.
    A line per model, setting, `fixed` value and source, kept when it has two or more x values. Where two runs
    measured the same point of a line (a context sweep's batch 4 inside a batch sweep), each run is its own line
    (", run NAME"): two measurements are never averaged into one point."""
    groups: dict[str, dict[float, dict[str, list[tuple[float, float]]]]] = {}
    for r in rows:
        got = y(r)
        if isinstance(r.get(x), (int, float)) and got is not None and math.isfinite(got[0]):
            by_x = groups.setdefault(line_label(r, fixed, got[2]), {})
            by_x.setdefault(float(r[x]), {}).setdefault(str(r.get("run")), []).append(got[:2])
    mean = statistics.fmean
    out = {}
    for label, by_x in groups.items():
        apart = any(len(runs) > 1 for runs in by_x.values())
        for run in sorted({n for runs in by_x.values() for n in runs}) if apart else [None]:
            pts = {a: [p for n, ps in runs.items() if run in (None, n) for p in ps] for a, runs in by_x.items()}
            pts = {a: ps for a, ps in pts.items() if ps}
            if len(pts) >= 2:
                out[f"{label}, run {run}" if apart else label] = sorted(
                    (a, mean(v for v, _ in ps), mean(e for _, e in ps)) for a, ps in pts.items())
    return out


def natural(label: str) -> list:
    """Sort key that orders 'context=64' before 'context=128'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label)]


def _memory(row: dict) -> tuple[float, float, str] | None:
    """(GB, no interval: a plan or a peak is one exact figure, where from): a GPU compiler's plan (`total_gb` of a
    --target row), else the row's memory figure."""
    if isinstance(row.get("total_gb"), (int, float)):
        device = str(row.get("device") or "a GPU").split(" (")[0]  # a target's label: "compiled for NAME (...)"
        return row["total_gb"], 0.0, device if device.startswith("compiled for") else f"compiled for {device}"
    if isinstance(row.get("memory_gb"), (int, float)):
        return row["memory_gb"], 0.0, str(row.get("memory_source") or "measured")
    return None


def _throughput(row: dict) -> tuple[float, float, str] | None:
    """Tokens/s with the 95 % half-width carried over from the step time (tokens/s = B·T / step time)."""
    tok, step, ci = row.get("tokens_per_s"), row.get("step_ms"), row.get("step_ms_ci95")
    if not isinstance(tok, (int, float)):
        return None
    return tok, tok * ci / step if isinstance(ci, (int, float)) and step else 0.0, str(row.get("device") or "?").upper()


# The line figures of benchmark rows: name -> (x, the axis held fixed per line, y of a row, x label, y label).
BENCH_FIGURES = {
    "memory_vs_context.png": ("context", "batch", _memory, "sequence length (tokens)", "peak memory (GB)"),
    "memory_vs_batch.png": ("batch", "context", _memory, "batch (sequences)", "peak memory (GB)"),
    "throughput_vs_batch.png": ("batch", "context", _throughput, "batch (sequences)", "tokens/s"),
}


def bench_figures(rows: list[dict], out: Path) -> list[str]:
    """The memory and throughput figures that benchmark rows support (a line per model, setting and fixed axis,
    with two or more points), written into `out`; their file names."""
    rows = [r for r in rows if r.get("status") == "ok"]
    written = []
    for name, (x, fixed, y, xlabel, ylabel) in BENCH_FIGURES.items():
        lines = lines_by(rows, x, fixed, y)
        if not lines:
            continue
        fig, ax = pyplot().subplots(figsize=(7, 4.2))
        for label, pts in sorted(lines.items(), key=lambda kv: natural(kv[0])):
            xs, ys, es = zip(*pts)
            ax.errorbar(xs, ys, yerr=es if any(es) else None, marker="o", capsize=3, label=label)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{ylabel} vs {xlabel.split(' (')[0]}, a line per model and setting")
        ax.title.set_fontsize(9)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        save_figure(fig, out / name, 80)
        written.append(name)
    return written


BEFORE_AFTER = ("tokens_per_s", "memory_gb", "step_ms")  # the quantities of a before/after bar


def before_after_bars(runs: list[dict]) -> dict[str, dict[str, Stats]]:
    """technique -> {quantity: Stats}: the `optimizations` plan's before_after_* bench rows (over their timed steps),
    else its training runs (over seeds, batch sizes pooled per technique)."""
    plan = [r for r in runs if r.get("plan") == "optimizations" and r.get("status") == "ok"]
    bars: dict[str, dict[str, Stats]] = {}
    for row in bench_rows([r for r in plan if r["name"].startswith("before_after")]):
        label = re.sub(r"^before_after_", "", row["run"])
        bars[label] = {q: st for q in BEFORE_AFTER if (st := row_stats(row, q))}
    if bars:
        return bars
    pooled: dict[str, dict[str, list[float]]] = {}
    for r in plan:
        if r.get("kind") == "bench":
            continue
        label = str((r.get("axes") or {}).get("technique") or re.sub(r"(-s\d+)?$", "", r["name"]))
        m = r.get("metrics") or {}
        mem = m.get("peak_memory") or r.get("max_rss_bytes")
        for q, v in (("tokens_per_s", m.get("tokens_per_s")), ("memory_gb", mem and mem / 1e9),
                     ("step_ms", (m.get("step_time") or 0) * 1e3 or None)):
            if v is not None:
                pooled.setdefault(label, {}).setdefault(q, []).append(v)
    return {k: {q: Stats.of(v, (k, q)) for q, v in qs.items()} for k, qs in pooled.items()}


def judged_bars(bars: dict, names: list[str], qs: list[str]) -> tuple[dict[tuple[str, str], bool | None], Family]:
    """{(technique, quantity): beyond noise?} of each bar against the first (Welch, Holm over them all), the family."""
    base = bars[names[0]]
    pairs = [(n, q) for n in names[1:] for q in qs if bars[n].get(q) and base.get(q)]
    return judged(lambda noise: {(n, q): resolved(bars[n][q], base[q], noise) for n, q in pairs})
