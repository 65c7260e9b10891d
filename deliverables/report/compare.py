"""Plans without seeds (one seed per setting): their sentences, the trend along x, the runs table; the change
phrases the bench sentences share."""

from __future__ import annotations

import math
import statistics

from deliverables.common import table
from deliverables.report.format import QUANTITIES, fmt, fmt_pct, pct_change, value, x_value, xfmt
from deliverables.report.noise import Family
from deliverables.report.seeds import baseline_of, group_settings, matched, seed_sentences
from experiments.plan import format_value


def _axes(run: dict) -> dict:
    return run.get("axes", {})


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


def comparison_sentences(runs: list[dict], baseline: dict) -> list[str]:
    """A plan without seeds is one seed per setting: `seeds.seed_sentences` (n = 1, noise unknown)."""
    settings = group_settings(runs)
    return seed_sentences(settings, baseline_of(settings, baseline), Family())


def status_sentences(runs: list[dict]) -> list[str]:
    counts: dict[str, list[str]] = {}
    for r in runs:
        counts.setdefault(r.get("status", "?"), []).append(r["name"])
    out = [f"{len(runs)} run{'s' * (len(runs) != 1)}: " + ", ".join(f"{len(v)} {k}" for k, v in counts.items()) + "."]
    same: dict[tuple[str, str], list[str]] = {}  # (status, reason) -> runs: one line for a skipped technique's seeds
    for r in runs:
        if r.get("status") in ("diverged", "failed", "skipped"):
            same.setdefault((r["status"], r.get("reason") or "no reason recorded"), []).append(f"`{r['name']}`")
    return out + [f"{', '.join(names)} {status}: {reason}." for (status, reason), names in same.items()]


def sweep_sentences(runs: list[dict], x: str | None) -> list[str]:
    """How the final validation loss (and accuracy) moves along the x axis, from its lowest x to its highest."""
    pts = sorted(((xv, r) for r in runs if r.get("status") == "ok" and x and (xv := x_value(r, x)) is not None
                  and value(r, "eval_loss") is not None and math.isfinite(value(r, "eval_loss"))), key=lambda t: t[0])
    if len(pts) < 2:
        return []
    (x0, r0), (x1, r1) = pts[0], pts[-1]
    l0, l1 = value(r0, "eval_loss"), value(r1, "eval_loss")
    losses = [value(r, "eval_loss") for _, r in pts]
    shape = ("at every step along the axis" if all((b < a) == (l1 < l0) for a, b in zip(losses, losses[1:]))
             else f"not monotonically: lowest at {x}={xfmt(pts[losses.index(min(losses))][0])}")
    out = [f"From {x}={xfmt(x0)} to {x}={xfmt(x1)} the validation loss {'fell' if l1 < l0 else 'rose'} from "
           f"{l0:.3f} to {l1:.3f} ({fmt_pct(pct_change(l1, l0))}), {shape}."]
    a0, a1 = value(r0, "eval_acc"), value(r1, "eval_acc")
    if a0 is not None and a1 is not None:
        out.append(f"Validation accuracy went from {fmt(a0, 'pct')} to {fmt(a1, 'pct')} over the same range.")
    return out


def train_table(runs: list[dict], baseline: dict) -> str:
    axes = list(dict.fromkeys(k for r in runs for k in r.get("axes", {})))
    cols = [q for q in QUANTITIES if any(value(r, q) is not None for r in runs)]
    ok = [r for r in runs if r.get("status") == "ok"]
    base_of = {r["name"]: b for axis, label in baseline.items() for r, b in matched(ok, _axes, axis, label)}
    deltas = [q for q in ("eval_ppl", "wall_time_s", "peak_memory", "max_rss_bytes") if q in cols] if base_of else []
    headers = ["run", *axes, "status", *(QUANTITIES[q][0] for q in cols), *(f"Δ {QUANTITIES[q][0]}" for q in deltas)]
    rows = []
    for r in runs:
        row = [f"`{r['name']}`", *(format_value(r.get("axes", {}).get(a, "")) for a in axes), r.get("status", "?")]
        row += [fmt(value(r, q), QUANTITIES[q][1]) for q in cols]
        b = base_of.get(r["name"])
        is_base = r["name"] in {x["name"] for x in base_of.values()}
        row += [fmt_pct(pct_change(value(r, q), value(b, q))) if b else "base" if is_base else "" for q in deltas]
        rows.append(row)
    return table(headers, rows)
