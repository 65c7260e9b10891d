"""The written report's numbered figures from the committed records and the compiled store (docs/report.md).

Each panel holds one unit family and one source per line; captions are docs/report/report.md's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from deliverables.common import plan_runs
from deliverables.compiled_memory import BATCHES, CONTEXTS, SWEPT, cached
from deliverables.compiled_time import stored
from deliverables.report.charts import before_after_bars, bench_rows, judged_bars
from deliverables.report.output import COLOURS, pyplot, report_dir, save_figure
from deliverables.report.sections.divergence import LEARNED_WITHIN, by_rate, edge, untrained_loss
from deliverables.report.seeds import group_settings
from experiments.results import read_metrics
from jaxlm import cli

RESULTS, OUT = Path("docs/results"), Path("docs/report/figures")
TARGET, GIB = "h100-80gb", 2**30
COMPILED, PREDICTED = "compiled for H100 80 GB", "predicted for H100 80 GB"
# The before/after of each technique on `small` (context 1024, batch 8): (label in the stored sections, short name).
TECHNIQUES = (("float32", "float32"), ("bfloat16", "bfloat16"), ("bfloat16 + cuDNN", "+ cuDNN attention"),
              ("bfloat16 + cuDNN + remat full", "+ cuDNN + full remat"),
              ("float32 + remat full", "float32 + full remat"))
CHUNK_BATCH = 128  # the chunked loss at the GPT-2 vocabulary: 4 layers, d_model 256, context 256
BEST_RUN = "batch_size", "b32"  # the best WikiText model: the batch-size study's batch 32 (its seeds)


def log2_axis(ax, which: str, ticks) -> None:
    """A base-2 log axis labelled at `ticks` with plain numbers (256, 0.5), no minor labels."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis.set_major_locator(FixedLocator(list(ticks)))
    axis.set_major_formatter(lambda v, _: f"{v:g}")
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _line(ax, pts: list[tuple[float, float]], *fmt: str, **kw) -> list[float]:
    """Plot the points, if any; their y values."""
    if pts:
        ax.plot(*zip(*pts), *fmt, **kw)
    return [y for _, y in pts]


def _host(runs: list[dict]) -> str:
    """'Intel Xeon, 2 cores': the CPU the runs' records name."""
    h = next((r.get("host") or {} for r in runs if r.get("host")), {})
    cpu = str(h.get("cpu_model") or "CPU").replace("(R)", "").replace(" Processor", "")
    return f"{cpu}, {h.get('cpus', '?')} cores"


def memory(axes, root: Path) -> None:
    """Figure 1: `small` compiled for an H100: (a) train-step and eval-step GiB against context, batch 8; (b)
    train-step GiB against batch, context 256."""
    ctx, bat = (cached(s, TARGET, root / "compiled") for s in ("context", "batch"))
    a, b = axes
    values = []
    for colour, label in zip(COLOURS, SWEPT):
        for mode, style in (("train_step", "-"), ("forward", ":")):
            pts = [(t, r["total_bytes"] / GIB) for t in CONTEXTS if (r := ctx.get(f"{mode}, {label}, context {t}"))]
            values += _line(a, pts, style, marker="o", ms=3, color=colour,
                            label=f"{label}, {'train step' if mode == 'train_step' else 'eval step'}")
        pts = [(n, r["total_bytes"] / GIB) for n in BATCHES if (r := bat.get(f"{label}, batch {n}"))]
        values += _line(b, pts, marker="o", ms=3, color=colour, label=label)
    a.set(xlabel="context T (tokens)", ylabel=f"GiB per GPU ({COMPILED})", title="(a) against context, batch 8")
    b.set(xlabel="batch (sequences)", ylabel=f"GiB per GPU ({COMPILED})", title="(b) train step, context 256")
    log2_axis(a, "x", CONTEXTS)
    log2_axis(b, "x", BATCHES)
    lo, hi = min(values, default=0.5), max(values, default=64)
    for ax in axes:  # the powers of two around the values, from 1/16
        log2_axis(ax, "y", [2.0**k for k in range(-4, 64) if lo / 2 <= 2.0**k <= hi * 2])


def throughput(axes, root: Path) -> None:
    """Figure 2: tokens/s of `small`'s train step against batch: (a) predicted for an H100 at context 256, a line
    per dtype/attention; (b) the profiling plan's batch sweep measured on the CPU host, 95 % intervals."""
    a, b = axes
    predicted = stored("batch", TARGET, root / "compiled")
    for colour, label in zip(COLOURS, SWEPT):
        pts = [(n, r["predicted_tokens_per_s"] / 1e3) for n in BATCHES if (r := predicted.get(f"{label}, batch {n}"))]
        _line(a, pts, marker="o", ms=3, color=colour, label=label)
    a.set(xlabel="batch (sequences)", ylabel=f"thousand tokens/s ({PREDICTED})", ylim=(0, None),
          title="(a) `small`, context 256, train step")
    log2_axis(a, "x", BATCHES)
    runs = plan_runs(root, "profiling")
    rows = sorted((r for r in bench_rows(runs) if r.get("run") == "batch_sweep" and r.get("tokens_per_s")),
                  key=lambda r: r["batch"])
    xs = [r["batch"] for r in rows]
    es = [r["tokens_per_s"] * (r.get("step_ms_ci95") or 0) / r["step_ms"] / 1e3 for r in rows]
    b.errorbar(xs, [r["tokens_per_s"] / 1e3 for r in rows], yerr=es, marker="o", ms=3, capsize=3, color=COLOURS[0],
               label="float32, measured")
    b.set(xlabel="batch (sequences)", ylabel="thousand tokens/s (measured, CPU)", ylim=(0, None),
          title=f"(b) {rows[0]['params'] / 1e3 if rows else 0:.0f}k-parameter model, context 256, {_host(runs)}")
    if xs:
        log2_axis(b, "x", xs)


def techniques(axes, root: Path) -> None:
    """Figure 3: each technique on `small` (context 1024, batch 8): (a) compiled GiB, (b) predicted ms; the chunked
    loss at the GPT-2 vocabulary, batch 128: (c) compiled GiB, (d) predicted ms."""
    mem = cached("techniques-small", TARGET, root / "compiled")
    time = stored("techniques-small", TARGET, root / "compiled")
    names = [(k, short) for k, short in TECHNIQUES if k in mem]
    a, b, c, d = axes
    ys = range(len(names))[::-1]
    a.barh(list(ys), [mem[k]["total_bytes"] / GIB for k, _ in names], color="#4a7")
    b.barh(list(ys), [time[k]["predicted_step_ms"] if k in time else 0 for k, _ in names], color="#47a")
    for ax in (a, b):
        ax.set_yticks(list(ys), [short for _, short in names] if ax is a else [])
    a.set(xlabel=f"GiB per GPU ({COMPILED})", title="(a) `small`, context 1024, batch 8: memory")
    b.set(xlabel=f"ms per step ({PREDICTED})", title="(b) the same steps: time")
    chunk_mem = cached("loss-chunk", TARGET, root / "compiled")
    chunk_time = stored("chunk", TARGET, root / "compiled")
    kinds = [k for k in ("float32", "bfloat16") if f"{k}, whole logits, batch {CHUNK_BATCH}" in chunk_mem]
    for ax, rows, key, unit in ((c, chunk_mem, "total_bytes", GIB), (d, chunk_time, "predicted_step_ms", 1.0)):
        for i, (loss, colour) in enumerate((("whole logits", "#c77"), ("chunked", "#47a"))):
            vals = [(rows.get(f"{k}, {loss}, batch {CHUNK_BATCH}") or {}).get(key, 0) / unit for k in kinds]
            ax.barh([len(kinds) - 1 - j + 0.2 - 0.4 * i for j in range(len(kinds))], vals, height=0.4,
                    color=colour, label=loss)
        ax.set_yticks(range(len(kinds))[::-1], kinds if ax is c else [])
        ax.legend(fontsize=7, loc="lower right")
    c.set(xlabel=f"GiB per GPU ({COMPILED})", title=f"(c) 4 layers, GPT-2 vocabulary, batch {CHUNK_BATCH}: memory")
    d.set(xlabel=f"ms per step ({PREDICTED})", title="(d) the same steps: time")


def cpu_before_after(axes, root: Path) -> None:
    """Figure 4: the optimizations plan's before/after on the CPU host: (a) measured step time with 95 % intervals,
    coloured where the change is beyond noise (Welch, Holm over the panel); (b) XLA:CPU's compiled plan, exact."""
    runs = plan_runs(root, "optimizations")
    bars = before_after_bars(runs)
    names = sorted(bars, key=lambda n: n != "float32")
    verdicts, _ = judged_bars(bars, names, ["step_ms"])
    row = next(r for r in bench_rows(runs) if r["run"].startswith("before_after"))
    a, b = axes
    ys = range(len(names))[::-1]
    step = [bars[n]["step_ms"] for n in names]
    colours = ["#888"] + [("#3a7" if s.mean < step[0].mean else "#c33") if verdicts.get((n, "step_ms")) else "#ccc"
                          for n, s in zip(names[1:], step[1:])]
    a.barh(list(ys), [s.mean for s in step], xerr=[s.ci or 0 for s in step], color=colours, capsize=3)
    a.set(xlabel="ms per train step (measured, 95 % interval)", title="(a) step time, measured")
    b.barh(list(ys), [bars[n]["memory_gb"].mean * 1e9 / GIB for n in names], color="#bbb")
    b.set(xlabel="GiB (XLA:CPU's compiled plan: exact, one figure)", title="(b) memory, XLA:CPU compiled plan")
    for ax in (a, b):
        ax.set_yticks(list(ys), names if ax is a else [])
    a.figure.suptitle(f"{row['params'] / 1e6:.1f}M-parameter model, batch {row['batch']}, context {row['context']}, "
                      f"{_host(runs)}", fontsize=9)


def curves(ax, root: Path) -> None:
    """(a) the best WikiText model's learning curves, each seed: training loss (line), validation loss (dots)."""
    plan, setting = BEST_RUN
    runs = [r for r in plan_runs(root, plan) if r["name"].rsplit("-s", 1)[0] == setting]
    for colour, r in zip(COLOURS, sorted(runs, key=lambda r: r["name"])):
        recs = read_metrics(Path(r["_dir"]) / "metrics.jsonl")
        seed = r["name"].rsplit("-s", 1)[1]
        for kind, what, fmt, kw in (("train", "training", "-", {"lw": 1}), ("eval", "validation", "o", {"ms": 4})):
            pts = [(m["step"], m[f"{kind}/loss"]) for m in recs if m.get("kind") == kind and f"{kind}/loss" in m]
            _line(ax, pts, fmt, color=colour, label=f"seed {seed}, {what}", **kw)
    params = (runs[0].get("metrics") or {}).get("params", 0) / 1e6 if runs else 0
    ax.set(xlabel="step", ylabel="loss (nats)", title=f"(a) best WikiText model ({params:.1f}M, batch 32)")


def lr_panel(ax, root: Path) -> None:
    """(b) every seed's final validation loss against the rate, coloured by its outcome; non-finite at ln V."""
    runs = plan_runs(root, "lr_sweep")
    by, untrained = dict(by_rate(runs)), untrained_loss(runs)
    e = edge(list(by.items()), untrained)
    for kind, colour in {"trained": "#3a7", "failed": "#e90", "diverged": "#c33"}.items():
        pts = [(x, (r.get("metrics") or {}).get("eval_loss")) for x, rs in by.items()
               for r, k in zip(rs, e["kinds"][x]) if k == kind]
        pts = [(x, v if isinstance(v, (int, float)) and math.isfinite(v) else untrained) for x, v in pts]
        if pts:
            ax.scatter(*zip(*pts), color=colour, label={"failed": "failed to learn"}.get(kind, kind), s=12)
    ax.axhline(untrained, color="#888", lw=0.8, ls="--", label="ln V (non-finite drawn here)")
    ax.axhline(e["best_loss"] + LEARNED_WITHIN, color="#e90", lw=0.8, ls=":",
               label=f"best + {LEARNED_WITHIN:g} nats")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss (nats)", title="(b) learning rate")


def seed_points(runs: list[dict], x) -> list[tuple[float, float, float]]:
    """(x, mean final validation loss, 95 % half-width over the completed seeds) per setting, sorted by x."""
    return sorted((x(s.runs[0]), st.mean, st.ci or 0.0) for s in group_settings(runs) if (st := s.stats("eval_loss")))


def training(axes, root: Path) -> None:
    """Figure 5: (a) learning curves of the best WikiText model, (b) the rate sweep, (c) validation loss against
    parameters (model_size), (d) against context at fixed tokens per step."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    a, b, c, d = axes
    curves(a, root)
    lr_panel(b, root)
    size = seed_points(plan_runs(root, "model_size"), lambda r: r["metrics"]["params"] / 1e6)
    ctx_runs = plan_runs(root, "context_length")
    ctx = seed_points(ctx_runs, lambda r: r["config"]["model"]["context_length"])
    batch = {r["config"]["model"]["context_length"]: r["config"]["data"]["batch_size"] for r in ctx_runs}
    for ax, pts in ((c, size), (d, ctx)):
        if pts:
            ax.errorbar(*zip(*pts), marker="o", ms=4, capsize=3, color=COLOURS[0], label="seed mean, 95 % interval")
    c.set(xscale="log", xlabel="parameters (millions)", ylabel="final validation loss (nats)",
          title="(c) model size, 300 steps of batch 16")
    if size:
        c.xaxis.set_major_locator(FixedLocator([x for x, _, _ in size]))
        c.xaxis.set_major_formatter(lambda v, _: f"{v:.2g}")
        c.xaxis.set_minor_formatter(NullFormatter())
    tokens = "/".join(sorted({str(t * n) for t, n in batch.items()}))
    d.set(xlabel="context (tokens)", ylabel="final validation loss (nats)",
          title=f"(d) context, batch x context = {tokens} tokens per step")
    if ctx:
        log2_axis(d, "x", [t for t, _, _ in ctx])
        for t, v, _ in ctx:
            d.annotate(f"B={batch.get(t)}", (t, v), textcoords="offset points", xytext=(4, 6), fontsize=7)


FIGURES = {  # file, in the report's order: (rows, columns of panels, height in inches, the function drawing them)
    "fig1_memory.png": (1, 2, 3.6, memory),
    "fig2_throughput_vs_batch.png": (1, 2, 3.4, throughput),
    "fig3_techniques_h100.png": (2, 2, 5.2, techniques),
    "fig4_before_after_cpu.png": (1, 2, 3.0, cpu_before_after),
    "fig5_training.png": (2, 2, 6.2, training),
}


def draw(root: Path, out: Path) -> list[Path]:
    """Every figure, each panel's fonts and grid set alike."""
    report_dir(out)
    for name, (rows, cols, height, panels) in FIGURES.items():
        fig, axes = pyplot().subplots(rows, cols, figsize=(9.6, height))
        panels(list(axes.flat), root)
        for ax in axes.flat:
            ax.title.set_fontsize(9)
            ax.tick_params(labelsize=8)
            ax.xaxis.label.set_fontsize(8)
            ax.yaxis.label.set_fontsize(8)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        save_figure(fig, out / name)
    return [out / name for name in FIGURES]


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.written.figures", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the committed records, a folder per plan")
    p.add_argument("--out", type=Path, default=OUT, help="where the PNGs go")
    args = p.parse_args(argv)
    print("\n".join(str(x) for x in draw(args.results, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
