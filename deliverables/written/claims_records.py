"""The claims that come from the studies' records: findings, generated reports, fits, hosts and models.

Each function maps claim keys to (value, source) from the committed records under ROOT (docs/results/PLAN/), as
the plans' reports were generated from them; deliverables.written.claims gathers them with the compiled and
analytic claims.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from deliverables.common import plan_runs
from deliverables.report.bench import fit_memory_points
from deliverables.report.charts import before_after_bars, bench_rows
from deliverables.report.sections.divergence import LEARNED_WITHIN, by_rate, edge, untrained_loss
from deliverables.report.seeds import group_settings
from deliverables.written.claims_studies import studies
from jaxlm.core.files import read_json

RUN_PAGE = Path("docs/report/learning_curve/report.md")  # the Shakespeare recipe's page (its sample, its loss)


def finding(root: Path, plan: str, words: str, pattern: str) -> float:
    """A number in a plan's findings.json: the first group of `pattern` in the finding whose claim has `words`."""
    rows = (read_json(root / plan / "findings.json", default=None) or {}).get("findings") or []
    text = next(r["measured"] for r in rows if words in r["claim"])
    return float(re.search(pattern, text).group(1))


FINDINGS = {  # key: (plan, words of the claim, pattern)
    "remat_loss": ("optimizations", "rematerialisation", r"^([\d.]+) ±"),
    "lora_r8_loss": ("peft", "LoRA comes close", r"lora_r8 ([\d.]+)"),
    "full_ft_loss": ("peft", "LoRA comes close", r"full ([\d.]+)"),
    "lora_gap": ("peft", "LoRA comes close", r"\(\+([\d.]+)%"),
    "qlora_loss": ("peft", "NF4", r"qlora_r16 ([\d.]+)"),
    "lora_r16_loss": ("peft", "NF4", r"vs lora_r16 ([\d.]+)"),
    "int8_loss": ("quantization", "int8", r"int8 PTQ ([\d.]+)"),
    "ptq_f32_loss": ("quantization", "int8", r"float32 ([\d.]+)"),
    "qat_loss": ("quantization", "QAT", r"at int4 ([\d.]+)"),
    "ptq4_loss": ("quantization", "QAT", r"float32 ([\d.]+)"),
    "size_xs_loss": ("model_size", "bigger", r"xs \(\w+ params\): ([\d.]+)"),
    "size_l_loss": ("model_size", "bigger", r"l \(\w+ params\): ([\d.]+)"),
    "nope_gap": ("ablations", "NoPE", r"\(\+([\d.]+)%"),
    "silu_gap": ("ablations", "SwiGLU", r"\(\+([\d.]+)%"),
    "ctx_range": ("context_length", "context length", r"range ([\d.]+)%"),
    "batch1_loss": ("batch_size", "larger batches", r"batch 1: ([\d.]+)"),
    "batch32_loss": ("batch_size", "larger batches", r"batch 32: ([\d.]+)"),
}

def patterns(root: Path) -> dict[str, tuple[float, str]]:
    return {k: (finding(root, plan, words, pat), f"{root}/{plan}/findings.json")
            for k, (plan, words, pat) in FINDINGS.items()}


def fits(root: Path) -> dict[str, tuple[float, str]]:
    """Memory against context of the profiling plan, fitted per source: the T² term's share at the longest T."""
    rows = [r for r in bench_rows(plan_runs(root, "profiling")) if r.get("mode") == "train_step"]
    out = {}
    for (mode, dtype, _, source), (xs, coef, ys) in fit_memory_points(rows, "context", "batch", 2).items():
        key = "cpu" if source.startswith("XLA:CPU") else "h100" if "h100" in source else None
        if key and dtype == "float32":
            out[f"fit_t2_share_{key}"] = (100 * coef[2] * xs[-1] ** 2 / ys[-1], f"{root}/profiling records")
    return out


def lr(root: Path) -> dict[str, tuple[float, str]]:
    sweep = plan_runs(root, "lr_sweep")
    by = dict(by_rate(sweep))
    e = edge(list(by.items()), untrained_loss(sweep))
    src = f"{root}/lr_sweep records"
    broken_acc = [a for r in by[e["broken"]] if (a := (r.get("metrics") or {}).get("eval_acc")) is not None]
    lo, hi = e["threshold_range"]
    return {"lr_threshold": (LEARNED_WITHIN, "deliverables.report.sections.divergence"),
            "lr_broken_acc": (100 * max(broken_acc) / e["best_acc"], src), "lr_best": (e["best"], src),
            "lr_best_loss": (e["best_loss"], src), "lr_best_acc": (100 * e["best_acc"], src),
            "lr_trained": (e["trained"], src), "lr_broken": (e["broken"], src), "lr_nonfinite": (e["nonfinite"], src),
            "lr_runs": (len(sweep), src), "lr_rates": (len(by), src), "lr_threshold_lo": (lo, src),
            "lr_threshold_hi": (hi, src)}


def cpu(root: Path) -> dict[str, tuple[float, str]]:
    """The profiling plan's batch sweep measured on the CPU (tokens/s span, XLA:CPU's plan at batch 4 and 8), the
    optimizations plan's seeds and its before/after of remat."""
    sweep = {r["batch"]: r for r in bench_rows(plan_runs(root, "profiling")) if r.get("run") == "batch_sweep"}
    tps = [r["tokens_per_s"] / 1e3 for r in sweep.values() if r.get("tokens_per_s")]
    plan = plan_runs(root, "optimizations")
    opt = group_settings([r for r in plan if r.get("kind") != "bench"])
    bars = before_after_bars(plan)
    src = f"{root} records"
    out = {"cpu_ktok_min": (min(tps), src), "cpu_ktok_max": (max(tps), src),
           "opt_seeds": (max(len(s.runs) for s in opt), src),
           "cpu_remat_pct": (100 * (bars["remat"]["step_ms"].mean / bars["float32"]["step_ms"].mean - 1), src)}
    for b in (4, 8):
        out[f"cpu_mem_b{b}_mb"] = (sweep[b]["memory_gb"] * 1e3, src)
    return out


def _loads(found: list[dict]) -> list[float]:
    keys = ("load_avg_1m_start", "load_avg_1m", "load_avg_1m_end")
    return [h[k] for r in found for h in [r.get("host") or {}] for k in keys if isinstance(h.get(k), (int, float))]


def hosts(root: Path) -> dict[str, tuple[float, str]]:
    """The 1-minute load of the host at the start and end of each plan's runs (and of the before/after runs)."""
    out = {}
    groups = {plan.name: plan_runs(root, plan.name) for plan in sorted(root.iterdir()) if (plan / "records").is_dir()}
    groups["before_after"] = [r for r in groups.get("optimizations", []) if r["name"].startswith("before_after")]
    small = root / "benchmarking" / "small-cpu.json"  # `small` timed alone (jaxlm.bench model --json)
    groups["small_cpu"] = [(read_json(small, default=None) or {}).get("meta") or {}]
    for name, found in groups.items():
        if loads := _loads(found):
            out[f"load_{name}_min"] = (min(loads), f"{root}/{name} records (host)")
            out[f"load_{name}_max"] = (max(loads), f"{root}/{name} records (host)")
    return out


def _params(found: list[dict], name: str) -> float:
    return next((r.get("metrics") or {})["params"] for r in found if r["name"] == name)


def models(root: Path, page: Path = RUN_PAGE) -> dict[str, tuple[float, str]]:
    """Table 1's parameter counts, as the runs recorded them, and the Shakespeare recipe's page."""
    profiling = next(r["params"] for r in bench_rows(plan_runs(root, "profiling")) if r.get("params"))
    size = plan_runs(root, "model_size")
    text = page.read_text() if page.is_file() else ""
    src = f"{root} records"
    out = {"params_profiling_k": (profiling / 1e3, src),
           "params_wikitext_m": (_params(plan_runs(root, "batch_size"), "b32-s0") / 1e6, src),
           "params_size_xs_m": (_params(size, "xs-s0") / 1e6, src),
           "params_size_l_m": (_params(size, "l-s0") / 1e6, src),
           "params_ablations_k": (_params(plan_runs(root, "ablations"), "baseline-s0") / 1e3, src)}
    if m := re.search(r"context \d+: ([\d,]+) parameters", text):
        out["params_recipe_k"] = (int(m.group(1).replace(",", "")) / 1e3, str(page))
    if m := re.search(r"\| final validation loss \| ([\d.]+) \|", text):
        out["recipe_val_loss"] = (float(m.group(1)), str(page))
    return out


def extras(root: Path) -> dict[str, tuple[float, str]]:
    """The study pages' numbers that are not in a report's words: parameter counts, the CPU before/after times,
    ln V of the sweep's vocabulary."""
    abl = plan_runs(root, "ablations")
    silu, base = _params(abl, "silu-s0"), _params(abl, "baseline-s0")
    bars = before_after_bars(plan_runs(root, "optimizations"))
    config = plan_runs(root, "lr_sweep")[0].get("config") or {}
    vocab, decay = (config.get("model") or {}).get("vocab_size"), (config.get("optim") or {}).get("weight_decay")
    src = f"{root} records"
    return {"abl_silu_params_k": (silu / 1e3, src), "abl_silu_fewer": (100 * (1 - silu / base), src),
            "lr_lnv": (math.log(vocab), src), "lr_weight_decay": (decay, src),
            **{f"cpu_ba_{k}_ms": (bars[k]["step_ms"].mean, src) for k in ("float32", "bfloat16", "remat")}}


def records(root: Path) -> dict[str, tuple[float, str]]:
    out = patterns(root) | fits(root) | lr(root) | cpu(root) | hosts(root) | models(root) | extras(root)
    return out | studies(root)
