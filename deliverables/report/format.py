"""Number formatting and the quantities a report shows (its Markdown tables: deliverables.common.table)."""

from __future__ import annotations

import math
from typing import Any

# Quantity -> (column title, formatter)
QUANTITIES: dict[str, tuple[str, str]] = {
    "params": ("params", "count"),
    "steps": ("steps", "int"),
    "tokens": ("tokens", "count"),
    "train_loss": ("train loss", "f3"),
    "eval_loss": ("val loss", "f3"),
    "eval_ppl": ("val ppl", "f2"),
    "eval_acc": ("val acc", "pct"),
    "tokens_per_s": ("tokens/s", "count"),
    "step_time": ("step time", "sec"),
    "wall_time_s": ("total time", "sec"),
    "peak_memory": ("peak device memory", "bytes"),
    "max_rss_bytes": ("peak host RSS", "bytes"),
}
RUN_LEVEL = ("wall_time_s", "max_rss_bytes")  # measured by the runner, not read from metrics.jsonl

SCALES = {"count": (("G", 1e9), ("M", 1e6), ("k", 1e3)), "bytes": ((" GiB", 2**30), (" MiB", 2**20), (" KiB", 2**10))}


def fmt(v: Any, how: str = "g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, str):
        return v
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if how in ("count", "bytes"):
        for unit, scale in SCALES[how]:
            if abs(v) >= scale:
                return f"{v / scale:.3g}{unit}"
        return f"{v:.3g}" if how == "count" else f"{v:.0f} B"
    if how == "sec":
        return f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    if how == "pct":
        return f"{100 * v:.1f}%"
    if how == "int":
        return str(int(v))
    if how in ("f2", "f3"):
        return f"{v:.{how[1]}f}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def pct_change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return None
    return 100.0 * (new - old) / old


def value(run: dict, q: str) -> float | None:
    v = run.get(q) if q in RUN_LEVEL else run.get("metrics", {}).get(q)
    if run.get("status") == "skipped":
        return None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def x_value(run: dict, x: str) -> float | None:
    """The run's value on the x axis: a numeric grid axis, else a final metric such as `params`."""
    v = run.get("axes", {}).get(x)
    if v is None:
        v = run.get("metrics", {}).get(x)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
