"""PNG figures from sweep rows (matplotlib, Agg): one figure per question, skipped when the rows lack its data.

- memory_vs_context.png: peak memory against context length, one line per setting
- memory_vs_batch.png: peak memory against batch size
- throughput_vs_batch.png: tokens/s against batch size, float32 and bfloat16 lines
- optimisation_{remat,cudnn,window,bf16}.png: before/after bars of memory and tokens/s
  for rows that differ only in that optimisation

Memory is `memory_gb` (measured, or XLA's estimate on CPU: see memory_source);
where a row has none (torch on CPU) it is left out of memory figures.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from jaxlm.core.extras import require

require("matplotlib").use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SETTING_FIELDS = ("framework", "model", "mode", "dtype", "attention", "remat", "compiled")


def _ok(rows, field):
    return [r for r in rows if r.get("status") == "ok" and r.get(field) is not None]


def _label(key: tuple, fields=SETTING_FIELDS, skip=("model", "compiled")) -> str:
    parts = [f"{v}" for f, v in zip(fields, key) if f not in skip and v not in (None, "none", True)]
    return " ".join(parts)


def _most_common(rows, field):
    counts = defaultdict(int)
    for r in rows:
        counts[r[field]] += 1
    return max(counts, key=counts.get) if counts else None


def _line_figure(rows, x: str, y: str, fixed: str, path: Path, title: str, ylabel: str, xlabel: str, logx=False):
    """One line per setting, x against y, at the most common value of `fixed`; None if < 2 x values."""
    rows = _ok(rows, y)
    at = _most_common(rows, fixed)
    rows = [r for r in rows if r[fixed] == at]
    lines = defaultdict(dict)
    for r in rows:
        lines[tuple(r.get(f) for f in SETTING_FIELDS)][r[x]] = r[y]
    lines = {k: v for k, v in lines.items() if len(v) >= 2}
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, pts in sorted(lines.items(), key=lambda kv: str(kv[0])):
        xs = sorted(pts)
        ax.plot(xs, [pts[v] for v in xs], marker="o", label=_label(key))
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title} ({fixed} = {at})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# optimisation name -> (field, is "before", is "after")
OPTIMISATIONS = {
    "remat": ("remat", lambda v: v == "none", lambda v: v not in (None, "none")),
    "cudnn": ("attention", lambda v: v == "xla", lambda v: v == "cudnn"),
    "window": ("attention", lambda v: v == "xla", lambda v: str(v).startswith("window:") or "+window:" in str(v)),
    "bf16": ("dtype", lambda v: v == "float32", lambda v: v == "bfloat16"),
}


def _optimisation_figure(rows, name: str, path: Path):
    field, before, after = OPTIMISATIONS[name]
    rest = [f for f in ("framework", "model", "mode", "dtype", "attention", "remat", "compiled", "context", "batch")
            if f != field]
    groups = defaultdict(lambda: {"before": None, "after": []})
    for r in rows:
        if r.get("status") != "ok":
            continue
        key = tuple(r.get(f) for f in rest)
        if before(r.get(field)):
            groups[key]["before"] = r
        elif after(r.get(field)):
            groups[key]["after"].append(r)
    pairs = [(k, g["before"], a) for k, g in groups.items() if g["before"] is not None for a in g["after"]]
    if not pairs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(pairs) + 4), 4.8))
    for ax, metric, ylabel in ((axes[0], "memory_gb", "peak memory (GB)"), (axes[1], "tokens_per_s", "throughput (tokens/s)")):
        shown = [(k, b, a) for k, b, a in pairs if b.get(metric) is not None and a.get(metric) is not None]
        labels = []
        for key, b, a in shown:
            k = dict(zip(rest, key))
            extra = [f"{f}={k[f]}" for f, plain in (("dtype", "float32"), ("attention", "xla"), ("remat", "none"))
                     if f in k and k[f] != plain]
            labels.append("\n".join([f"{k['framework']} {k['mode']}", f"T={k['context']} B={k['batch']}",
                                      f"{field}={a.get(field)}", *extra]))
        xs = range(len(shown))
        ax.bar([x - 0.2 for x in xs], [b[metric] for _, b, _ in shown], width=0.4,
               label=f"before ({field}={pairs[0][1].get(field)})")
        ax.bar([x + 0.2 for x in xs], [a[metric] for _, _, a in shown], width=0.4, label=f"after ({name})")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
        if shown:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no measurements", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(f"effect of {name} on memory and throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_results(rows: list[dict], out_dir) -> list[Path]:
    """Write every figure the rows support into out_dir; returns the PNG paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        _line_figure(rows, "context", "memory_gb", "batch", out / "memory_vs_context.png",
                     "peak memory vs context length", "peak memory (GB)", "context length (tokens)", logx=True),
        _line_figure(rows, "batch", "memory_gb", "context", out / "memory_vs_batch.png",
                     "peak memory vs batch size", "peak memory (GB)", "batch size (sequences)", logx=True),
        _line_figure(rows, "batch", "tokens_per_s", "context", out / "throughput_vs_batch.png",
                     "throughput vs batch size, float32 and bfloat16", "throughput (tokens/s)",
                     "batch size (sequences)", logx=True),
    ]
    for name in OPTIMISATIONS:
        written.append(_optimisation_figure(rows, name, out / f"optimisation_{name}.png"))
    return [p for p in written if p is not None]


def add_args(p) -> None:
    """`python -m jaxlm.bench plot RESULTS.json --out DIR`."""
    p.add_argument("results", help="a file written by `python -m jaxlm.bench model --json`")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the PNG files")


def main(args) -> int:
    from jaxlm.bench.output import read_rows
    from jaxlm.core.errors import DataError

    try:
        rows = read_rows(args.results)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{args.results}: cannot read benchmark rows ({type(e).__name__}: {e})") from e
    for path in plot_results(rows, args.out):
        print(path)
    return 0
