"""Plots of training runs: learning curves and final metrics against an axis."""

from __future__ import annotations

import math
from pathlib import Path

from deliverables.report.format import QUANTITIES, x_value
from deliverables.report.output import COLOURS, pyplot, save_figure
from deliverables.report.seeds import Setting, Stats, group_settings, logged, tokens_per_step
from experiments.plan import format_value

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
MAX_LINES = 8  # lines per panel; more settings make more panel rows
X_LABELS = {"step": "optimizer step", "tokens": "training tokens seen (millions)",
            "time": "wall time since the first log (s)"}


def mean_curve(runs: list[dict], q: str, by: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, seed mean, its 95 % interval's low and high ends) of `q` at the steps every run logged, finite values only;
    x is the step, the tokens seen (millions) or the mean wall time."""
    per_run = [{s: (v, t, s * tokens_per_step(r) / 1e6) for s, v, t in zip(*logged(r, q)) if math.isfinite(v)}
               for r in runs]
    out = []
    for s in sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []:
        x = s if by == "step" else sum(d[s][1 if by == "time" else 2] for d in per_run) / len(per_run)
        if math.isfinite(x):
            st = Stats.of([d[s][0] for d in per_run])
            out.append((x, st.mean, st.mean - (st.ci or 0.0), st.mean + (st.ci or 0.0)))
    return tuple(list(c) for c in zip(*out)) if out else ([], [], [], [])


def _curve_runs(setting: Setting) -> tuple[list[dict], str]:
    """The runs a setting's curve averages (completed seeds, else the diverged ones) and its legend label."""
    ok, bad = setting.ok, [r for r in setting.runs if r.get("status") == "diverged"]
    if ok:
        return ok, setting.name + (f" ({len(bad)}/{len(setting.runs)} diverged)" if bad else "")
    return bad, f"{setting.name} (diverged)" if bad else setting.name


def plot_curves(runs: list[dict], out: Path, bys: tuple[str, ...] = ("step", "time")) -> list[str]:
    """Training and validation loss of each setting (seed mean, 95 % band) by step, tokens or wall time; a figure
    with no line to draw is not written."""
    settings = [s for s in group_settings(runs) if _curve_runs(s)[0]]
    if not settings:
        return []
    plt = pyplot()
    chunks = [settings[i : i + MAX_LINES] for i in range(0, len(settings), MAX_LINES)]
    written = []
    for by in bys:
        fig, axs = plt.subplots(len(chunks), 2, figsize=(11, 4 * len(chunks)), squeeze=False)
        for row, chunk in zip(axs, chunks):
            tops = setting_tops(chunk)
            for k, setting in enumerate(chunk):
                chosen, label = _curve_runs(setting)
                for ax, q in zip(row, ("train_loss", "eval_loss")):
                    xs, mean, lo, hi = mean_curve(chosen, q, by)
                    if not xs:
                        continue
                    style = dict(color=COLOURS[k], marker=MARKERS[k], ms=4, lw=1.3, markevery=max(1, len(xs) // 8))
                    ax.plot(xs, mean, label=label, **style)
                    if len(chosen) > 1:
                        ax.fill_between(xs, lo, hi, color=COLOURS[k], alpha=0.15, lw=0)
                    if not setting.ok:  # diverged: a cross where the loss was last finite, kept inside the axes
                        ax.plot(xs[-1], min(mean[-1], _top(tops[q])), "x", color=COLOURS[k], ms=10, mew=2, label=label)
            _finish_curve_axes(row, tops, by)
            ends = [line.get_xdata()[-1] for line in row[0].get_lines() if len(line.get_xdata())]
            if by == "tokens" and ends and min(ends) > 0 and max(ends) / min(ends) > 8:  # budgets 8x apart: log scale
                for ax in row:
                    ax.set_xscale("log")
            handles = {label: h for ax in row for h, label in zip(*ax.get_legend_handles_labels())}
            if handles:
                row[1].legend(list(handles.values()), list(handles), loc="upper right", fontsize=7)
        if not any(ax.get_lines() for row in axs for ax in row):
            plt.close(fig)
            continue
        fig.suptitle("seed mean, band: its 95 % t-interval over seeds; x: last finite point of a diverged run",
                     fontsize=8)
        name = f"curves_by_{by}.png"
        save_figure(fig, out / name, 80, bbox_inches="tight")
        written.append(name)
    return written


def setting_tops(settings: list[Setting]) -> dict[str, list[float]]:
    """The completed runs' losses after their first 10 % of logs: the y range, so the initial drop from ln V and
    a diverged curve leave the plot instead of flattening the part where settings differ."""
    out = {}
    for q in ("train_loss", "eval_loss"):
        finite = [[x for x in logged(r, q)[1] if math.isfinite(x)] for s in settings for r in s.ok]
        out[q] = [x for v in finite for x in v[len(v) // 10 :]]
    return out


def _top(values: list[float]) -> float:
    """The top of a loss axis: the completed runs' highest value (at most 3 above their lowest), plus a margin."""
    if not values:
        return math.inf
    lo, hi = min(values), max(values)
    return min(hi, lo + 3.0) + 0.05 * (hi - lo) + 1e-9


def _finish_curve_axes(row, tops: dict, by: str) -> None:
    for ax, q, title in zip(row, ("train_loss", "eval_loss"), ("training loss", "validation loss")):
        if tops[q]:
            lo, hi = min(tops[q]), max(tops[q])
            ax.set_ylim(lo - 0.05 * (hi - lo), _top(tops[q]))
        ax.set_xlabel(X_LABELS[by])
        ax.set_ylabel("loss (nats per token)")
        ax.set_title(f"{title} by {X_LABELS[by].split(' (')[0]}")
        ax.grid(alpha=0.3)


def plot_vs_axis(runs: list[dict], x: str, ys: list[str], logx: bool, out: Path) -> str | None:
    """Final metrics against one axis (seed mean, error bar: its 95 % t-interval), a line per combination of the
    other axes."""
    groups: dict[str, list[tuple[float, Setting]]] = {}
    for s in group_settings([r for r in runs if r.get("status") in ("ok", "diverged")]):
        xs = [v for r in s.runs if (v := x_value(r, x)) is not None]
        if not xs:
            continue
        rest = ", ".join(f"{k}={format_value(v)}" for k, v in s.axes.items() if k != x) or "runs"
        groups.setdefault(rest, []).append((sum(xs) / len(xs), s))
    if not groups:
        return None
    fig, axs = pyplot().subplots(1, len(ys), figsize=(5 * len(ys), 3.8), squeeze=False)
    for ax, q in zip(axs[0], ys):
        for k, (label, pts) in enumerate(groups.items()):
            pts = sorted((a, st) for a, s in pts if (st := s.stats(q)) is not None)
            if pts:
                ax.errorbar([a for a, _ in pts], [st.mean for _, st in pts], yerr=[st.ci or 0.0 for _, st in pts],
                            color=COLOURS[k % len(COLOURS)], marker=MARKERS[k % len(MARKERS)], capsize=3, label=label)
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(AXIS_TITLES.get(x, x))
        ax.set_ylabel(QUANTITIES.get(q, (q,))[0] + UNITS.get(q, ""))
        ax.grid(alpha=0.3)
    if len(groups) > 1:
        axs[0][0].legend(fontsize=7)
    fig.suptitle("seed mean; error bars: its 95 % t-interval over seeds", fontsize=8)
    name = f"{x.replace('.', '_')}_vs_metrics.png"
    save_figure(fig, out / name, 80)
    return name


AXIS_TITLES = {"optim.lr": "peak learning rate", "data.batch_size": "batch size (sequences)",
               "model.context_length": "context length (tokens)", "params": "parameters"}
UNITS = {"eval_loss": " (nats per token)", "train_loss": " (nats per token)", "tokens_per_s": " (training)",
         "eval_acc": " (next-token top-1)"}
