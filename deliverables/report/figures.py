"""The written report's numbered figures, drawn from the committed records and the compiled store.

    python -m deliverables.report.figures [--results docs/results] [--out docs/report/figures]

Each figure holds one unit family and one source per line: no line joins two studies, two models or two
compilers. Captions are the report's own (docs/report/report.md); `FIGURES` names what each one draws.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from deliverables.report.charts import before_after, bench_rows, lines_by, natural
from deliverables.report.divergence import edge
from deliverables.report.output import pyplot, report_dir, shrink_png
from experiments.results import load_results
from jaxlm import cli

RESULTS, OUT = Path("docs/results"), Path("docs/report/figures")
MIB, GIB = 2**20, 2**30
FIGURES = {
    "fig1_memory_vs_context.png": "compiled memory of the profiling plan's steps against context, MiB, per source",
    "fig2_throughput_vs_batch.png": "CPU-measured tokens/s against batch, a line per study and model",
    "fig3_before_after.png": "the optimizations plan's techniques against float32 on the CPU, 95 % intervals",
    "fig4_h100_compiled.png": "the H100-compiled plans: techniques on `small` and the chunked loss, GiB",
    "fig5_lr_sweep.png": "final validation loss against the peak learning rate, every seed, by outcome",
}


def plan_runs(root: Path, plan: str) -> list[dict]:
    where = root / plan / "records"
    return load_results(where) if where.is_dir() else []


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    shrink_png(path)


def _lines(ax, lines: dict, xlabel: str, ylabel: str) -> None:
    for label, pts in sorted(lines.items(), key=lambda kv: natural(kv[0])):
        xs, ys, es = zip(*pts)
        ax.errorbar(xs, ys, yerr=es if any(es) else None, marker="o", capsize=3, label=label)
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set(xlabel=xlabel, ylabel=ylabel, yscale="log")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def memory_vs_context(root: Path, path: Path) -> None:
    """Figure 1: each memory source of the profiling plan (XLA:CPU estimate, H100-compiled plan) its own line."""
    from deliverables.report.bench import memory_source

    rows = [r for r in bench_rows(plan_runs(root, "profiling")) if r.get("remat") in (None, "none")
            and r.get("mode") == "train_step"]
    y = lambda r: (r["memory_gb"] * 1e9 / MIB, 0.0, memory_source(r)) if r.get("memory_gb") else None  # noqa: E731
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    _lines(ax, lines_by(rows, "context", "batch", y), "context T (tokens)", "train-step memory (MiB)")
    _save(fig, path)


def throughput_vs_batch(root: Path, path: Path) -> None:
    """Figure 2: CPU tokens/s against batch; each study (plan) and model its own line."""
    rows = [r for plan in ("profiling", "optimizations", "benchmarking") for r in bench_rows(plan_runs(root, plan))
            if r.get("device") == "cpu" and r.get("mode") == "train_step"]

    def y(r):
        tok, step, ci = r.get("tokens_per_s"), r.get("step_ms"), r.get("step_ms_ci95")
        return (tok / 1e3, tok * ci / step / 1e3 if ci and step else 0.0, "CPU") if tok else None

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    _lines(ax, lines_by(rows, "batch", "context", y), "batch (sequences)", "thousand tokens/s (CPU)")
    ax.set_yscale("linear")
    _save(fig, path)


def h100_compiled(root: Path, path: Path) -> None:
    """Figure 4: (a) each memory technique on `small`, T 1024, B 8; (b) whole against chunked logits, batch 128."""
    from deliverables.compiled_memory import cached

    tech = cached("techniques-small", "h100-80gb", root / "compiled")
    chunk = cached("loss-chunk", "h100-80gb", root / "compiled")
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.6, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    labels = [k for k in tech if "window" not in k]
    a.barh(labels[::-1], [tech[k]["total_bytes"] / GIB for k in labels[::-1]], color="#4a7")
    a.set(xlabel="GiB per GPU (compiled plan)", title="(a) small, context 1024, batch 8")
    kinds = [k.split(", whole")[0] for k in chunk if k.endswith("whole logits, batch 128")
             and f"{k.split(', whole')[0]}, chunked, batch 128" in chunk]
    top = len(kinds) - 1  # the first setting at the top, as in (a)
    for i, (kind, colour) in enumerate((("whole logits", "#c77"), ("chunked", "#47a"))):
        vals = [chunk[f"{k}, {kind}, batch 128"]["total_bytes"] / GIB for k in kinds]
        b.barh([top - j + 0.2 - 0.4 * i for j in range(len(kinds))], vals, height=0.4, color=colour, label=kind)
    b.set_yticks([top - j for j in range(len(kinds))], kinds)
    b.set(xlabel="GiB per GPU (compiled plan)", title="(b) 4 layers, GPT-2 vocabulary, B 128")
    b.legend(fontsize=7, loc="lower right")
    for ax in (a, b):
        ax.title.set_fontsize(9)
        ax.tick_params(labelsize=8)
    _save(fig, path)


def lr_sweep(root: Path, path: Path) -> None:
    """Figure 5: every seed's final validation loss against the rate, coloured by its outcome; non-finite at the top."""
    runs = plan_runs(root, "lr_sweep")
    by: dict[float, list[dict]] = {}
    for r in runs:
        if isinstance((r.get("axes") or {}).get("optim.lr"), (int, float)):
            by.setdefault(float(r["axes"]["optim.lr"]), []).append(r)
    vocab = ((runs[0].get("config") or {}).get("model") or {}).get("vocab_size") if runs else None
    untrained = math.log(vocab) if vocab else math.inf
    e = edge(sorted(by.items()), untrained)
    colours = {"trained": "#3a7", "failed": "#e90", "diverged": "#c33"}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for kind, colour in colours.items():
        pts = [(x, (r.get("metrics") or {}).get("eval_loss")) for x, rs in by.items()
               for r, k in zip(rs, e["kinds"][x]) if k == kind]
        pts = [(x, v if isinstance(v, (int, float)) and math.isfinite(v) else untrained) for x, v in pts]
        if pts:
            ax.scatter(*zip(*pts), color=colour, label={"failed": "failed to learn"}.get(kind, kind), s=18)
    ax.axhline(untrained, color="#888", lw=0.8, ls="--", label="ln V (untrained; non-finite runs drawn here)")
    ax.axhline(e["best_loss"] + 0.5, color="#e90", lw=0.8, ls=":", label="best + 0.5 nats")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)


def draw(root: Path, out: Path) -> list[Path]:
    report_dir(out)
    memory_vs_context(root, out / "fig1_memory_vs_context.png")
    throughput_vs_batch(root, out / "fig2_throughput_vs_batch.png")
    before_after([*plan_runs(root, "optimizations")], out, "fig3_before_after.png")
    h100_compiled(root, out / "fig4_h100_compiled.png")
    lr_sweep(root, out / "fig5_lr_sweep.png")
    return [out / name for name in FIGURES]


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.report.figures", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the committed records, a folder per plan")
    p.add_argument("--out", type=Path, default=OUT, help="where the PNGs go")
    args = p.parse_args(argv)
    print("\n".join(str(x) for x in draw(args.results, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
