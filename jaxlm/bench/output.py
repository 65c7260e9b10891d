"""The console table, JSON and CSV of benchmark rows (`jaxlm.bench.measure.COLUMNS`)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from jaxlm.bench.measure import COLUMNS
from jaxlm.bench.timing import withheld
from jaxlm.core.errors import UsageError
from jaxlm.core.files import atomic_write, writable_dir_problem, writable_file_problem
from jaxlm.core.units import count, si


def check_output(flag: str, path: str | None) -> None:
    """Stop before any work when `path` cannot be written (a directory, a read-only filesystem): a sweep's rows
    would be lost at its end. A missing folder is fine where it can be made."""
    if path is None:
        return
    parent = Path(path).absolute().parent
    problem = writable_file_problem(path) if parent.is_dir() or Path(path).is_dir() else writable_dir_problem(parent)
    if problem:
        raise UsageError(f"{flag} {path}: cannot be written ({problem})")


def _fmt(value, col: str) -> str:
    if value is None:
        return "-"
    if col in ("memory_gb", "estimate_gb") or col.endswith("_gib"):
        return f"{value:.3f}"
    if col in ("mfu", "predicted_mfu"):
        return f"{100 * value:.1f}%"
    if col == "busy":
        return "busy" if value else "quiet"
    if col in ("params", "flops_per_step"):
        return si(value)
    if col in ("tokens_per_s", "predicted_tokens_per_s"):
        return count(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _cell(row: dict, col: str) -> str:
    """One table cell; a paired speed ratio shows its interquartile range over the rounds beside it, and none is
    shown for a row timed on a busy machine."""
    if col == "speed_vs_reference" and row.get("busy") and row.get(col) is not None:
        return "withheld"
    text = _fmt(row.get(col), col)
    if col == "speed_vs_reference" and row.get("speed_vs_reference_iqr"):
        low, high = row["speed_vs_reference_iqr"]
        text += f" ({low:.3g}-{high:.3g})"
    return text


TABLE_COLUMNS = (
    "framework", "mode", "dtype", "attention", "remat", "context", "batch", "status", "compile_s", "step_ms",
    "step_ms_std", "tokens_per_s", "tflops", "mfu", "memory_gb", "memory_source", "busy", "speed_vs_reference",
)


HEADINGS = {  # table headings that read as words; other columns: the key with spaces
    "compile_s": "compile s", "step_ms": "step ms", "tokens_per_s": "tokens/s",
    "tflops": "TFLOP/s", "mfu": "MFU", "memory_gb": "memory GB", "memory_source": "memory from",
    "busy": "machine", "dtype_label": "dtype", "argument_gib": "argument GiB", "temp_gib": "temp GiB",
    "total_gib": "total GiB",
}


def _heading(col: str, rows: list[dict]) -> str:
    if col == "speed_vs_reference":  # named after the side the rows compare with
        sides = sorted({r["reference"] for r in rows if r.get("reference")})
        return f"speedup vs {'/'.join(sides) or 'reference'}"
    return HEADINGS.get(col, col.replace("_", " "))


def format_table(rows: list[dict], columns=TABLE_COLUMNS) -> str:
    """A fixed-width console table; columns that are empty in every row are dropped. Below it, one line per kind
    of speed ratio printed saying which ratio it is, and one when a ratio is withheld (rows timed on a busy machine)."""
    cols = [c for c in columns if any(r.get(c) not in (None, "none") for r in rows) or c in ("framework", "status")]
    cells = [[_cell(r, c) for c in cols] for r in rows]
    heads = [_heading(c, rows) for c in cols]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    ratio = _heading("speed_vs_reference", rows)
    shown = [r for r in rows if r.get("speed_vs_reference") is not None]
    kinds = sorted({r["speed_vs_reference_of"] for r in shown if not r.get("busy") and r.get("speed_vs_reference_of")})
    notes = [f"{ratio}: {kind}" for kind in kinds] + [note for note in [withheld(ratio, shown)] if note]
    return "\n".join([line(heads), line(["-" * w for w in widths]), *map(line, cells), *notes])


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_rows(rows: list[dict], path: str | Path, meta: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = [{k: _json_safe(v) for k, v in r.items()} for r in rows]
    return atomic_write(path, json.dumps({"meta": meta or {}, "rows": clean}, indent=1))


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _json_safe(r.get(k)) for k in COLUMNS})
    return path
