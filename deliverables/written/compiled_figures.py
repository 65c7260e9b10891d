"""The written report's GPU figures: `small` compiled for an H100 (memory) and its predicted step times.

Each reads the compiled store (docs/results/compiled/h100-80gb.json) through the pages that fill it,
`python -m deliverables.compiled_memory` (memory) and `python -m deliverables.compiled_time` (predicted time);
nothing is compiled here. Every panel says which it shows: *compiled* (XLA's GPU compiler's memory plan) or
*predicted* (the roofline over the compiled program), for the H100 80 GB, never measured.
"""

from __future__ import annotations

from pathlib import Path

from deliverables.compiled_memory import ATTENTION_DTYPES, BATCHES, CONTEXTS, cached
from deliverables.compiled_time import stored
from deliverables.report.output import COLOURS

TARGET, GIB = "h100-80gb", 2**30
COMPILED, PREDICTED = "compiled for H100 80 GB", "predicted for H100 80 GB"
# The before/after of each technique on `small` (context 1024, batch 8): (label in the stored sections, short name).
TECHNIQUES = (("float32", "float32"), ("bfloat16", "bfloat16"), ("bfloat16 + cuDNN", "+ cuDNN attention"),
              ("bfloat16 + cuDNN + remat full", "+ cuDNN + full remat"),
              ("float32 + remat full", "float32 + full remat"))
CHUNK_BATCH = 128  # the chunked loss at the GPT-2 vocabulary: 4 layers, d_model 256, context 256


def log2_axis(ax, which: str, ticks) -> None:
    """A base-2 log axis labelled at `ticks` with plain numbers (256, 0.5), no minor labels."""
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    axis.set_major_locator(FixedLocator(list(ticks)))
    axis.set_major_formatter(lambda v, _: f"{v:g}")
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def powers(lo: float, hi: float) -> list[float]:
    """The powers of two from below `lo` to above `hi` (from 1/16): ticks of a log axis."""
    return [2.0**k for k in range(-4, 64) if lo / 2 <= 2.0**k <= hi * 2]


def memory_panels(axes, root: Path) -> None:
    """(a) train-step and eval-step GiB against context, batch 8; (b) train-step GiB against batch, context 256."""
    ctx = cached("context", TARGET, root / "compiled")
    bat = cached("batch", TARGET, root / "compiled")
    a, b = axes
    values = []
    for colour, (label, _, _) in zip(COLOURS, ATTENTION_DTYPES):
        for mode, style in (("train_step", "-"), ("forward", ":")):
            pts = [(t, r["total_bytes"] / GIB) for t in CONTEXTS if (r := ctx.get(f"{mode}, {label}, context {t}"))]
            if pts:
                a.plot(*zip(*pts), style, marker="o", ms=3, color=colour,
                       label=f"{label}, {'train step' if mode == 'train_step' else 'eval step'}")
                values += [v for _, v in pts]
        pts = [(n, r["total_bytes"] / GIB) for n in BATCHES if (r := bat.get(f"{label}, batch {n}"))]
        if pts:
            b.plot(*zip(*pts), marker="o", ms=3, color=colour, label=label)
            values += [v for _, v in pts]
    a.set(xlabel="context T (tokens)", ylabel=f"GiB per GPU ({COMPILED})", title="(a) against context, batch 8")
    b.set(xlabel="batch (sequences)", ylabel=f"GiB per GPU ({COMPILED})", title="(b) train step, context 256")
    log2_axis(a, "x", CONTEXTS)
    log2_axis(b, "x", BATCHES)
    for ax in axes:
        log2_axis(ax, "y", powers(min(values, default=0.5), max(values, default=64)))


def throughput_panel(ax, root: Path) -> None:
    """Predicted H100 tokens/s of `small`'s train step against batch at context 256, one line per dtype/attention."""
    rows = stored("batch", TARGET, root / "compiled")
    for colour, (label, _, _) in zip(COLOURS, ATTENTION_DTYPES):
        pts = [(n, r["predicted_tokens_per_s"] / 1e3) for n in BATCHES if (r := rows.get(f"{label}, batch {n}"))]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, color=colour, label=label)
    ax.set(xlabel="batch (sequences)", ylabel=f"thousand tokens/s ({PREDICTED})", ylim=(0, None),
           title="(a) `small`, context 256, train step")
    log2_axis(ax, "x", BATCHES)


def technique_panels(axes, root: Path) -> None:
    """Before/after of each technique on `small` (context 1024, batch 8): (a) compiled GiB, (b) predicted ms;
    the chunked loss at the GPT-2 vocabulary, batch 128: (c) compiled GiB, (d) predicted ms."""
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
