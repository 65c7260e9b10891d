"""The written report's numbered figures, drawn from the committed records and the compiled store.

    python -m deliverables.written.figures [--results docs/results] [--out docs/report/figures]

Each panel holds one unit family and one source per line: no line joins two studies, two models or two
compilers, and every GPU panel says *compiled* or *predicted* for the H100 80 GB. Captions are the report's own
(docs/report/report.md); `FIGURES` names what each one draws, in the report's order.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from deliverables.common import plan_runs
from deliverables.report.charts import before_after_bars, bench_rows
from deliverables.report.output import COLOURS, pyplot, report_dir, save_figure
from deliverables.report.sections.divergence import LEARNED_WITHIN, by_rate, edge, untrained_loss
from deliverables.written import compiled_figures as gpu
from experiments.results import read_metrics
from jaxlm import cli

RESULTS, OUT = Path("docs/results"), Path("docs/report/figures")
GIB = 2**30
FIGURES = {
    "fig1_memory.png": "`small`'s memory compiled for an H100 against context and batch, GiB",
    "fig2_throughput_vs_batch.png": "tokens/s against batch: predicted for an H100 (a), measured on the CPU host (b)",
    "fig3_techniques_h100.png": "each technique's compiled memory and predicted step time on an H100",
    "fig4_before_after_cpu.png": "the optimizations plan's before/after measured on the CPU host",
    "fig5_training.png": "learning curves, the learning-rate sweep, model size and context length",
}
BEST_RUN = "batch_size", "b32"  # the best WikiText model: the batch-size study's batch 32 (its seeds)


def _finish(*axes) -> None:
    for ax in axes:
        ax.title.set_fontsize(9)
        ax.tick_params(labelsize=8)
        ax.xaxis.label.set_fontsize(8)
        ax.yaxis.label.set_fontsize(8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)


def memory(root: Path, path: Path) -> None:
    """Figure 1: `small` compiled for an H100, (a) against context, (b) against batch."""
    fig, axes = pyplot().subplots(1, 2, figsize=(9.6, 3.6))
    gpu.memory_panels(axes, root)
    _finish(*axes)
    save_figure(fig, path)


def cpu_throughput(ax, root: Path) -> None:
    """The profiling plan's batch sweep measured on the CPU host, 95 % intervals from its timed steps."""
    runs = plan_runs(root, "profiling")
    rows = sorted((r for r in bench_rows(runs) if r.get("run") == "batch_sweep" and r.get("tokens_per_s")),
                  key=lambda r: r["batch"])
    xs = [r["batch"] for r in rows]
    ys = [r["tokens_per_s"] / 1e3 for r in rows]
    es = [r["tokens_per_s"] * (r.get("step_ms_ci95") or 0) / r["step_ms"] / 1e3 for r in rows]
    params = rows[0]["params"] / 1e3 if rows else 0
    ax.errorbar(xs, ys, yerr=es, marker="o", ms=3, capsize=3, color=COLOURS[0], label="float32, measured")
    ax.set(xlabel="batch (sequences)", ylabel="thousand tokens/s (measured, CPU)", ylim=(0, None),
           title=f"(b) {params:.0f}k-parameter model, context 256, {_host(runs)}")
    if xs:
        gpu.log2_axis(ax, "x", xs)


def throughput(root: Path, path: Path) -> None:
    """Figure 2: (a) predicted H100 tokens/s of `small` by dtype and attention, (b) the CPU host's measured."""
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(9.6, 3.4))
    gpu.throughput_panel(a, root)
    cpu_throughput(b, root)
    _finish(a, b)
    save_figure(fig, path)


def techniques(root: Path, path: Path) -> None:
    """Figure 3: each technique's compiled memory beside its predicted step time, and the chunked loss's."""
    fig, axes = pyplot().subplots(2, 2, figsize=(9.6, 5.2))
    gpu.technique_panels(axes.flat, root)
    _finish(*axes.flat)
    save_figure(fig, path)


def _host(runs: list[dict]) -> str:
    """'Intel Xeon, 2 cores': the CPU the runs' records name."""
    h = next((r.get("host") or {} for r in runs if r.get("host")), {})
    cpu = str(h.get("cpu_model") or "CPU").replace("(R)", "").replace(" Processor", "")
    return f"{cpu}, {h.get('cpus', '?')} cores"


def cpu_before_after(root: Path, path: Path) -> None:
    """Figure 4: the optimizations plan's before/after on the CPU host: (a) measured step time with 95 % intervals,
    coloured where the change is beyond noise (Welch, Holm over the panel); (b) XLA:CPU's compiled plan, exact."""
    from deliverables.report.noise import judged, welch

    runs = plan_runs(root, "optimizations")
    bars = before_after_bars(runs)
    names = sorted(bars, key=lambda n: n != "float32")
    base = bars[names[0]]["step_ms"]

    def tests(family):
        return {n: family.beyond(welch(s.mean, s.std, s.n, base.mean, base.std, base.n))
                for n in names[1:] if (s := bars[n].get("step_ms"))}

    verdicts, _ = judged(tests)
    row = next(r for r in bench_rows(runs) if r["run"].startswith("before_after"))
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(9.6, 3.0))
    ys = range(len(names))[::-1]
    step = [bars[n]["step_ms"] for n in names]
    colours = ["#888"] + [("#3a7" if s.mean < base.mean else "#c33") if verdicts.get(n) else "#ccc"
                          for n, s in zip(names[1:], step[1:])]
    a.barh(list(ys), [s.mean for s in step], xerr=[s.ci or 0 for s in step], color=colours, capsize=3)
    a.set(xlabel="ms per train step (measured, 95 % interval)", title="(a) step time, measured")
    b.barh(list(ys), [bars[n]["memory_gb"].mean * 1e9 / GIB for n in names], color="#bbb")
    b.set(xlabel="GiB (XLA:CPU's compiled plan: exact, one figure)", title="(b) memory, XLA:CPU compiled plan")
    for ax in (a, b):
        ax.set_yticks(list(ys), names if ax is a else [])
    fig.suptitle(f"{row['params'] / 1e6:.1f}M-parameter model, batch {row['batch']}, context {row['context']}, "
                 f"{_host(runs)}", fontsize=9)
    _finish(a, b)
    save_figure(fig, path)


def curves(ax, root: Path) -> None:
    """(a) the best WikiText model's learning curves, each seed: training loss (line), validation loss (dots)."""
    plan, setting = BEST_RUN
    runs = [r for r in plan_runs(root, plan) if r["name"].rsplit("-s", 1)[0] == setting]
    for colour, r in zip(COLOURS, sorted(runs, key=lambda r: r["name"])):
        recs = read_metrics(Path(r["_dir"]) / "metrics.jsonl")
        train = [(m["step"], m["train/loss"]) for m in recs if m.get("kind") == "train" and "train/loss" in m]
        val = [(m["step"], m["eval/loss"]) for m in recs if m.get("kind") == "eval" and "eval/loss" in m]
        seed = r["name"].rsplit("-s", 1)[1]
        if train:
            ax.plot(*zip(*train), color=colour, lw=1, label=f"seed {seed}, training")
        if val:
            ax.plot(*zip(*val), "o", color=colour, ms=4, label=f"seed {seed}, validation")
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
    """(x, mean final validation loss, 95 % half-width over seeds) per setting, sorted by x."""
    from deliverables.report.seeds import Stats, group_settings

    out = []
    for s in group_settings(runs):
        st = Stats.of([v for r in s.runs if isinstance(v := (r.get("metrics") or {}).get("eval_loss"), float)])
        if st:
            out.append((x(s.runs[0]), st.mean, st.ci or 0.0))
    return sorted(out)


def size_and_context(b, c, root: Path) -> None:
    """(c) validation loss against parameters (model_size); (d) against context at fixed tokens per step."""
    size = seed_points(plan_runs(root, "model_size"), lambda r: r["metrics"]["params"] / 1e6)
    ctx_runs = plan_runs(root, "context_length")
    ctx = seed_points(ctx_runs, lambda r: r["config"]["model"]["context_length"])
    batch = {r["config"]["model"]["context_length"]: r["config"]["data"]["batch_size"] for r in ctx_runs}
    for ax, pts in ((b, size), (c, ctx)):
        if pts:
            ax.errorbar(*zip(*pts), marker="o", ms=4, capsize=3, color=COLOURS[0], label="seed mean, 95 % interval")
    b.set(xscale="log", xlabel="parameters (millions)", ylabel="final validation loss (nats)",
          title="(c) model size, 300 steps of batch 16")
    if size:
        from matplotlib.ticker import FixedLocator, NullFormatter

        b.xaxis.set_major_locator(FixedLocator([x for x, _, _ in size]))
        b.xaxis.set_major_formatter(lambda v, _: f"{v:.2g}")
        b.xaxis.set_minor_formatter(NullFormatter())
    tokens = "/".join(sorted({str(t * n) for t, n in batch.items()}))
    c.set(xlabel="context (tokens)", ylabel="final validation loss (nats)",
          title=f"(d) context, batch x context = {tokens} tokens per step")
    if ctx:
        gpu.log2_axis(c, "x", [t for t, _, _ in ctx])
        for t, v, _ in ctx:
            c.annotate(f"B={batch.get(t)}", (t, v), textcoords="offset points", xytext=(4, 6), fontsize=7)


def training(root: Path, path: Path) -> None:
    """Figure 5: (a) learning curves of the best WikiText model, (b) the rate sweep, (c) size, (d) context."""
    fig, axes = pyplot().subplots(2, 2, figsize=(9.6, 6.2))
    curves(axes[0][0], root)
    lr_panel(axes[0][1], root)
    size_and_context(axes[1][0], axes[1][1], root)
    _finish(*axes.flat)
    save_figure(fig, path)


def draw(root: Path, out: Path) -> list[Path]:
    report_dir(out)
    for name, fn in zip(FIGURES, (memory, throughput, techniques, cpu_before_after, training)):
        fn(root, out / name)
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
