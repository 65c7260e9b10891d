"""The runs' status sentences and every-run table; the change phrases the bench sentences share."""

from __future__ import annotations

import statistics
from collections import Counter

from deliverables.common import table
from deliverables.report.format import QUANTITIES, fmt, value
from experiments.plan import format_value


def change_phrase(name: str, changes: list[float]) -> str | None:
    """'cut peak memory by 43% (median of 3, -45% to -40%)' from the percent changes of `name`."""
    if not changes:
        return None
    med = statistics.median(changes)
    spread = "" if len(changes) == 1 else f" (median of {len(changes)}, {min(changes):+.0f}% to {max(changes):+.0f}%)"
    if abs(med) < 0.5:
        return f"left {name} unchanged{spread}"
    return f"{'raised' if med > 0 else 'cut'} {name} by {abs(med):.0f}%{spread}"


def describe_changes(subject: str, against: str, phrases: list[str]) -> str | None:
    """'bfloat16 against float32 at batch 32, 64, 128: cut peak memory by 43%, raised ...'."""
    phrases = [p for p in phrases if p]
    return f"{subject} against {against}: " + "; ".join(phrases) + "." if phrases else None


def status_sentences(runs: list[dict]) -> list[str]:
    counts = Counter(r.get("status", "?") for r in runs)
    out = [f"{len(runs)} run{'s' * (len(runs) != 1)}: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + "."]
    same: dict[tuple[str, str], list[str]] = {}  # (status, reason) -> runs: one line for a skipped technique's seeds
    for r in runs:
        if r.get("status") in ("diverged", "failed", "skipped"):
            same.setdefault((r["status"], r.get("reason") or "no reason recorded"), []).append(f"`{r['name']}`")
    return out + [f"{', '.join(names)} {status}: {reason}." for (status, reason), names in same.items()]


def train_table(runs: list[dict]) -> str:
    """Every run: its axes, status and final metrics."""
    axes = list(dict.fromkeys(k for r in runs for k in r.get("axes", {})))
    cols = [q for q in QUANTITIES if any(value(r, q) is not None for r in runs)]
    rows = [[f"`{r['name']}`", *(format_value(r.get("axes", {}).get(a, "")) for a in axes), r.get("status", "?"),
             *(fmt(value(r, q), QUANTITIES[q][1]) for q in cols)] for r in runs]
    return table(["run", *axes, "status", *(QUANTITIES[q][0] for q in cols)], rows)
