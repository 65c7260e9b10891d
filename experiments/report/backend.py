"""What the backend behind a plan's rows can show, said with evidence recorded in the run itself, and
jaxlm.memory's estimate for an 80 GB H100 beside the CPU-measured rows (labelled as an estimate).

XLA's CPU backend is faithful for float32 results, not for memory or speed of bfloat16 and remat: its
compiled bfloat16 matmuls produce float32, and whether remat's recomputation survives compilation is
read from the compiled step (jaxlm.bench records the matmul count, their output dtypes and XLA's FLOPs).
"""

from __future__ import annotations

import re

from experiments.report.format import fmt, table
from jaxlm.core.errors import UserError

SECTION = "What this backend can show"
DEVICE = "h100-80gb"
TECHNIQUE_SENTENCE = re.compile(r"^(?:\w+: )?(?:bfloat16|remat\w*|dtype=bfloat16|remat=\w+) against .*memory")


def is_cpu(runs: list[dict]) -> bool:
    return any(r.get("device") == "cpu" for r in runs)


def _shape(r: dict) -> str:
    return f"{r.get('mode')} T={r.get('context')} B={r.get('batch')}"


def evidence(brows: list[dict]) -> list[str]:
    """Sentences on remat and bfloat16 from the compiled steps' recorded matmuls, FLOPs and memory estimates."""
    ok = [r for r in brows if r.get("status") == "ok" and r.get("device") == "cpu"]
    same = lambda r: (r.get("mode"), r.get("dtype"), r.get("attention"), r.get("context"), r.get("batch"))
    plain = {same(r): r for r in ok if r.get("remat") in (None, "none")}
    out = []
    for r in ok:
        b = plain.get(same(r))
        if r.get("remat") in (None, "none") or b is None or r.get("hlo_dots") is None or b.get("hlo_dots") is None:
            continue
        kept = r["hlo_dots"] > b["hlo_dots"]
        out.append(f"remat={r['remat']} ({_shape(r)}): the compiled step has {r['hlo_dots']} matmuls and "
                   f"{fmt(r.get('xla_flops'), 'count')} FLOPs against {b['hlo_dots']} and {fmt(b.get('xla_flops'), 'count')} "
                   f"without remat, so XLA:CPU {'keeps' if kept else 'removed'} the recomputation; its compiled memory "
                   f"estimate is {fmt(r.get('estimate_gb'), 'g')} GB against {fmt(b.get('estimate_gb'), 'g')} GB. "
                   "XLA:CPU schedules and frees buffers unlike a GPU, so this memory figure is not remat's effect there "
                   "(the GPU campaign measures it; the estimate below is what the policy should save).")
    for r in ok:
        dtypes = r.get("matmul_dtypes")
        if r.get("dtype") == "bfloat16" and dtypes:
            through = dtypes == ["f32"]
            out.append(f"bfloat16 ({_shape(r)}): the compiled step's {r.get('hlo_dots')} matmuls produce "
                       f"{', '.join(dtypes)}" + (", i.e. XLA:CPU computes bfloat16 through float32: neither memory nor "
                                                 "speed here is bfloat16's effect on a GPU." if through else "."))
    if not out and any(r.get("remat") not in (None, "none") or r.get("dtype") == "bfloat16" for r in ok):
        out.append("These records predate the recorded compiled-step evidence (matmul count and dtypes); rerun the "
                   "plan to have it.")
    return out


def annotate(sentences: list[str], cpu: bool) -> list[str]:
    """On a CPU, a sentence giving bfloat16's or remat's memory change says it is not the technique's effect."""
    if not cpu:
        return sentences
    note = f" On a CPU this memory figure is not the technique's effect (see *{SECTION}*)."
    return [s + note if TECHNIQUE_SENTENCE.search(s) else s for s in sentences]


def _bench_config(run: dict, row: dict):
    from jaxlm.bench.core import Setting
    from jaxlm.core.config import load_config

    spec = run.get("spec") or {}
    overrides = [f"{k}={_toml(v)}" for k, v in (spec.get("set") or {}).items() if k.split(".")[0] in ("model", "compute")]
    cfg = load_config(None, overrides, preset=(spec.get("args") or {}).get("preset"))
    setting = Setting(mode=row["mode"], dtype=row["dtype"], attention=row.get("attention") or "xla",
                      remat=row.get("remat") or "none")
    return setting.configs(cfg.model, row["context"])


def _toml(v) -> str:
    import json

    return json.dumps(v) if not isinstance(v, bool) else str(v).lower()


def _estimate_row(label: str, cfg, compute, batch: int, context: int, mode: str, measured: str) -> list:
    from jaxlm.analysis import memory

    est = memory.estimate(cfg, batch, context, compute, mode).total
    cap = memory.DEVICES[DEVICE] * memory.DEFAULT_USABLE
    return [label, str(context), str(batch), measured, fmt(est, "bytes"),
            str(memory.largest_batch(cfg, context, cap, compute, mode))]


def estimate_table(runs: list[dict], brows: list[dict]) -> str | None:
    """Each CPU-measured row beside jaxlm.memory's estimate for an 80 GB H100 (an estimate, not measured)."""
    from jaxlm.analysis import memory
    from jaxlm.core.config import ComputeConfig, ModelConfig

    rows = []
    by_name = {r["name"]: r for r in runs}
    for row in brows:
        if row.get("status") != "ok" or row.get("device") != "cpu" or row.get("framework", "jax") != "jax":
            continue
        try:
            cfg, compute = _bench_config(by_name.get(row["run"], {}), row)
        except (KeyError, TypeError, ValueError, UserError):  # a record without the fields to rebuild its model
            continue
        what = {"memory_analysis": "compiled estimate", "memory_stats": "peak device memory"}.get(row.get("memory_source"), "?")
        gb = row.get("memory_gb")
        measured = f"{fmt(gb * 1e9, 'bytes')} ({what})" if isinstance(gb, (int, float)) else "-"
        rows.append(_estimate_row(f"`{row['run']}` {row['mode']} {row['dtype']} {row.get('attention')} remat={row.get('remat')}",
                                  cfg, compute, row["batch"], row["context"], row["mode"], measured))
    for r in runs:
        c = r.get("config") or {}
        if r.get("kind") == "bench" or not c or r.get("device") != "cpu" or r.get("status") != "ok":
            continue
        try:
            cfg, compute, batch = ModelConfig(**c["model"]), ComputeConfig(**c.get("compute", {})), c["data"]["batch_size"]
        except (KeyError, TypeError, ValueError, UserError):
            continue
        measured = f"{fmt(r.get('max_rss_bytes'), 'bytes')} (peak host RSS)" if r.get("max_rss_bytes") else "-"
        rows.append(_estimate_row(f"`{r['name']}`", cfg, compute, batch, cfg.context_length,
                                  "train_step", measured))
    if not rows:
        return None
    return (f"Beside each CPU-measured row, `python -m jaxlm.memory`'s estimate of the same step on an 80 GB H100 "
            f"(`--device {DEVICE}`, {100 * memory.DEFAULT_USABLE:.0f}% usable): an **estimate**, not a measurement.\n\n"
            + table(["run", "context", "batch", "measured here", "H100 estimate (peak)", "H100 estimate (largest batch)"], rows))


def section(runs: list[dict], brows: list[dict]) -> list[str]:
    """The report section, on CPU runs only."""
    if not is_cpu(runs):
        return []
    lines = [f"## {SECTION}", "", "This plan ran on a CPU. XLA's CPU backend gives faithful float32 results and a "
             "faithful compiled memory estimate for float32 without remat; what it shows of bfloat16 and remat is "
             "stated here from the compiled steps themselves. Memory figures say what they are: *compiled estimate* "
             "(XLA's memory_analysis of the step), *peak host RSS* (the whole process, measured by the runner), "
             "*peak device memory* (an accelerator's allocator).", ""]
    found = evidence(brows)
    lines += [f"- {s}" for s in found] + ([""] if found else [])
    est = estimate_table(runs, brows)
    return lines + ([est, ""] if est else [])
