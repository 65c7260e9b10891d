"""Settings over seeds: each setting's mean ± its 95 % t-interval, differences judged by `noise` (Welch, Holm)."""

from __future__ import annotations

import collections
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from deliverables.common import table
from deliverables.report.format import QUANTITIES, fmt, value
from deliverables.report.noise import Family, half_width, welch
from experiments.plan import SEED_AXIS, format_value
from experiments.results import read_metrics, series
from jaxlm.core.files import read_json

SEED_SUFFIX = re.compile(r"-s\d+$")


@dataclass
class Setting:
    """One setting of a plan (its axes without the seed) and its runs, one per seed."""

    name: str
    axes: dict[str, Any]
    runs: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> list[dict]:
        return [r for r in self.runs if r.get("status") == "ok"]

    @property
    def status(self) -> str:
        counts = collections.Counter(r.get("status", "?") for r in self.runs)
        return ", ".join(f"{n} {s}" for s, n in counts.items()) if len(counts) > 1 else next(iter(counts), "?")

    def stats(self, q: str) -> Stats | None:
        """`q` over the completed seeds (finite values only)."""
        return Stats.of([v for r in self.ok if (v := value(r, q)) is not None and math.isfinite(v)], (self.name, q))


@dataclass(frozen=True)
class Stats:
    """Mean and spread of one quantity over seeds; std is the sample standard deviation (n - 1),
    ci the half-width of the 95 % t-interval of the mean (None for one seed)."""

    n: int
    mean: float
    std: float
    lo: float
    hi: float

    label: tuple = ()  # what was measured (setting, quantity): two comparisons of equal numbers stay two

    @staticmethod
    def of(xs: list[float], label: tuple = ()) -> Stats | None:
        if not xs:
            return None
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return Stats(len(xs), statistics.fmean(xs), sd, min(xs), max(xs), label)

    @property
    def ci(self) -> float | None:
        return half_width(self.std, self.n)

    def text(self, digits: int = 3) -> str:
        """'2.031 ± 0.012' (± the half-width of the 95 % interval of the mean), or the value of a single run."""
        return f"{self.mean:.{digits}f}" if self.n == 1 else f"{self.mean:.{digits}f} ± {self.ci:.{digits}f}"


def group_settings(runs: list[dict]) -> list[Setting]:
    """Runs grouped by name without the seed suffix (-sN), in first-seen order: a run without seeds is its own."""
    out: dict[str, Setting] = {}
    for r in runs:
        axes = r.get("axes") or {}
        name = SEED_SUFFIX.sub("", r["name"]) if SEED_AXIS in axes else r["name"]
        out.setdefault(name, Setting(name, {k: v for k, v in axes.items() if k != SEED_AXIS})).runs.append(r)
    return list(out.values())


def along(settings: list[Setting], axis: str) -> list[tuple[float, Setting]]:
    """(value, setting) of the settings with a number on `axis`, by that number."""
    return sorted(((float(s.axes[axis]), s) for s in settings if isinstance(s.axes.get(axis), (int, float))),
                  key=lambda t: t[0])


def resolved(a: Stats, b: Stats, noise: Family) -> bool | None:
    """True when a and b differ beyond noise (Welch's test, Holm-corrected over `noise`), False when
    within noise, None with a single seed."""
    return noise.beyond(welch(a.mean, a.std, a.n, b.mean, b.std, b.n), key=frozenset((a, b)))  # a vs b = b vs a


VERDICT = {True: "beyond noise", False: "within noise", None: "one seed: noise unknown"}
SHORT = {**VERDICT, None: "one seed"}  # in a table cell


def compare_phrase(a: Stats, b: Stats, noise: Family, what: str = "validation loss", digits: int = 3) -> str:
    """'validation loss 2.104 ± 0.010 against 2.031 ± 0.012 (+3.6%, beyond noise)'."""
    d = a.mean - b.mean
    pct = f"{100 * d / b.mean:+.1f}%" if b.mean else f"{d:+.3g}"
    return f"{what} {a.text(digits)} against {b.text(digits)} ({pct}, {VERDICT[resolved(a, b, noise)]})"


def matched(items: list, axes: Callable[[Any], dict], axis: str, label: Any) -> list[tuple[Any, Any]]:
    """(item, its baseline) for each item with another value on `axis`; the baseline has `label` there and the
    item's value on every other axis."""
    def rest(i) -> tuple:
        return tuple(sorted((k, format_value(v)) for k, v in axes(i).items() if k != axis))

    bases = {rest(i): i for i in items if format_value(axes(i).get(axis)) == format_value(label)}
    return [(i, bases[rest(i)]) for i in items if axes(i).get(axis) is not None
            and format_value(axes(i)[axis]) != format_value(label) and rest(i) in bases]


def baseline_of(settings: list[Setting], baseline: dict) -> dict[str, Setting]:
    """setting name -> the baseline setting it is compared with (same value on every other axis)."""
    return {s.name: b for axis, label in baseline.items() for s, b in matched(settings, lambda s: s.axes, axis, label)}


def settings_table(settings: list[Setting], bases: dict[str, Setting], noise: Family) -> str:
    """One row per setting: seeds, status, final metrics as mean ± 95 % interval over the completed seeds."""
    axes = list(dict.fromkeys(k for s in settings for k in s.axes))
    cols = [q for q in ("params", "steps", "tokens", "train_loss", "eval_loss", "eval_ppl", "eval_acc", "tokens_per_s",
                        "step_time", "wall_time_s") if any(s.stats(q) for s in settings)]
    headers = (["setting", *axes, "seeds", "status", *(QUANTITIES[q][0] for q in cols)]
               + (["Δ val loss vs baseline"] if bases else []))
    rows = []
    for s in settings:
        row = [f"`{s.name}`", *(format_value(s.axes.get(a, "")) for a in axes), str(len(s.runs)), s.status]
        for q in cols:
            st = s.stats(q)
            if st is None:
                row.append("–")
            elif q in ("train_loss", "eval_loss"):
                row.append(st.text(3))
            elif q == "eval_ppl":
                row.append(st.text(2))
            elif q == "eval_acc":
                row.append(f"{100 * st.mean:.1f}%" + (f" ± {100 * st.ci:.1f}" if st.n > 1 else ""))
            else:
                row.append(fmt(st.mean, QUANTITIES[q][1]))
        if bases:
            row.append(_delta_cell(s, bases, noise))
        rows.append(row)
    return table(headers, rows)


def _delta_cell(s: Setting, bases: dict[str, Setting], noise: Family) -> str:
    b = bases.get(s.name)
    if b is None:
        return "base" if s in bases.values() else ""
    a, base = s.stats("eval_loss"), b.stats("eval_loss")
    if a is None or base is None:
        return "–"
    return f"{100 * (a.mean - base.mean) / base.mean:+.1f}% ({SHORT[resolved(a, base, noise)]})"


def _data(s: Setting) -> tuple[str, str]:
    """What a setting's validation loss is measured on: its runs' data.source and data.dir."""
    data = ((s.runs[0].get("config") or {}).get("data") or {}) if s.runs else {}
    return str(data.get("source")), str(data.get("dir"))


def seed_sentences(settings: list[Setting], bases: dict[str, Setting], noise: Family) -> list[str]:
    """Each setting against its baseline, the best setting and whether it is beyond noise of the next best."""
    out = []
    for s in settings:
        if (b := bases.get(s.name)) is None:
            continue
        a, base = s.stats("eval_loss"), b.stats("eval_loss")
        if a is None or base is None:
            out.append(f"`{s.name}` against `{b.name}`: {s.status}, no completed seed to compare.")
            continue
        extra = ""
        ta, tb = s.stats("step_time"), b.stats("step_time")
        if ta and tb and tb.mean:
            extra = (f"; step time (median of each run's logged windows) {100 * (ta.mean - tb.mean) / tb.mean:+.0f}% "
                     f"({VERDICT[resolved(ta, tb, noise)]})")
        out.append(f"`{s.name}` against `{b.name}`: {compare_phrase(a, base, noise)}{extra}.")
    # Losses on other validation data (peft's pre-training) do not rank.
    same_data = statistics.mode(map(_data, settings)) if settings else None
    ranked = sorted(((st, s) for s in settings if len(s.ok) == len(s.runs) and _data(s) == same_data
                     and (st := s.stats("eval_loss"))), key=lambda t: t[0].mean)
    if ranked:
        best, s = ranked[0]
        line = f"Lowest mean validation loss: `{s.name}`, {best.text()}"
        if len(ranked) > 1:
            nxt, s2 = ranked[1]
            line += f"; the next, `{s2.name}`: {compare_phrase(nxt, best, noise)}"
        out.append(line + ".")
    return out


def run_json(runs: list[dict], name: str) -> list[tuple[dict, Any]]:
    """(run, its parsed `name` file) of each run that wrote one (a study's own rows: bench, quantize, tokenizer)."""
    return [(r, data) for r in runs if (data := read_json(Path(r.get("_dir", "")) / name, default=None)) is not None]


def logged(run: dict, q: str) -> tuple[list[int], list[float], list[float]]:
    """(steps, values, times) of `q` in the run's metrics.jsonl."""
    return series(read_metrics(Path(run["_dir"]) / "metrics.jsonl"), q)


def tokens_per_step(run: dict) -> int:
    cfg = run.get("config") or {}
    return (cfg.get("data", {}).get("batch_size") or 0) * (cfg.get("model", {}).get("context_length") or 0)


def train_loss_at_tokens(run: dict, tokens: float) -> float | None:
    """The run's logged training loss at `tokens` tokens seen, interpolated between logs (None outside them)."""
    steps, vals, _ = logged(run, "train_loss")
    pts = [(s * tokens_per_step(run), v) for s, v in zip(steps, vals) if math.isfinite(v)]
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t0 <= tokens <= t1:
            return v0 + (v1 - v0) * (tokens - t0) / (t1 - t0) if t1 > t0 else v0
    return None


def equal_token_sentences(settings: list[Setting], x: str, noise: Family) -> list[str]:
    """Neighbours along `x` compared at the smaller run's whole token budget, by the logged training loss."""
    pts = [(v, s) for v, s in along(settings, x) if s.ok]
    out = []
    for (xa, a), (xb, b) in zip(pts, pts[1:]):
        budget = statistics.fmean(r["metrics"]["tokens"] for r in a.ok if r.get("metrics", {}).get("tokens"))
        mine = Stats.of([v for r in a.ok if (v := train_loss_at_tokens(r, budget)) is not None])
        theirs = Stats.of([v for r in b.ok if (v := train_loss_at_tokens(r, budget)) is not None])
        label, other = (f"{x}={format_value(int(v) if v.is_integer() else v)}" for v in (xa, xb))
        said = ("logged no training loss that early" if mine is None or theirs is None
                else compare_phrase(theirs, mine, noise, "training loss"))
        out.append(f"At equal tokens ({fmt(budget, 'count')}, the whole run of {label}): {other} {said}.")
    return out
