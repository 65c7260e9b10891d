"""Write a plan's Markdown report: `python -m experiments.report runs/PLAN [--out DIR]`.

Everything in the report is computed from the runs' result.json, metrics.jsonl and
bench JSON: tables of final metrics with percentage changes against the plan's
baseline, sentences generated from those numbers, learning curves by step and by
wall time, metric-versus-axis plots, and the bench package's plots for bench runs.
How a plan is presented comes from its `[report]` table (saved in runs/PLAN/plan.json):

- `baseline = { axis = "label" }`: compare every run with the run that has this
  label on `axis` and the same value on every other axis;
- `x = "axis"` (with `logx`): plot `y` (default eval_loss, eval_acc) against that axis;
- `bench_baseline = { field = value }`: the same comparison between bench rows.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Any

from experiments.plan import format_value
from experiments.results import load_results, read_metrics, series
from jaxlm import cli
from jaxlm.errors import DataError, UsageError
from jaxlm.extras import require
from jaxlm.files import read_json, writable_dir_problem

# Quantity -> (column title, formatter, lower is better?)
QUANTITIES: dict[str, tuple[str, str, bool]] = {
    "params": ("params", "count", True),
    "steps": ("steps", "int", True),
    "tokens": ("tokens", "count", True),
    "train_loss": ("train loss", "f3", True),
    "eval_loss": ("val loss", "f3", True),
    "eval_ppl": ("val ppl", "f2", True),
    "eval_acc": ("val acc", "pct", False),
    "tokens_per_s": ("tokens/s", "count", False),
    "step_time": ("step time", "sec", True),
    "wall_time_s": ("total time", "sec", True),
    "peak_memory": ("peak device memory", "bytes", True),
    "max_rss_bytes": ("peak host RSS", "bytes", True),
}
RUN_LEVEL = ("wall_time_s", "max_rss_bytes")  # measured by the runner, not read from metrics.jsonl
# The metrics compared against the baseline, in the order sentences are written.
COMPARED = ("peak_memory", "max_rss_bytes", "step_time", "tokens_per_s", "wall_time_s", "eval_ppl")
NAMES = {
    "peak_memory": "peak device memory",
    "max_rss_bytes": "peak host memory (RSS)",
    "step_time": "step time",
    "tokens_per_s": "throughput",
    "wall_time_s": "total time",
    "eval_ppl": "validation perplexity",
    "eval_loss": "validation loss",
    "eval_acc": "validation accuracy",
}


def fmt(v: Any, how: str = "g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, str):
        return v
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if how == "count":
        for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(v) >= scale:
                return f"{v / scale:.3g}{unit}"
        return f"{v:.3g}"
    if how == "bytes":
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(v) >= scale:
                return f"{v / scale:.3g} {unit}"
        return f"{v:.0f} B"
    if how == "sec":
        return f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    if how == "pct":
        return f"{100 * v:.1f}%"
    if how == "int":
        return str(int(v))
    if how == "f2":
        return f"{v:.2f}"
    if how == "f3":
        return f"{v:.3f}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def pct_change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return None
    return 100.0 * (new - old) / old


def fmt_pct(p: float | None) -> str:
    return "–" if p is None else f"{p:+.0f}%"


def table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def value(run: dict, q: str) -> float | None:
    v = run.get(q) if q in RUN_LEVEL else run.get("metrics", {}).get(q)
    if run.get("status") == "skipped":
        return None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# --------------------------------------------------------------------------- comparisons


def baseline_pairs(runs: list[dict], axis: str, base_label: Any) -> dict[Any, list[tuple[dict, dict]]]:
    """label on `axis` -> [(run, its baseline run)], matching on every other axis."""
    def rest(r):
        return tuple(sorted((k, format_value(v)) for k, v in r.get("axes", {}).items() if k != axis))

    bases = {rest(r): r for r in runs if axis in r.get("axes", {}) and format_value(r["axes"][axis]) == format_value(base_label)}
    pairs: dict[Any, list] = {}
    for r in runs:
        label = r.get("axes", {}).get(axis)
        if label is None or format_value(label) == format_value(base_label) or rest(r) not in bases:
            continue
        pairs.setdefault(label, []).append((r, bases[rest(r)]))
    return pairs


def change_phrase(quantity: str, changes: list[tuple[float, str]]) -> str | None:
    """'cut peak memory by 43% (median of 3, -45% to -40%)' from [(percent change, where), ...]."""
    if not changes:
        return None
    ps = [p for p, _ in changes]
    med = statistics.median(ps)
    name = NAMES.get(quantity, quantity)
    spread = "" if len(ps) == 1 else f" (median of {len(ps)}, {min(ps):+.0f}% to {max(ps):+.0f}%)"
    if abs(med) < 0.5:
        return f"left {name} unchanged{spread}"
    return f"{'raised' if med > 0 else 'cut'} {name} by {abs(med):.0f}%{spread}"


def describe_changes(subject: str, against: str, phrases: list[str]) -> str | None:
    """'bfloat16 against float32 at batch 32, 64, 128: cut peak memory by 43%, raised ...'."""
    phrases = [p for p in phrases if p]
    return f"{subject} against {against}: " + "; ".join(phrases) + "." if phrases else None


def axis_label(axis: str, label: Any) -> str:
    """A bundle label reads on its own ('bfloat16'); a bare number needs its axis ('optim.lr=0.01')."""
    return format_value(label) if isinstance(label, str) else f"{axis}={format_value(label)}"


def comparison_sentences(runs: list[dict], baseline: dict) -> list[str]:
    """Sentences comparing each variant with the baseline; only completed (ok) runs take part."""
    runs = [r for r in runs if r.get("status") == "ok"]
    out = []
    for axis, base_label in baseline.items():
        for label, pairs in baseline_pairs(runs, axis, base_label).items():
            phrases = []
            for q in COMPARED:
                changes = [(p, "") for r, b in pairs if (p := pct_change(value(r, q), value(b, q))) is not None]
                phrases.append(change_phrase(q, changes))
            others: dict[str, set] = {}
            for r, _ in pairs:
                for k, v in r["axes"].items():
                    if k != axis:
                        others.setdefault(k, set()).add(v)
            where = "; ".join(f"{k}={', '.join(format_value(v) for v in sorted(vs, key=lambda v: (isinstance(v, str), v)))}" for k, vs in others.items())
            where = f" at {where}" if where else ""
            s = describe_changes(axis_label(axis, label), axis_label(axis, base_label) + where, phrases)
            if s:
                out.append(s)
    return out


def status_sentences(runs: list[dict]) -> list[str]:
    counts: dict[str, list[str]] = {}
    for r in runs:
        counts.setdefault(r.get("status", "?"), []).append(r["name"])
    out = [f"{len(runs)} run{'s' * (len(runs) != 1)}: " + ", ".join(f"{len(v)} {k}" for k, v in counts.items()) + "."]
    for r in runs:
        if r.get("status") in ("diverged", "failed", "skipped"):
            out.append(f"`{r['name']}` {r['status']}: {r.get('reason') or 'no reason recorded'}.")
    return out


def xfmt(v: float) -> str:
    return fmt(v, "count") if abs(v) >= 1e4 else format_value(int(v) if float(v).is_integer() else v)


def x_value(run: dict, x: str) -> float | None:
    """The run's value on the x axis: a numeric grid axis, else a final metric such as `params`."""
    v = run.get("axes", {}).get(x)
    if v is None:
        v = run.get("metrics", {}).get(x)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def sweep_sentences(runs: list[dict], x: str | None) -> list[str]:
    """Best run by validation loss, and how the final validation loss moves along the x axis."""
    ok = [r for r in runs if r.get("status") == "ok" and value(r, "eval_loss") is not None and math.isfinite(value(r, "eval_loss"))]
    if not ok:
        return []
    best = min(ok, key=lambda r: value(r, "eval_loss"))
    out = [f"Lowest validation loss: {value(best, 'eval_loss'):.3f} (perplexity {fmt(value(best, 'eval_ppl'), 'f2')}) from `{best['name']}`."]
    if x:
        pts = sorted(((x_value(r, x), r) for r in ok if x_value(r, x) is not None), key=lambda t: t[0])
        if len(pts) >= 2:
            (x0, r0), (x1, r1) = pts[0], pts[-1]
            l0, l1 = value(r0, "eval_loss"), value(r1, "eval_loss")
            direction = "fell" if l1 < l0 else "rose"
            losses = [value(r, "eval_loss") for _, r in pts]
            steps = [b - a for a, b in zip(losses, losses[1:])]
            shape = ("at every step along the axis" if all((d < 0) == (l1 < l0) for d in steps)
                     else f"not monotonically: lowest at {x}={xfmt(pts[losses.index(min(losses))][0])}")
            out.append(f"From {x}={xfmt(x0)} to {x}={xfmt(x1)} the validation loss {direction} from {l0:.3f} to {l1:.3f} "
                       f"({fmt_pct(pct_change(l1, l0))}), {shape}.")
            a0, a1 = value(r0, "eval_acc"), value(r1, "eval_acc")
            if a0 is not None and a1 is not None:
                out.append(f"Validation accuracy went from {fmt(a0, 'pct')} to {fmt(a1, 'pct')} over the same range.")
    return out


# --------------------------------------------------------------------------- tables


def train_table(runs: list[dict], baseline: dict) -> str:
    axes = list(dict.fromkeys(k for r in runs for k in r.get("axes", {})))
    cols = [q for q in QUANTITIES if any(value(r, q) is not None for r in runs)]
    base_of: dict[str, dict] = {}
    for axis, label in baseline.items():
        for _, pairs in baseline_pairs([r for r in runs if r.get("status") == "ok"], axis, label).items():
            for r, b in pairs:
                base_of[r["name"]] = b
    deltas = [q for q in ("eval_ppl", "wall_time_s", "peak_memory", "max_rss_bytes") if q in cols] if base_of else []
    headers = ["run", *axes, "status", *(QUANTITIES[q][0] for q in cols), *(f"Δ {QUANTITIES[q][0]}" for q in deltas)]
    rows = []
    for r in runs:
        row = [f"`{r['name']}`", *(format_value(r.get("axes", {}).get(a, "")) for a in axes), r.get("status", "?")]
        row += [fmt(value(r, q), QUANTITIES[q][1]) for q in cols]
        b = base_of.get(r["name"])
        row += [fmt_pct(pct_change(value(r, q), value(b, q))) if b else "base" if r["name"] in {x["name"] for x in base_of.values()} else "" for q in deltas]
        rows.append(row)
    return table(headers, rows)


# Bench row fields shown in the table (jaxlm.bench.core.COLUMNS), with formats.
BENCH_COLUMNS: list[tuple[str, str, str]] = [
    ("framework", "framework", "g"),
    ("mode", "mode", "g"),
    ("dtype", "dtype", "g"),
    ("attention", "attention", "g"),
    ("remat", "remat", "g"),
    ("context", "context", "int"),
    ("batch", "batch", "int"),
    ("status", "status", "g"),
    ("step (ms)", "step_ms", "g"),
    ("± std", "step_ms_std", "g"),
    ("median (ms)", "step_ms_median", "g"),
    ("tokens/s", "tokens_per_s", "count"),
    ("TFLOP/s", "tflops", "g"),
    ("MFU", "mfu", "pct"),
    ("memory (GB)", "memory_gb", "g"),
    ("memory from", "memory_source", "g"),
    ("params", "params", "count"),
]
# Row fields that are measurements (everything else identifies the setting).
BENCH_MEASURED = {"status", "compile_s", "step_ms", "step_ms_std", "step_ms_median", "tokens_per_s", "flops_per_step", "xla_flops", "tflops", "mfu",
                  "memory_gb", "memory_source", "estimate_gb", "jax_torch_speed", "device", "error", "traceback", "run", "max_batch"}
BENCH_COMPARED = {"memory_gb": "peak memory", "step_ms": "step time", "tokens_per_s": "throughput"}


def bench_rows(runs: list[dict]) -> list[dict]:
    rows = []
    for r in runs:
        for row in r.get("bench_rows") or []:
            rows.append({"run": r["name"], **row})
    return rows


def bench_table(rows: list[dict]) -> str:
    cols = [(t, k, how) for t, k, how in BENCH_COLUMNS if any(r.get(k) is not None for r in rows)]
    # Columns with one value throughout say nothing per row: state them once above the table instead.
    varying = [(t, k, how) for t, k, how in cols if len({str(r.get(k)) for r in rows}) > 1 or k in ("step_ms", "memory_gb", "tokens_per_s", "status")]
    body = []
    for r in rows:
        cells = [f"`{r['run']}`"]
        for _, k, how in varying:
            v = r.get(k)
            cells.append(fmt(v, how) if isinstance(v, (int, float)) and not isinstance(v, bool) else fmt(v))
        body.append(cells)
    fixed = [f"{t} {fmt(rows[0].get(k))}" for t, k, _ in cols if (t, k, _) not in varying]
    head = f"All rows: {', '.join(fixed)}.\n\n" if fixed else ""
    return head + table(["run", *(t for t, _, _ in varying)], body)


def max_batch_table(runs: list[dict]) -> str | None:
    found = [(r["name"], f) for r in runs for f in r.get("bench_max_batch") or []]
    if not found:
        return None
    return table(["run", "setting", "context", "max batch"], [[f"`{n}`", f["setting"], str(f["context"]), str(f["max_batch"])] for n, f in found])


def bench_value(row: dict, q: str):
    """A bench measurement; step time is the median where the row has one (robust to a busy machine)."""
    if q == "step_ms" and isinstance(row.get("step_ms_median"), (int, float)):
        return row["step_ms_median"]
    return row.get(q)


def bench_sentences(rows: list[dict], baseline: dict) -> list[str]:
    """Compare bench rows that differ only in the baseline field (e.g. dtype), metric by metric."""
    ok = [r for r in rows if r.get("status") == "ok"]
    out = []
    for field, base in baseline.items():
        def key(r):
            return tuple(sorted((k, str(v)) for k, v in r.items() if k not in BENCH_MEASURED and k != field and not isinstance(v, (list, dict))))

        bases = {key(r): r for r in ok if str(r.get(field)) == str(base)}
        by_label: dict[str, list] = {}
        for r in ok:
            if field in r and str(r[field]) != str(base) and key(r) in bases:
                by_label.setdefault((str(r[field]), r.get("mode")), []).append((r, bases[key(r)]))
        for (label, mode), pairs in by_label.items():
            phrases = []
            for q, title in BENCH_COMPARED.items():
                NAMES.setdefault(q, title)
                changes = [(p, "") for r, b in pairs
                           if isinstance(bench_value(r, q), (int, float)) and isinstance(bench_value(b, q), (int, float))
                           and (p := pct_change(float(bench_value(r, q)), float(bench_value(b, q)))) is not None]
                phrases.append(change_phrase(q, changes))
            shapes = sorted({(r.get("context"), r.get("batch")) for r, _ in pairs})
            listed = ", ".join(f"T={t} B={b}" for t, b in shapes[:6]) + (", ..." if len(shapes) > 6 else "")
            where = f" ({len(pairs)} row pair{'s' * (len(pairs) > 1)} at {listed})"
            s = describe_changes(f"{mode}: {field}={label}", f"{field}={base}{where}", phrases)
            if s:
                out.append(s)
    return out


def bench_scaling_sentences(rows: list[dict]) -> list[str]:
    """How memory and throughput grow along context and batch, per setting (ok rows only)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    out = []
    for axis, other in (("context", "batch"), ("batch", "context")):
        groups: dict[tuple, dict] = {}
        for r in ok:
            key = tuple((k, str(v)) for k, v in sorted(r.items()) if k not in BENCH_MEASURED and k not in (axis, "params", "flops_per_step", "compiled") and not isinstance(v, (list, dict)))
            groups.setdefault(key, {})[r[axis]] = r
        for key, by_x in groups.items():
            if len(by_x) < 3:
                continue
            xs = sorted(by_x)
            a, b = by_x[xs[0]], by_x[xs[-1]]
            k = dict(key)
            parts = []
            if a.get("memory_gb") and b.get("memory_gb"):
                parts.append(f"memory grew {b['memory_gb'] / a['memory_gb']:.1f}x ({fmt(a['memory_gb'] * 1e9, 'bytes')} to {fmt(b['memory_gb'] * 1e9, 'bytes')})")
            if a.get("tokens_per_s") and b.get("tokens_per_s"):
                parts.append(f"throughput changed {b['tokens_per_s'] / a['tokens_per_s']:.2f}x ({fmt(a['tokens_per_s'], 'count')} to {fmt(b['tokens_per_s'], 'count')} tokens/s)")
            if parts:
                out.append(f"{k.get('mode')} {k.get('dtype')}{'' if k.get('attention') in (None, 'xla') else ' ' + k['attention']}"
                           f"{'' if k.get('remat') in (None, 'none') else ' remat=' + k['remat']}, {other} {k.get(other)}: from {axis} {xs[0]} to {xs[-1]} "
                           f"({xs[-1] / xs[0]:.0f}x) " + " and ".join(parts) + ".")
    return out


# --------------------------------------------------------------------------- plots


def _plt():
    require("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    return plt


def shrink_png(path: Path, colours: int = 96) -> None:
    """Re-encode a plot with an adaptive palette: line plots keep their look at a third of the bytes."""
    from PIL import Image

    with Image.open(path) as im:
        if im.mode == "P":
            return
        small = im.convert("RGB").quantize(colours, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def plot_curves(runs: list[dict], out: Path) -> list[str]:
    """Learning curves (train and validation loss) by step and by wall time; returns the PNG names."""
    curves = []
    for r in runs:
        recs = read_metrics(Path(r["_dir"]) / "metrics.jsonl")
        if recs:
            label = r["name"] if r.get("status") == "ok" else f"{r['name']} ({r.get('status')})"
            curves.append((label, recs, r.get("status") == "ok"))
    # Diverged curves can reach 1e6: scale the axes to the completed runs and let those leave the plot.
    tops = {q: [v for _, recs, ok in curves if ok for v in series(recs, q)[1] if math.isfinite(v)] for q in ("train_loss", "eval_loss")}
    if not curves:
        return []
    plt = _plt()
    written = []
    for by, name in (("step", "curves_by_step.png"), ("time", "curves_by_time.png")):
        fig, axs = plt.subplots(1, 2, figsize=(11, 4))
        for label, recs, _ in curves:
            for ax, q in zip(axs, ("train_loss", "eval_loss")):
                steps, vals, times = series(recs, q)
                xs = steps if by == "step" else times
                pts = [(a, b) for a, b in zip(xs, vals) if math.isfinite(b) and math.isfinite(a)]
                if pts:
                    ax.plot(*zip(*pts), marker="o" if q == "eval_loss" else None, ms=3, lw=1.2, label=label)
        for ax, q in zip(axs, ("train_loss", "eval_loss")):
            if tops[q]:
                lo, hi = min(tops[q]), max(tops[q])
                ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo) + 1e-9)
        for ax, title in zip(axs, ("training loss", "validation loss")):
            ax.set_xlabel("step" if by == "step" else "wall time since first log (s)")
            ax.set_ylabel("loss")
            ax.set_title(f"{title} by {'step' if by == 'step' else 'wall time'}")
            ax.grid(alpha=0.3)
        handles, labels = axs[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
        fig.tight_layout()
        fig.savefig(out / name, dpi=80, bbox_inches="tight")
        plt.close(fig)
        written.append(name)
    return written


def plot_vs_axis(runs: list[dict], x: str, ys: list[str], logx: bool, out: Path) -> str | None:
    """Final metrics against one axis, a line per combination of the other axes."""
    groups: dict[str, list[tuple[float, dict]]] = {}
    for r in runs:
        xv = x_value(r, x)
        if xv is None or r.get("status") not in ("ok", "diverged"):
            continue
        rest = ", ".join(f"{k}={format_value(v)}" for k, v in r.get("axes", {}).items() if k != x) or "runs"
        groups.setdefault(rest, []).append((float(xv), r))
    if not groups:
        return None
    plt = _plt()
    fig, axs = plt.subplots(1, len(ys), figsize=(5 * len(ys), 3.8), squeeze=False)
    for ax, q in zip(axs[0], ys):
        for label, pts in groups.items():
            pts = sorted((a, value(r, q)) for a, r in pts if value(r, q) is not None and math.isfinite(value(r, q)))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(QUANTITIES.get(q, (q,))[0])
        ax.grid(alpha=0.3)
    if len(groups) > 1:
        axs[0][0].legend(fontsize=7)
    fig.tight_layout()
    name = f"{x.replace('.', '_')}_vs_metrics.png"
    fig.savefig(out / name, dpi=80)
    plt.close(fig)
    return name


def plot_bench(rows: list[dict], out: Path) -> tuple[list[str], str | None]:
    """The bench package's own plots; returns (new PNG names, a note if it could not run)."""
    try:
        from jaxlm.bench import plot_results
    except ImportError as e:
        return [], f"bench plots unavailable ({e})"
    try:
        paths = plot_results([{k: v for k, v in r.items() if k != "run"} for r in rows], out)
    except Exception as e:  # a plotting failure must not lose the tables
        return [], f"bench plots failed: {type(e).__name__}: {e}"
    return [Path(p).name for p in paths or []], None


# --------------------------------------------------------------------------- the report


def write_report(plan_dir: Path, out: Path | None = None) -> Path:
    plan_dir = Path(plan_dir)
    out = Path(out) if out else plan_dir / "report"
    runs = load_results(plan_dir)
    if not runs:
        raise DataError(f"{plan_dir}: no result.json under it; run the plan first (python -m experiments.run PLAN)")
    problem = writable_dir_problem(out)
    if problem:
        raise DataError(f"{out}: cannot hold the report: {problem}")
    out.mkdir(parents=True, exist_ok=True)
    meta = read_json(plan_dir / "plan.json", default={}) or {}
    cfg = meta.get("report", {})
    name = meta.get("name", plan_dir.name)
    baseline = cfg.get("baseline", {})
    train_runs = [r for r in runs if r.get("kind") != "bench"]
    brows = bench_rows(runs)

    devices = sorted({r.get("device", "?") for r in runs if r.get("status") != "skipped"} or {"?"})
    commits = sorted({(r.get("git") or {}).get("commit") or "?" for r in runs})
    lines = [f"# {cfg.get('title', name)}", ""]
    if meta.get("description"):
        lines += [meta["description"], ""]
    plan_file = meta.get("file", name)
    try:
        plan_file = str(Path(plan_file).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        pass
    lines += [
        f"Plan `{plan_file}`, size `{meta.get('size', '?')}`, device {', '.join(devices)}, "
        f"commit {', '.join(c[:10] for c in commits)}. Generated by `python -m experiments.report {plan_dir}` "
        "from the runs' result.json / metrics.jsonl; every number and sentence below is computed from them.",
        "",
        "## Findings",
        "",
    ]
    loads = [v for r in runs for k, v in (r.get("host") or {}).items() if k.startswith("load_avg") and isinstance(v, (int, float))]
    if loads:
        cpus = max((r.get("host") or {}).get("cpus") or 0 for r in runs)
        lines.insert(-3, f"\nHost load (1-minute average) at run start/end ranged from {min(loads):.1f} to {max(loads):.1f} on {cpus} CPUs: "
                     + ("other work shared the machine, so times and throughputs are indicative only." if max(loads) > cpus else "the machine was otherwise idle.") + "\n")
    sentences = status_sentences(runs) + comparison_sentences(train_runs, baseline) + sweep_sentences(train_runs, cfg.get("x"))
    sentences += bench_sentences(brows, cfg.get("bench_baseline", {})) + bench_scaling_sentences(brows)
    for r in runs:
        for f in r.get("bench_max_batch") or []:
            limit = ((r.get("spec") or {}).get("args") or {}).get("memory_limit_gb")
            within = f"within an estimated {limit:g} GB" if limit else "before running out of device memory"
            sentences.append(f"Largest batch {within} ({r['name']}, {f['setting']}, context {f['context']}): {f['max_batch']}.")
    lines += [f"- {s}" for s in sentences] + [""]

    if train_runs:
        lines += ["## Runs", "", train_table(train_runs, baseline), ""]
        if baseline:
            lines += [f"Δ columns: change against the baseline ({', '.join(f'{k} = {format_value(v)}' for k, v in baseline.items())}) with the same other settings. "
                      "Total time is the whole process (start-up, compilation, evaluation); step time and tokens/s are medians of the logged steps after the first.", ""]
        pngs = plot_curves(train_runs, out)
        for p in pngs:
            lines += [f"![{p}]({p})", ""]
        if cfg.get("x"):
            p = plot_vs_axis(train_runs, cfg["x"], cfg.get("y", ["eval_loss", "eval_acc"]), bool(cfg.get("logx")), out)
            if p:
                lines += [f"![{p}]({p})", ""]
    if brows:
        lines += ["## Benchmarks", "", bench_table(brows), ""]
        mb = max_batch_table(runs)
        if mb:
            lines += ["Largest batch that fits (jaxlm.bench model --find-max-batch):", "", mb, ""]
        pngs, note = plot_bench(brows, out)
        if note:
            lines += [f"({note})", ""]
        for p in pngs:
            lines += [f"![{p}]({p})", ""]
    lines += ["## Reproduce", "", "```bash", f"python -m experiments.run {name} --size {meta.get('size', 'cpu')}", f"python -m experiments.report {plan_dir} --out DIR", "```", ""]
    for png in out.glob("*.png"):
        shrink_png(png)
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> int:
    from experiments import run_report

    p = cli.ArgumentParser(prog="python -m experiments.report", formatter_class=cli.HelpFormatter,
                                description="Markdown report (tables, findings, plots) for a plan's runs, "
                                "or the learning curves and a sample of one training run")
    p.add_argument("plan_dir", nargs="?", help="the plan's run directory, runs/PLAN; or one training run (metrics.jsonl + config.toml)")
    p.add_argument("--all", metavar="ROOT", help="one written report (Markdown + HTML) from every plan under ROOT (runs/ or docs/results)")
    p.add_argument("--out", help="output directory (default: PLAN_DIR/report; with --all: required)")
    run_report.add_args(p)
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else None
    if args.all:
        from experiments.written_report import write_all

        cli.check_option(args.plan_dir is None and out is not None, "--all", args.all, "takes --out DIR and no PLAN_DIR")
        path = write_all(Path(args.all), out)
    elif args.plan_dir is None:
        raise UsageError("python -m experiments.report: give PLAN_DIR, a run directory, or --all ROOT --out DIR")
    elif run_report.is_run_dir(Path(args.plan_dir)):
        path = run_report.write_run_report(Path(args.plan_dir), out, args)
    else:
        path = write_report(Path(args.plan_dir), out)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
