"""Reading what runs leave behind: metrics.jsonl (by `METRICS`: jaxlm.training.loop's names), bench JSON,
result.json."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from jaxlm.core.files import read_json

RESULT = "result.json"
DONE_STATUSES = ("ok", "diverged", "skipped")  # a run with one of these is complete; "failed" is retried

# Quantity -> the metric that holds it in metrics.jsonl.
METRICS: dict[str, str] = {
    "train_loss": "train/loss",
    "eval_loss": "eval/loss",
    "eval_ppl": "eval/perplexity",
    "eval_acc": "eval/accuracy",
    "eval_tokens": "eval/tokens",
    "tokens_per_s": "perf/tokens_per_s",
    "step_time": "perf/step_time_s",
    "peak_memory": "perf/peak_memory_bytes",
    "lr": "train/lr",
}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl, less lines that are not JSON (a torn last line, bytes that are not UTF-8). A
    resumed run appends again from its checkpoint's step: a record whose step does not advance replaces the earlier
    records of its kind from that step on."""
    records = []
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # also a blank line
            continue
        if not isinstance(rec, dict):
            continue
        step, kind = rec.get("step"), rec.get("kind")
        if isinstance(step, (int, float)):
            records = [r for r in records
                       if not (r.get("kind") == kind and isinstance(r.get("step"), (int, float)) and r["step"] >= step)]
        records.append(rec)
    return records


def series(records: list[dict], quantity: str) -> tuple[list[float], list[float], list[float]]:
    """(steps, values, seconds since the first record) of every record carrying `quantity` (a `METRICS` key, or a
    metric name)."""
    key = METRICS.get(quantity, quantity)
    rows = [r for r in records if _number(r.get(key)) and isinstance(r.get("step"), (int, float))]
    t0 = next((r["time"] for r in records if isinstance(r.get("time"), (int, float))), None)
    times = [float(r["time"]) - t0 if isinstance(r.get("time"), (int, float)) else float("nan") for r in rows]
    return [float(r["step"]) for r in rows], [float(r[key]) for r in rows], times


def has_nonfinite_loss(records: list[dict]) -> bool:
    losses = (r.get(METRICS[q]) for r in records for q in ("train_loss", "eval_loss"))
    return any(_number(v) and not math.isfinite(v) for v in losses)


def summarise_train(records: list[dict]) -> dict[str, Any]:
    """Final numbers of a training run: last losses, last evaluation, median throughput, max memory."""
    out: dict[str, Any] = {}
    values = lambda q: series(records, q)[1]
    if steps := [r["step"] for r in records if isinstance(r.get("step"), (int, float))]:
        out["steps"] = int(max(steps))
    for q in ("train_loss", "eval_loss", "eval_ppl", "eval_acc", "eval_tokens"):
        if found := values(q):
            out[q] = found[-1]
    if finite := [v for v in values("eval_loss") if math.isfinite(v)]:
        out["best_eval_loss"] = min(finite)
    for q in ("tokens_per_s", "step_time"):
        found = values(q)
        # The first logged window includes compilation: leave it out when there is more than one.
        if found := [v for v in (found[1:] if len(found) > 1 else found) if math.isfinite(v)]:
            out[q] = statistics.median(found)
    if mem := values("peak_memory"):
        out["peak_memory"] = max(mem)
    # The rows' times per invocation of the trainer (each begins at a "start" row): the wall time of a run resumed
    # hours later counts its invocations, not the gap between them.
    segments: list[list[float]] = [[]]
    for r in records:
        if r.get("kind") == "start" and segments[-1]:
            segments.append([])
        if isinstance(r.get("time"), (int, float)):
            segments[-1].append(r["time"])
    if sum(len(times) for times in segments) > 1:
        out["logged_time_s"] = sum(max(times) - min(times) for times in segments if times)
    if changes := [(r["step"], r["changed"]) for r in records if r.get("kind") == "start" and r.get("changed")]:
        out["config_changes"] = changes
    return out


def load_bench(path: Path) -> tuple[list[dict], dict]:
    """(rows, meta) of a `jaxlm.bench model --json` file, {"meta": {...}, "rows": [...]}; ([], {}) for anything else."""
    data = read_json(path, default=None)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return [], {}
    return [r for r in data["rows"] if isinstance(r, dict)], data.get("meta") or {}


def load_results(plan_dir: Path) -> list[dict]:
    """Every run's result.json under a plan directory, in the plan's order when plan.json lists it."""
    found = {}
    for p in sorted(Path(plan_dir).glob(f"*/{RESULT}")):
        r = read_json(p, default=None)
        if isinstance(r, dict):
            r["_dir"] = str(p.parent)
            found[r.get("name", p.parent.name)] = r
    meta = read_json(Path(plan_dir) / "plan.json", default=None) or {}
    ordered = [found.pop(r["name"]) for r in meta.get("runs", []) if r["name"] in found]
    return ordered + [found[n] for n in sorted(found)]
