"""The claims that come from the studies' records: findings, the plans' generated reports, fits, hosts and models.

Each function maps claim keys to (value, source) from the committed records under ROOT (docs/results/PLAN/), as the
plans' reports were generated from them; a study page (docs/studies/*.md) restates a few numbers of its plan's
report, read back here from that report, so it cannot drift from its records. deliverables.written.claims gathers
them with the compiled and analytic claims.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from deliverables.answers.measured import loads
from deliverables.common import plan_runs
from deliverables.report.bench import fit_memory_points
from deliverables.report.charts import before_after_bars, bench_rows
from deliverables.report.sections.divergence import LEARNED_WITHIN, by_rate, edge, untrained_loss
from deliverables.report.seeds import group_settings
from jaxlm.core.files import read_json

RUN_PAGE = Path("docs/report/learning_curve/report.md")  # the Shakespeare recipe's page (its sample, its loss)


FINDINGS = {  # key: (plan, words of the claim, pattern) in the plan's findings.json
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
_LOSS = r"validation loss ([\d.]+) ± [\d.]+ against ([\d.]+) ± [\d.]+ \([-+]([\d.]+)%"  # the change unsigned
_CELLS = (  # (plan, a table row's name, cells skipped, unit, key): the number in `unit` after the skipped cells
    ("context_length", "ctx32", 11, "ms", "ctx_32_ms"), ("context_length", "ctx256", 11, "ms", "ctx_256_ms"),
    ("model_size", "xs", 11, "ms", "size_xs_ms"), ("model_size", "l", 11, "ms", "size_l_ms"),
    ("optimizations", "float32_b128-s0", 3, "MiB", "opt_h100_f32_mib"),
    ("optimizations", "bfloat16_b128-s0", 3, "MiB", "opt_h100_bf16_mib"),
    ("optimizations", "remat_b128-s0", 3, "MiB", "opt_h100_remat_mib"),
    ("optimizations", "before_after_float32", 3, "GiB", "opt_ba_f32_gib"),
    ("optimizations", "before_after_bfloat16", 3, "GiB", "opt_ba_bf16_gib"),
    ("optimizations", "before_after_remat", 3, "MiB", "opt_ba_remat_mib"),
    ("peft", r"pretrain` \.\.\. `full-s2", 3, "MiB", "peft_full_mib"),
    ("peft", "lora_r4-s0", 3, "MiB", "peft_r4_mib"), ("peft", "lora_r64-s0", 3, "MiB", "peft_r64_mib"))
STUDIES = [  # (plan, pattern in its report.md, the key of each group; None skips a group)
    ("ablations", rf"`nope` against `baseline`: {_LOSS}", ("abl_nope", "abl_base")),
    ("ablations", rf"`silu` against `baseline`: {_LOSS}", ("abl_silu",)),
    ("ablations", rf"`post_norm` against `baseline`: {_LOSS}", ("abl_post", None, "abl_post_gap")),
    ("ablations", rf"`no_norm` against `baseline`: {_LOSS}", ("abl_nonorm", None, "abl_nonorm_gap")),
    ("ablations", rf"`no_norm_lr0.01` against `baseline_lr0.01`: {_LOSS}",
     ("abl_nonorm_lr", "abl_base_lr", "abl_nonorm_lr_gap")),
    ("batch_size", r"batch 8: ([\d.]+) ±", ("bs_b8_loss",)),
    ("batch_size", r"whole run of data.batch_size=1\): data.batch_size=8 [^(]*\(\+([\d.]+)%", ("bs_eq1_gap",)),
    ("batch_size", r"whole run of data.batch_size=8\): data.batch_size=32 [^(]*\(\+([\d.]+)%", ("bs_eq8_gap",)),
    ("batch_size", r"2nd half\): batch 1: ([\d.]+), batch 8: [\d.]+, batch 32: ([\d.]+)",
     ("bs_jitter_b1", "bs_jitter_b32")),
    ("batch_size", r"step time batch 1: ([\d.]+) ±.*?batch 32: ([\d.]+) ±", ("bs_step_b1_ms", "bs_step_b32_ms")),
    ("batch_size", r"Largest batch within an estimated ([\d.]+) GB \(max_batch[^)]*\): (\d+)",
     ("bs_maxbatch_gb", "bs_maxbatch")),
    *(("context_length", rf"context {t}: ([\d.]+) ±", (f"ctx_{t}_loss",)) for t in (32, 64, 256)),
    *(("lr_sweep", rf"lr {lr}: ([\d.]+) ±", (f"lr_{k}_loss",))
      for k, lr in (("003", "0.003"), ("01", "0.1"), ("20", "20"))),
    ("lr_sweep", r"the next, `lr0.003`: validation loss [^(]*\(\+([\d.]+)%", ("lr_003_gap",)),
    ("lr_sweep", r"the [\d.]+ used here is ([\d.]+) nats from moving it", ("lr_margin",)),
    ("model_size", r"\bs \(\w+ params\): ([\d.]+)", ("size_s_loss",)),
    ("model_size", r"m \(\w+ params\): ([\d.]+)", ("size_m_loss",)),
    ("model_size", r"the next, `m`: validation loss [^(]*\(\+([\d.]+)%", ("size_m_gap",)),
    ("peft", r"LoRA rank 8 trained ([\d.]+) % of the parameters with ([\d.]+) %", ("peft_r8_share", "peft_r8_mem")),
    ("peft", r"r4: ([\d.]+) ±", ("peft_r4_loss",)),
    ("peft", r"r64: ([\d.]+) ± [\d.]+; range ([\d.]+)%", ("peft_r64_loss", "peft_rank_range")),
    ("peft", r"frozen weights at ([\d.]+) bytes per parameter \(float32: 4\), ([\d.]+) MiB",
     ("peft_nf4_bytes", "peft_nf4_mib")),
    ("peft", r"qlora_r16 [\d.]+ ± [\d.]+ vs lora_r16 [\d.]+ ± [\d.]+ \(\+([\d.]+)%", ("qlora_gap",)),
    *(("quantization", rf"float32 with {b} \(PTQ\) weights: [^,]*, \+([\d.]+) ±.*?weights ([\d.]+)x smaller",
       (f"q_{b}_diff", f"q_{b}_ratio")) for b in ("int8", "int4")),
    ("quantization", r"QAT w4a8 at int4 [\d.]+ ± [\d.]+ vs [^(]*\(\+([\d.]+)%", ("q_qat_gap",)),
    ("optimizations", rf"`window16_b32` against `float32_b32`: {_LOSS}", (None, None, "opt_window_b32")),
    ("optimizations", r"Largest batch within an estimated ([\d.]+) GB", ("opt_maxbatch_gb",)),
    ("profiling", r"context 256 \(XLA:CPU compiled estimate\): ([\d.]+) MiB \+ ([\d.]+) MiB per",
     ("prof_batch_a", "prof_batch_b")),
    ("profiling", r"per sequence, batch [\d-]+, R² ([\d.]+) \(largest deviation [\d.]+ MiB, ([\d.]+)%",
     ("prof_batch_r2", "prof_batch_dev")),
    *(("parallelism", rf"memory_small: {mesh} holds ([\d.]+)", (f"par_{k}_share",))
      for k, mesh in (("fsdp", "fsdp=8"), ("tp", "data=2,tensor=4"), ("pp", "data=2,pipeline=4"))),
    ("parallelism", r"dp_on: data=8 ran \d+ tokens/s against one device's \d+ \(([\d.]+)x\)", ("par_dp_speed",)),
    *(("parallelism", rf"with {m} micro-batch(?:es)? lost (\d+) % [^(]*\(analytic GPipe bubble (\d+) %",
       (f"par_bubble_m{m}", f"par_bubble_m{m}_gpipe")) for m in (1, 4, 8)),  # the pipeline bubble, measured
    *((plan, rf"\| `{row}`[^|]*\|" + r"[^|]*\|" * skip + rf" ([\d.]+) {unit}", (key,))
      for plan, row, skip, unit, key in _CELLS),
]
SCALE = {"bs_step_b1_ms": 1e3, "bs_step_b32_ms": 1e3}  # the report's seconds, the page's milliseconds


def reported(root: Path) -> dict[str, tuple[float, str]]:
    """Every FINDINGS number in its plan's findings.json (the first group of its pattern in the finding whose claim
    has its words) and every STUDIES number in its plan's report."""
    out, texts = {}, {}
    for key, (plan, words, pattern) in FINDINGS.items():
        rows = (read_json(root / plan / "findings.json", default=None) or {}).get("findings") or []
        text = next(r["measured"] for r in rows if words in r["claim"])
        out[key] = float(re.search(pattern, text).group(1)), f"{root}/{plan}/findings.json"
    for plan, pattern, keys in STUDIES:
        text = texts.setdefault(plan, (root / plan / "report.md").read_text())
        if m := re.search(pattern, text):
            for key, value in zip(keys, m.groups()):
                if key:
                    out[key] = float(value) * SCALE.get(key, 1), f"{root}/{plan}/report.md (from its records)"
    return out


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


def hosts(root: Path) -> dict[str, tuple[float, str]]:
    """The 1-minute load of the host at the start and end of each plan's runs (and of the before/after runs)."""
    out = {}
    groups = {plan.name: plan_runs(root, plan.name) for plan in sorted(root.iterdir()) if (plan / "records").is_dir()}
    groups["before_after"] = [r for r in groups.get("optimizations", []) if r["name"].startswith("before_after")]
    small = root / "benchmarking" / "small-cpu.json"  # `small` timed alone (jaxlm.bench model --json)
    groups["small_cpu"] = [(read_json(small, default=None) or {}).get("meta") or {}]
    for name, found in groups.items():
        if load := [x for r in found for x in loads(r.get("host") or {})]:
            out[f"load_{name}_min"] = (min(load), f"{root}/{name} records (host)")
            out[f"load_{name}_max"] = (max(load), f"{root}/{name} records (host)")
    return out


def _params(found: list[dict], name: str) -> float:
    return next((r.get("metrics") or {})["params"] for r in found if r["name"] == name)


def recorded(root: Path, page: Path = RUN_PAGE) -> dict[str, tuple[float, str]]:
    """The runs' own numbers: the profiling plan's batch sweep measured on the CPU (tokens/s span, XLA:CPU's plan at
    batch 4 and 8), the optimizations plan's seeds and before/after times, Table 1's parameter counts as the runs
    recorded them, ln V and the weight decay of the sweep; and the Shakespeare recipe's page."""
    rows = bench_rows(plan_runs(root, "profiling"))
    sweep = {r["batch"]: r for r in rows if r.get("run") == "batch_sweep"}
    tps = [r["tokens_per_s"] / 1e3 for r in sweep.values() if r.get("tokens_per_s")]
    plan = plan_runs(root, "optimizations")
    bars = before_after_bars(plan)
    size, abl = plan_runs(root, "model_size"), plan_runs(root, "ablations")
    silu, base = _params(abl, "silu-s0"), _params(abl, "baseline-s0")
    config = plan_runs(root, "lr_sweep")[0].get("config") or {}
    values = {"cpu_ktok_min": min(tps), "cpu_ktok_max": max(tps),
              "opt_seeds": max(len(s.runs) for s in group_settings([r for r in plan if r.get("kind") != "bench"])),
              "cpu_remat_pct": 100 * (bars["remat"]["step_ms"].mean / bars["float32"]["step_ms"].mean - 1),
              **{f"cpu_mem_b{b}_mb": sweep[b]["memory_gb"] * 1e3 for b in (4, 8)},
              **{f"cpu_ba_{k}_ms": bars[k]["step_ms"].mean for k in ("float32", "bfloat16", "remat")},
              "params_profiling_k": next(r["params"] for r in rows if r.get("params")) / 1e3,
              "params_wikitext_m": _params(plan_runs(root, "batch_size"), "b32-s0") / 1e6,
              "params_size_xs_m": _params(size, "xs-s0") / 1e6, "params_size_l_m": _params(size, "l-s0") / 1e6,
              "params_ablations_k": base / 1e3, "abl_silu_params_k": silu / 1e3,
              "abl_silu_fewer": 100 * (1 - silu / base),
              "lr_lnv": math.log((config.get("model") or {}).get("vocab_size")),
              "lr_weight_decay": (config.get("optim") or {}).get("weight_decay")}
    out = {k: (v, f"{root} records") for k, v in values.items()}
    text = page.read_text() if page.is_file() else ""
    if m := re.search(r"context \d+: ([\d,]+) parameters", text):
        out["params_recipe_k"] = (int(m.group(1).replace(",", "")) / 1e3, str(page))
    if m := re.search(r"\| final validation loss \| ([\d.]+) \|", text):
        out["recipe_val_loss"] = (float(m.group(1)), str(page))
    return out


def records(root: Path) -> dict[str, tuple[float, str]]:
    return reported(root) | fits(root) | lr(root) | hosts(root) | recorded(root)
