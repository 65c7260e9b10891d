"""Every number the written report states, computed from its source, so a test holds the text to it (docs/report.md)."""

from __future__ import annotations

import math
import re
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

from deliverables.answers import accounting
from deliverables.answers import predicted as answers
from deliverables.answers.measured import loads
from deliverables.common import COURSE_MEMORY, plan_runs, table
from deliverables.compiled_memory import cached, cached_at_largest
from deliverables.compiled_time import stored
from deliverables.report.bench import fit_memory_points
from deliverables.report.charts import before_after_bars, bench_rows
from deliverables.report.sections.divergence import LEARNED_WITHIN, by_rate, edge, untrained_loss
from deliverables.report.seeds import group_settings
from jaxlm import cli
from jaxlm.analysis import flops, memory
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.files import read_json

RESULTS = Path("docs/results")
RUN_PAGE = Path("docs/report/learning_curve/report.md")  # the Shakespeare recipe's page (its sample, its loss)
GIB = 2**30


class Claim(NamedTuple):
    value: float
    source: str


def attention_share(t: int) -> float:
    """% of one sequence's float32 train-step activations that are attention scores (jaxlm.memory, `small`)."""
    est = memory.estimate(ModelConfig.from_name("small", context_length=t), 1, t, ComputeConfig())
    return 100 * sum(v for k, v in est.activations.items() if k.endswith("attention scores")) / est.activation_total


# The courses' training targets, from their handouts: CS336 assignment 1 (TinyStories, 327,680,000 tokens:
# batch 32 x context 256 x 40,000 steps) and CSE599-O assignment 1 (32 x 5000 x 256 tokens; its CPU/MPS path
# 40M tokens).
HANDOUTS = {"target_loss": (1.45, "CS336 assignment 1"), "cs336_tokens": (32 * 256 * 40_000, "CS336 assignment 1"),
            "cse_tokens": (32 * 5000 * 256, "CSE599-O assignment 1"), "cse_typical": (2.0, "CSE599-O assignment 1"),
            "cse_encouraged": (1.45, "CSE599-O assignment 1"), "cse_cpu_target": (2.0, "CSE599-O assignment 1"),
            "cse_cpu_tokens": (40e6, "CSE599-O assignment 1")}


def analytic() -> dict[str, Claim]:
    xl = accounting.model("gpt2-xl")
    per_seq, fixed = accounting.peak_terms(xl, 1024)
    src = "jaxlm.analysis (flops, memory) and the answers module"
    out = {k: Claim(v, f"the {where} handout") for k, (v, where) in HANDOUTS.items()}
    return out | {"usable_share": Claim(100 * memory.DEFAULT_USABLE, "jaxlm.analysis.memory.DEFAULT_USABLE"),
                  "attn_share_256": Claim(attention_share(256), src),
                  "attn_share_1024": Claim(attention_share(1024), src),
                  "xl_params": Claim(flops.param_counts(xl)["total"], src),
                  "xl_fwd_tflop": Claim(flops.forward_flops(xl, 1024).total / 1e12, src),
                  "xl_gb_per_seq": Claim(per_seq / 1e9, src), "xl_gb_fixed": Claim(fixed / 1e9, src),
                  "xl_batch_80gb": Claim(accounting.max_batch(fixed, per_seq, COURSE_MEMORY), src),
                  "xl_a100_days": Claim(accounting.training_days("a100", "float32")[1], src),
                  "params_small_m": Claim(flops.param_counts(accounting.model("small"))["total"] / 1e6, src),
                  "params_large_m": Claim(flops.param_counts(accounting.model("large"))["total"] / 1e6, src)}


TECHNIQUES = {"float32": "f32", "bfloat16": "bf16", "bfloat16 + remat full": "bf16_remat",
              "bfloat16 + cuDNN": "bf16_cudnn", "bfloat16 + cuDNN + remat full": "bf16_cudnn_remat"}


def compiled(root: Path) -> dict[str, Claim]:
    """The H100-compiled plans (GiB), the largest batches by compiling, the sweeps of `small`."""
    src = f"{root}/compiled/h100-80gb.json (XLA's GPU compiler, not measured)"
    got = lambda section: cached(section, "h100-80gb", root / "compiled")  # noqa: E731
    tech, ctx, bat, chunk = got("techniques-small"), got("context"), got("batch"), got("loss-chunk")
    out = {f"tech_{k}": Claim(tech[label]["total_bytes"] / GIB, src) for label, k in TECHNIQUES.items()
           if label in tech}
    at = cached_at_largest("largest-batch", "h100-80gb", root / "compiled")
    for label, k in TECHNIQUES.items():
        if label in at:
            n, row = at[label]
            out[f"largest_{k}"] = Claim(n, src)
            out[f"largest_{k}_estimate"] = Claim(accounting.analytic_largest(accounting.compute_of(label)),
                                                 "jaxlm.analysis.memory at the same usable share")
            if row:
                out[f"largest_{k}_gib"] = Claim(row["total_bytes"] / GIB, src)
                out[f"largest_{k}_matmuls"] = Claim(row["matmuls"], src)
                out[f"largest_{k}_matmuls_b8"] = Claim(got("largest-batch")[label]["matmuls"], src)
                if "rematerialised" in row:
                    out[f"largest_{k}_cloned"] = Claim(row["rematerialised"], src)
    for t in (1024, 2048):
        for label, k in (("float32", "f32"), ("bfloat16 + cuDNN", "cudnn")):
            if r := ctx.get(f"train_step, {label}, context {t}"):
                out[f"ctx_{k}_{t}"] = Claim(r["total_bytes"] / GIB, src)
    for label, k in (("float32", "f32"), ("bfloat16", "bf16")):
        pts = [(int(name.rsplit(" ", 1)[1]), r["total_bytes"] / GIB) for name, r in bat.items()
               if name.startswith(f"{label}, batch")]
        if len(pts) >= 2:
            out[f"batch_{k}_per_seq"] = Claim(statistics.linear_regression(*zip(*pts)).slope, src)
        whole, cut = chunk.get(f"{label}, whole logits, batch 128"), chunk.get(f"{label}, chunked, batch 128")
        if whole and cut:
            out[f"chunk_cut_{k}"] = Claim(100 * (1 - cut["total_bytes"] / whole["total_bytes"]), src)
    return out


def predicted(root: Path) -> dict[str, Claim]:
    """Step times, tokens/s and shares predicted from the compiled programs (deliverables.compiled_time)."""
    src = f"{root}/compiled/h100-80gb.json, predicted time"
    out = {}
    for (preset, mode), r in answers.sizes(root).items():
        key = f"pred_{preset.replace('.', '_')}_{mode}"
        out[f"{key}_ms"] = Claim(r["predicted_step_ms"], src)
        out[f"{key}_mfu"] = Claim(100 * r["predicted_mfu"], src)
        if mode == "train_step":
            share = {g["group"]: g["share"] for g in r["predicted_groups"]}.get("optimizer update", 0.0)
            out[f"opt_share_{preset.replace('.', '_')}"] = Claim(100 * share, src)
    for label, r in stored("techniques-small", "h100-80gb", root / "compiled").items():
        if label in TECHNIQUES:
            out[f"tech_{TECHNIQUES[label]}_ms"] = Claim(r["predicted_step_ms"], src)
    for label, r in stored("batch", "h100-80gb", root / "compiled").items():
        kind, batch = label.rsplit(", batch ", 1)
        if kind in ("float32", "bfloat16"):
            out[f"tput_{TECHNIQUES[kind]}_b{batch}"] = Claim(r["predicted_tokens_per_s"] / 1e3, src)
    for label, r in stored("chunk", "h100-80gb", root / "compiled").items():
        dtype, loss, _ = label.split(", ")
        out[f"chunk_{TECHNIQUES[dtype]}_{loss.split()[0]}_ms"] = Claim(r["predicted_step_ms"], src)
    return out


def recipe(root: Path) -> dict[str, Claim]:
    """The TinyStories recipes' predicted H100 minutes: CS336's and CSE599-O's tokens at the compiled step's
    predicted rate (tinystories-17M, context 256, batch 32)."""
    path = root / "compiled" / "tinystories-17M-h100.json"
    rows = (read_json(path, default=None) or {}).get("rows") or []
    return {f"{key}_{r['dtype']}_min": Claim(tokens / r["predicted_tokens_per_s"] / 60, f"{path} (predicted)")
            for r in rows if r.get("predicted_tokens_per_s")
            for key, tokens in (("recipe", HANDOUTS["cs336_tokens"][0]), ("cse_recipe", HANDOUTS["cse_tokens"][0]))}


# The studies' records: each plan's findings.json and generated report (docs/studies/*.md restate a few of their
# numbers, read back here so a page cannot drift from its records).
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


def reported(root: Path) -> dict[str, Claim]:
    """Every FINDINGS number in its plan's findings.json (the first group of its pattern in the finding whose claim
    has its words) and every STUDIES number in its plan's report."""
    out, texts = {}, {}
    for key, (plan, words, pattern) in FINDINGS.items():
        rows = (read_json(root / plan / "findings.json", default=None) or {}).get("findings") or []
        text = next(r["measured"] for r in rows if words in r["claim"])
        out[key] = Claim(float(re.search(pattern, text).group(1)), f"{root}/{plan}/findings.json")
    for plan, pattern, keys in STUDIES:
        text = texts.setdefault(plan, (root / plan / "report.md").read_text())
        if m := re.search(pattern, text):
            for key, value in zip(keys, m.groups()):
                if key:
                    out[key] = Claim(float(value) * SCALE.get(key, 1), f"{root}/{plan}/report.md (from its records)")
    return out


def fits(root: Path) -> dict[str, Claim]:
    """Memory against context of the profiling plan, fitted per source: the T² term's share at the longest T."""
    rows = [r for r in bench_rows(plan_runs(root, "profiling")) if r.get("mode") == "train_step"]
    out = {}
    for (mode, dtype, _, source), (xs, coef, ys) in fit_memory_points(rows, "context", "batch", 2).items():
        key = "cpu" if source.startswith("XLA:CPU") else "h100" if "h100" in source else None
        if key and dtype == "float32":
            out[f"fit_t2_share_{key}"] = Claim(100 * coef[2] * xs[-1] ** 2 / ys[-1], f"{root}/profiling records")
    return out


def lr(root: Path) -> dict[str, Claim]:
    sweep = plan_runs(root, "lr_sweep")
    by = dict(by_rate(sweep))
    e = edge(list(by.items()), untrained_loss(sweep))
    src = f"{root}/lr_sweep records"
    broken_acc = [a for r in by[e["broken"]] if (a := (r.get("metrics") or {}).get("eval_acc")) is not None]
    values = {"lr_best": e["best"], "lr_best_loss": e["best_loss"], "lr_best_acc": 100 * e["best_acc"],
              "lr_broken_acc": 100 * max(broken_acc) / e["best_acc"], "lr_trained": e["trained"],
              "lr_broken": e["broken"], "lr_nonfinite": e["nonfinite"], "lr_runs": len(sweep), "lr_rates": len(by),
              "lr_threshold_lo": e["threshold_range"][0], "lr_threshold_hi": e["threshold_range"][1]}
    out = {k: Claim(v, src) for k, v in values.items()}
    return out | {"lr_threshold": Claim(LEARNED_WITHIN, "deliverables.report.sections.divergence")}


def hosts(root: Path) -> dict[str, Claim]:
    """The 1-minute load of the host at the start and end of each plan's runs (and of the before/after runs)."""
    out = {}
    groups = {plan.name: plan_runs(root, plan.name) for plan in sorted(root.iterdir()) if (plan / "records").is_dir()}
    groups["before_after"] = [r for r in groups.get("optimizations", []) if r["name"].startswith("before_after")]
    small = root / "benchmarking" / "small-cpu.json"  # `small` timed alone (jaxlm.bench model --json)
    groups["small_cpu"] = [(read_json(small, default=None) or {}).get("meta") or {}]
    for name, found in groups.items():
        if load := [x for r in found for x in loads(r.get("host") or {})]:
            out[f"load_{name}_min"] = Claim(min(load), f"{root}/{name} records (host)")
            out[f"load_{name}_max"] = Claim(max(load), f"{root}/{name} records (host)")
    return out


def _params(found: list[dict], name: str) -> float:
    return next((r.get("metrics") or {})["params"] for r in found if r["name"] == name)


def recorded(root: Path, page: Path = RUN_PAGE) -> dict[str, Claim]:
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
    out = {k: Claim(v, f"{root} records") for k, v in values.items()}
    text = page.read_text() if page.is_file() else ""
    if m := re.search(r"context \d+: ([\d,]+) parameters", text):
        out["params_recipe_k"] = Claim(int(m.group(1).replace(",", "")) / 1e3, str(page))
    if m := re.search(r"\| final validation loss \| ([\d.]+) \|", text):
        out["recipe_val_loss"] = Claim(float(m.group(1)), str(page))
    return out


def claims(root: Path = RESULTS) -> dict[str, Claim]:
    root = Path(root)
    return (analytic() | compiled(root) | predicted(root) | recipe(root) | reported(root) | fits(root) | lr(root)
            | hosts(root) | recorded(root))


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.written.claims", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the committed records, a folder per plan")
    args = p.parse_args(argv)
    rows = [[f"`{key}`", f"{c.value:.6g}", c.source] for key, c in sorted(claims(args.results).items())]
    print(table(["key", "value", "source"], rows, "lrl"))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
