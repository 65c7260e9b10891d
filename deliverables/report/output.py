"""What every report writes into: its folder, headless matplotlib with one palette, and compact PNGs."""

from __future__ import annotations

from pathlib import Path

from jaxlm.core.errors import UsageError
from jaxlm.core.extras import require
from jaxlm.core.files import writable_dir_problem

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def report_dir(out: Path) -> Path:
    """Create the report's folder, or stop with one line saying why it cannot hold the report."""
    problem = writable_dir_problem(out)
    if problem:
        raise UsageError(f"{out}: cannot hold the report: {problem}; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def images(pngs: list[str | None]) -> list[str]:
    """Markdown lines showing each figure written (None: not written)."""
    return [line for p in pngs if p for line in (f"![{p}]({p})", "")]


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), or one line naming the extra to install."""
    require("matplotlib").use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110, **kw) -> None:
    """Lay out, write and close a figure, then re-encode it with an adaptive palette of 96 colours: every report
    figure ends the same way, and line plots keep their look at a third of the bytes."""
    from PIL import Image

    fig.tight_layout()
    fig.savefig(path, dpi=dpi, **kw)
    pyplot().close(fig)
    with Image.open(path) as im:
        if im.mode == "P":
            return
        small = im.convert("RGB").quantize(96, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)
