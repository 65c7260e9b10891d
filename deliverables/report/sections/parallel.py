"""The parallelism study's findings, table and plots from `python -m jaxlm.bench parallel --json`'s rows."""

from __future__ import annotations

from pathlib import Path

from deliverables.common import table
from deliverables.report.output import COLOURS, images, pyplot, save_figure
from deliverables.report.seeds import run_json


def _replicated(rows: list[dict]) -> dict | None:
    """The row whose train state is whole on every device: one device, or data parallelism only."""
    return next((r for r in rows if r["layout"] == "1 device"
                 or {axis.split("=")[0] for axis in r["layout"].split(",")} == {"data"}), None)


def _f(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _collectives(row: dict) -> str:
    used = [(op, c) for op, c in row.get("collectives", {}).items() if c["count"]]
    return ", ".join(f"{op} {c['count']} ({c['bytes'] / 2**20:.1f} MiB)" for op, c in used) or "none"


def parallel(runs: list[dict], out: Path) -> tuple[list[str], list[str]]:
    """(findings, lines): per-device memory against the replicated layout, collectives, throughput, bubble."""
    rows = [{"run": r["name"], **row} for r, data in run_json(runs, "bench.json")  # every `bench parallel` row
            for row in (data or {}).get("rows", []) if "layout" in row]
    if not rows:
        return [], []
    findings, body = [], []
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        by_run.setdefault(r["run"], []).append(r)
    single = next((r for r in rows if r["layout"] == "1 device" and r.get("tokens_per_s")), None)
    for name, group in by_run.items():
        ref = _replicated(group)
        for r in group:
            share = r["state_mb_per_device"] / ref["state_mb_per_device"] if ref else None
            body.append([f"`{name}`", r["layout"], "yes" if r.get("scan_layers") else "no", _f(r["compile_s"], ".1f"),
                         _f(r["state_mb_per_device"], ".1f"), _f(share, ".3f"), _f(r.get("temp_mb"), ".1f"),
                         _f(r.get("step_ms"), ".1f"), _f(r.get("tokens_per_s"), ".0f"), _collectives(r), _bubble(r)])
            if ref and r is not ref:
                findings.append(f"{name}: {r['layout']} holds {share:.3f} of the replicated ({ref['layout']}) "
                                f"per-device parameters + optimizer state ({r['state_mb_per_device']:.0f} vs "
                                f"{ref['state_mb_per_device']:.0f} MiB, compiled program's shardings).")
            if single and r is not single and r.get("tokens_per_s") and "bubble" not in r:
                findings.append(f"{name}: {r['layout']} ran {r['tokens_per_s']:.0f} tokens/s against one device's "
                                f"{single['tokens_per_s']:.0f} ({r['tokens_per_s'] / single['tokens_per_s']:.2f}x).")
            if "bubble_measured" in r:
                es = "es" * (r["microbatches"] != 1)
                findings.append(f"{name}: {r['layout']} with {r['microbatches']} micro-batch{es} lost "
                                f"{100 * r['bubble_measured']:.0f} % of its step time against {r['reference_layout']} "
                                f"(analytic GPipe bubble {100 * r['bubble']:.0f} %).")
    headers = ["run", "layout", "scanned", "compile s", "state MiB / device", "of replicated", "temp MiB", "step ms",
               "tokens/s", "collectives (static count, result bytes)", "bubble: analytic / measured"]
    lines = ["## Per-device memory, collectives, throughput", "", table(headers, body), "",
             "State: parameters + AdamW moments + step counters per device, from the shardings of the compiled "
             "train step; temp: XLA's temporaries (compiled memory analysis). Collectives are counted in the "
             "compiled HLO (an op inside the scanned layer loop counts once). Measured bubble: 1 - t(reference) / "
             "t(pipeline), the reference being the same devices and batch with the pipeline axis folded into data.", ""]
    return findings, lines + images([plot_memory(by_run, out), plot_bubble(rows, out)])


def _bubble(r: dict) -> str:
    if "bubble" not in r:
        return "-"
    measured = f"{r['bubble_measured']:.2f}" if "bubble_measured" in r else "not run"
    return f"M={r.get('microbatches', '?')}: {r['bubble']:.2f} / {measured}"


def plot_memory(by_run: dict[str, list[dict]], out: Path) -> str | None:
    """Per-device state as a share of the replicated layout's, one panel per run that has one (MiB on the bars)."""
    panels = [(name, g, ref) for name, g in by_run.items() if (ref := _replicated(g)) and len(g) > 1]
    if not panels:
        return None
    fig, axes = pyplot().subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (name, group, ref) in zip(axes[0], panels):
        shares = [r["state_mb_per_device"] / ref["state_mb_per_device"] for r in group]
        bars = ax.bar(range(len(group)), shares, color="#1f77b4")
        for bar, r in zip(bars, group):
            ax.annotate(f"{r['state_mb_per_device']:.0f} MiB", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(group)), [r["layout"] for r in group], rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1.15)
        ax.set_ylabel(f"state per device / {ref['layout']}'s")
        ax.set_title(name, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    save_figure(fig, out / "parallel_memory.png")
    return "parallel_memory.png"


def plot_bubble(rows: list[dict], out: Path) -> str | None:
    """Bubble fraction against micro-batches: GPipe's formula and the measured step-time loss, per layout."""
    timed = [r for r in rows if "bubble_measured" in r]
    if not timed:
        return None
    fig, ax = pyplot().subplots(figsize=(5.5, 3.6))
    for i, layout in enumerate(dict.fromkeys(r["layout"] for r in timed)):
        pts = sorted((r["microbatches"], r["bubble"], r["bubble_measured"]) for r in timed if r["layout"] == layout)
        m, analytic, measured = zip(*pts)
        ax.plot(m, analytic, "--", color=COLOURS[i % len(COLOURS)], label=f"{layout}: (P-1)/(M+P-1)")
        ax.plot(m, measured, "o-", color=COLOURS[i % len(COLOURS)], label=f"{layout}: measured")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("bubble fraction of the step")
    ax.set_ylim(bottom=min(0.0, min(r["bubble_measured"] for r in timed)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, out / "pipeline_bubble.png")
    return "pipeline_bubble.png"
