"""Benchmark rows: their table, comparisons against a baseline field, and growth along context and batch."""

from __future__ import annotations

import math

from deliverables.common import table
from deliverables.report.compare import change_phrase, describe_changes
from deliverables.report.format import fmt, pct_change
from deliverables.report.noise import Family, half_width, welch
from deliverables.report.seeds import Stats
from experiments.estimate import BENCH_DEFAULTS

# Bench row fields shown in the table (jaxlm.bench.measure.COLUMNS), with formats.
BENCH_COLUMNS: list[tuple[str, str, str]] = [
    ("framework", "framework", "g"), ("mode", "mode", "g"), ("dtype", "dtype", "g"), ("attention", "attention", "g"),
    ("remat", "remat", "g"), ("context", "context", "int"), ("batch", "batch", "int"), ("status", "status", "g"),
    ("step (ms)", "step_ms", "g"), ("± 95 %", "step_ms_ci95", "g"), ("median (ms)", "step_ms_median", "g"),
    ("tokens/s", "tokens_per_s", "count"), ("TFLOP/s", "tflops", "g"), ("MFU", "mfu", "pct"),
    ("memory (GB)", "memory_gb", "g"), ("memory from", "memory_source", "g"), ("params", "params", "count"),
]
# Row fields that are measurements (everything else identifies the setting).
BENCH_MEASURED = {"status", "compile_s", "step_ms", "step_ms_std", "step_ms_median", "timed_steps", "step_ms_ci95",
                  "tokens_per_s", "flops_per_step", "xla_flops", "tflops", "mfu", "memory_gb", "memory_source",
                  "estimate_gb", "speed_vs_reference", "reference", "other_cpus", "busy", "step_cpu_ms", "device",
                  "error", "traceback", "run", "max_batch", "hlo_dots", "matmul_dtypes"}
BENCH_COMPARED = {"memory_gb": "peak memory", "step_ms": "step time", "tokens_per_s": "throughput"}
# What a row's memory_gb is, by its memory_source: a measured device peak, or XLA's compiled estimate.
MEMORY_TITLES = {"memory_stats": "peak device memory", "memory_analysis": "compiled memory estimate (memory_analysis)"}


def bench_rows(runs: list[dict]) -> list[dict]:
    """Every bench row, with its run's name, how many steps it timed (the run's --steps, else jaxlm.bench's
    default), the half-width of the 95 % interval of its mean step time, and the `compute.*` keys its run set
    beyond the row's own columns (`loss_chunk=1024`: a figure must not join it to the whole-logits rows)."""
    rows = []
    for r in runs:
        spec = r.get("spec") or {}
        n = int((spec.get("args") or {}).get("steps", BENCH_DEFAULTS["steps"]))
        compute = " ".join(f"{k.split('.', 1)[1]}={v}" for k, v in sorted((spec.get("set") or {}).items())
                           if k.startswith("compute."))
        for row in r.get("bench_rows") or []:
            tagged = {"run": r["name"], "plan": r.get("plan"), **row, "timed_steps": n, "compute_set": compute}
            sd = sample_std(tagged)
            rows.append({**tagged, "step_ms_ci95": None if sd is None else half_width(sd, n)})
    return rows


def sample_std(row: dict) -> float | None:
    """The sample standard deviation of the row's step times (jaxlm.bench records the n-divided one)."""
    n, sd = row.get("timed_steps") or 0, row.get("step_ms_std")
    return sd * math.sqrt(n / (n - 1)) if isinstance(sd, (int, float)) and n >= 2 else None


def bench_table(rows: list[dict]) -> str:
    cols = [(t, k, how) for t, k, how in BENCH_COLUMNS if any(r.get(k) is not None for r in rows)]
    # Columns with one value throughout say nothing per row: state them once above the table instead.
    varying = [(t, k, how) for t, k, how in cols
               if len({str(r.get(k)) for r in rows}) > 1 or k in ("step_ms", "memory_gb", "tokens_per_s", "status")]
    body = [[f"`{r['run']}`", *(fmt(r.get(k), how) for _, k, how in varying)] for r in rows]
    fixed = [f"{t} {fmt(rows[0].get(k))}" for t, k, _ in cols if (t, k, _) not in varying]
    head = f"All rows: {', '.join(fixed)}.\n\n" if fixed else ""
    return head + table(["run", *(t for t, _, _ in varying)], body)


def max_batch_table(runs: list[dict]) -> str | None:
    found = [(r["name"], f) for r in runs for f in r.get("bench_max_batch") or []]
    if not found:
        return None
    return table(["run", "setting", "context", "max batch"],
                 [[f"`{n}`", f["setting"], str(f["context"]), str(f["max_batch"])] for n, f in found])


def _setting(row: dict, *skip: str) -> tuple:
    """The fields that identify a row's setting (not its measurements, nor `skip`), sorted."""
    return tuple(sorted((k, str(v)) for k, v in row.items()
                        if k not in BENCH_MEASURED and k not in skip and not isinstance(v, (list, dict))))


def _change(row: dict, base: dict, q: str) -> float | None:
    """% change of a measurement; step time compares medians where the rows have them (robust to a busy machine)."""
    a, b = (r.get("step_ms_median") if q == "step_ms" and isinstance(r.get("step_ms_median"), (int, float))
            else r.get(q) for r in (row, base))
    return pct_change(float(a), float(b)) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def bench_sentences(rows: list[dict], baseline: dict, noise: Family) -> list[str]:
    """Compare bench rows that differ only in the baseline field (e.g. dtype), metric by metric; a timing
    change says in how many row pairs it is beyond noise (Welch's test on the timed steps, in `noise`)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    out = []
    for field, base in baseline.items():
        bases = {_setting(r, field): r for r in ok if str(r.get(field)) == str(base)}
        by_label: dict[tuple, list] = {}
        for r in ok:
            if field in r and str(r[field]) != str(base) and _setting(r, field) in bases:
                by_label.setdefault((str(r[field]), r.get("mode")), []).append((r, bases[_setting(r, field)]))
        for (label, mode), pairs in by_label.items():
            phrases = []
            sources = {r.get("memory_source") for pair in pairs for r in pair}
            for q, title in BENCH_COMPARED.items():
                single = q == "memory_gb" and len(sources) == 1
                name = MEMORY_TITLES.get(next(iter(sources)), title) if single else title
                phrase = change_phrase(name, [p for r, b in pairs if (p := _change(r, b, q)) is not None])
                if phrase and q in ("step_ms", "tokens_per_s"):
                    phrase += _timing_noise(pairs, noise)
                phrases.append(phrase)
            shapes = sorted({(r.get("context"), r.get("batch")) for r, _ in pairs})
            listed = ", ".join(f"T={t} B={b}" for t, b in shapes[:6]) + (", ..." if len(shapes) > 6 else "")
            where = f" ({len(pairs)} row pair{'s' * (len(pairs) > 1)} at {listed})"
            s = describe_changes(f"{mode}: {field}={label}", f"{field}={base}{where}", phrases)
            if s:
                out.append(s)
    return out


def row_stats(row: dict, q: str) -> Stats | None:
    """A bench row's quantity as Stats over its timed steps (memory: one exact value; tokens/s = B·T / step time,
    so its spread is the step time's, scaled)."""
    v, sd = row.get(q), sample_std(row)
    if not isinstance(v, (int, float)):
        return None
    if q == "memory_gb" or sd is None:
        return Stats(1, v, 0.0, v, v, (row["run"], q))
    return Stats(row["timed_steps"], v, sd if q == "step_ms" else v * sd / row["step_ms"], v, v, (row["run"], q))


def _step_test(row: dict, base: dict):
    """Welch's test of two rows' mean step times (each over its timed steps; one step: no p-value)."""
    a, b = (row_stats(r, "step_ms") for r in (row, base))
    return welch(a.mean, a.std, a.n, b.mean, b.std, b.n)


def _timing_noise(pairs: list[tuple[dict, dict]], noise: Family) -> str:
    """' (beyond noise in 2 of 3 row pairs)' from the step-time tests of the pairs (throughput is B·T / step time)."""
    timed = [(r, b) for r, b in pairs if all(isinstance(x.get("step_ms"), (int, float)) for x in (r, b))]
    verdicts = [noise.beyond(_step_test(r, b), key=("step", r["run"], b["run"], r.get("context"), r.get("batch")))
                for r, b in timed]
    tested = [v for v in verdicts if v is not None]
    if not tested:
        return " (one timed step: noise unknown)"
    if len(tested) == 1:
        return " (beyond noise)" if tested[0] else " (within noise)"
    return f" (beyond noise in {sum(tested)} of {len(tested)} row pairs)"


def bench_scaling_sentences(rows: list[dict]) -> list[str]:
    """How memory and throughput grow along context and batch, per setting (ok rows only)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    out = []
    for axis, other in (("context", "batch"), ("batch", "context")):
        groups: dict[tuple, dict] = {}
        for r in ok:
            groups.setdefault(_setting(r, axis, "params", "flops_per_step", "compiled"), {})[r[axis]] = r
        for key, by_x in groups.items():
            if len(by_x) < 3:
                continue
            xs = sorted(by_x)
            a, b = by_x[xs[0]], by_x[xs[-1]]
            k = dict(key)
            parts = []
            if a.get("memory_gb") and b.get("memory_gb"):
                what = MEMORY_TITLES.get(b.get("memory_source"), "memory")
                parts.append(f"{what} grew {b['memory_gb'] / a['memory_gb']:.1f}x "
                             f"({fmt(a['memory_gb'] * 1e9, 'bytes')} to {fmt(b['memory_gb'] * 1e9, 'bytes')})")
            if a.get("tokens_per_s") and b.get("tokens_per_s"):
                parts.append(f"throughput changed {b['tokens_per_s'] / a['tokens_per_s']:.2f}x "
                             f"({fmt(a['tokens_per_s'], 'count')} to {fmt(b['tokens_per_s'], 'count')} tokens/s)")
            if parts:
                attention = "" if k.get("attention") in (None, "xla") else " " + k["attention"]
                remat = "" if k.get("remat") in (None, "none") else " remat=" + k["remat"]
                out.append(f"{k.get('mode')} {k.get('dtype')}{attention}{remat}, {other} {k.get(other)}: "
                           f"from {axis} {xs[0]} to {xs[-1]} ({xs[-1] / xs[0]:.0f}x) " + " and ".join(parts) + ".")
    return out


def memory_source(row: dict) -> str:
    """Where a row's memory figure comes from, in words: 'compiled for h100-80gb', 'XLA:CPU compiled estimate'."""
    src = row.get("memory_source")
    if src == "memory_analysis":
        return f"XLA:{str(row.get('device') or 'cpu').upper()} compiled estimate"
    return MEMORY_TITLES.get(src, str(src))


def _fit(xs: list[float], ys: list[float], degree: int) -> tuple[list[float], float]:
    """Least-squares polynomial coefficients (constant first) and the largest residual relative to y."""
    import numpy as np

    A = np.vander(np.asarray(xs), degree + 1, increasing=True)
    coef, *_ = np.linalg.lstsq(A, np.asarray(ys), rcond=None)
    worst = float(np.max(np.abs(A @ coef - ys) / np.asarray(ys)))
    return [float(c) for c in coef], worst


def fit_memory_points(rows: list[dict], axis: str, fixed: str, degree: int) -> dict[tuple, tuple[list, list, list]]:
    """(mode, dtype, fixed value, memory source) -> (xs, polynomial coefficients constant first, ys in bytes) of the
    ok rows with a memory figure, three xs or more. The source is in the key so one fit never pools two compilers'
    figures; two runs of one step (a context sweep's batch 4 inside a batch sweep) are one point, averaged."""
    groups: dict[tuple, dict[float, list[float]]] = {}
    for r in rows:
        if (r.get("status") == "ok" and isinstance(r.get("memory_gb"), (int, float))
                and r.get("remat") in (None, "none")):
            key = (r.get("mode"), r.get("dtype"), r.get(fixed), memory_source(r))
            groups.setdefault(key, {}).setdefault(float(r[axis]), []).append(r["memory_gb"] * 1e9)
    out = {}
    for key, by_x in groups.items():
        if len(by_x) >= 3:
            xs = sorted(by_x)
            ys = [sum(by_x[x]) / len(by_x[x]) for x in xs]
            out[key] = (xs, _fit(xs, ys, degree)[0], ys)
    return out


def fit_memory_batch(rows: list[dict]) -> tuple[str, str]:
    """memory = a + b * batch per (mode, dtype, context): agree when the line explains >= 99 % of the variance (R²)."""
    fitted = fit_memory_points(rows, "batch", "context", 1)
    if not fitted:
        return "no memory-vs-batch rows", "not resolved at this size"
    parts, linear = [], True
    for (mode, dtype, context, source), (xs, (a, b), ys) in fitted.items():
        residuals = [y - (a + b * x) for x, y in zip(xs, ys)]
        mean = sum(ys) / len(ys)
        r2 = 1 - sum(e * e for e in residuals) / sum((y - mean) ** 2 for y in ys)
        worst = max(abs(e) for e in residuals)
        linear &= r2 >= 0.99
        parts.append(f"{mode} {dtype}, context {context} ({source}): {fmt(a, 'bytes')} + {fmt(b, 'bytes')} per "
                     f"sequence, batch {xs[0]:.0f}-{xs[-1]:.0f}, R² {r2:.4f} (largest deviation {fmt(worst, 'bytes')}, "
                     f"{100 * worst / max(ys):.1f}% of the largest figure)")
    return "; ".join(parts), "agree" if linear else "disagree"


def fit_memory_context(rows: list[dict]) -> tuple[str, str]:
    """memory = a + b T + c T^2 per (mode, dtype, batch): agree when c > 0 and the T^2 term is >= 10 % at the
    longest T."""
    fitted = fit_memory_points(rows, "context", "batch", 2)
    if not fitted:
        return "no memory-vs-context rows", "not resolved at this size"
    parts, faster = [], True
    for (mode, dtype, batch, source), (xs, (a, b, c), ys) in fitted.items():
        worst, worst_line = (_fit(xs, ys, d)[1] for d in (2, 1))
        share = c * xs[-1] ** 2 / ys[-1]
        faster &= c > 0 and share >= 0.10
        parts.append(f"{mode} {dtype}, batch {batch} ({source}): {fmt(a, 'bytes')} + {fmt(b, 'bytes')}·T + "
                     f"{c:.3g} B·T², the T² term {100 * share:.0f}% of the total at T={xs[-1]:.0f} (a straight line "
                     f"misses by up to {100 * worst_line:.0f}%, the quadratic by {100 * worst:.1f}%)")
    return "; ".join(parts), "agree" if faster else "disagree"
