"""Every number the written report states, computed from its source, so a test can hold the text to it.

    python -m deliverables.report.claims [--results docs/results]    # the table of claims and their sources

docs/report/report.md and appendix.md tag each number they state with its key, `30<!--c:largest_f32-->`;
tests/lab/test_report_written.py reads the tags and compares each number, at the precision the text gives it,
with `claims()` here. A stale number (the records, the compiled store or a formula changed) fails that test.
Sources: the plans' findings.json and records under ROOT, the compiled store ROOT/compiled/h100-80gb.json,
jaxlm.analysis (the analytic models) and the answers module.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from deliverables.common import COURSE_MEMORY
from deliverables.report.bench import fit_memory_points
from deliverables.report.charts import bench_rows
from deliverables.report.divergence import LEARNED_WITHIN, edge
from deliverables.report.seeds import group_settings
from experiments.results import load_results
from jaxlm import cli
from jaxlm.core.files import read_json

RESULTS = Path("docs/results")
GIB, MIB = 2**30, 2**20


@dataclass(frozen=True)
class Claim:
    value: float
    source: str


def attention_share(t: int) -> float:
    """% of one sequence's float32 train-step activations that are attention scores (jaxlm.memory, `small`)."""
    from jaxlm.analysis import memory
    from jaxlm.core.config import ComputeConfig, ModelConfig

    est = memory.estimate(ModelConfig.from_name("small", context_length=t), 1, t, ComputeConfig())
    return 100 * sum(v for k, v in est.activations.items() if k.endswith("attention scores")) / est.activation_total


TARGET_LOSS = 1.45  # CS336 assignment 1: TinyStories validation loss to reach within the GPU budget


def analytic() -> dict[str, Claim]:
    from deliverables.answers import accounting, adamw
    from jaxlm.analysis import flops
    from jaxlm.analysis.memory import DEFAULT_USABLE

    xl = accounting.model("gpt2-xl")
    per_seq, fixed = adamw.peak_terms(xl, 1024)
    src = "jaxlm.analysis (flops, memory) and the answers module"
    return {"target_loss": Claim(TARGET_LOSS, "the CS336 assignment 1 handout"),
            "usable_share": Claim(100 * DEFAULT_USABLE, "jaxlm.analysis.memory.DEFAULT_USABLE"),
            "attn_share_256": Claim(attention_share(256), src), "attn_share_1024": Claim(attention_share(1024), src),
            "xl_params": Claim(flops.param_counts(xl)["total"], src),
            "xl_fwd_tflop": Claim(flops.forward_flops(xl, 1024).total / 1e12, src),
            "xl_gb_per_seq": Claim(per_seq / 1e9, src), "xl_gb_fixed": Claim(fixed / 1e9, src),
            "xl_batch_80gb": Claim(math.floor((COURSE_MEMORY - fixed) / per_seq), src),
            "xl_a100_days": Claim(accounting.training_days("a100", "float32")[1], src)}


def compiled(root: Path) -> dict[str, Claim]:
    """The H100-compiled plans (GiB), the largest batches by compiling and the predicted times."""
    from deliverables.answers import accounting, predicted
    from deliverables.compiled_memory import cached

    src = f"{root}/compiled/h100-80gb.json (XLA's GPU compiler, not measured)"
    tech = cached("techniques-small", "h100-80gb", root / "compiled")
    names = {"float32": "f32", "bfloat16": "bf16", "bfloat16 + remat full": "bf16_remat",
             "bfloat16 + cuDNN": "bf16_cudnn", "bfloat16 + cuDNN + remat full": "bf16_cudnn_remat"}
    out = {f"tech_{k}": Claim(tech[label]["total_bytes"] / GIB, src) for label, k in names.items() if label in tech}
    for label, k in names.items():
        if label in (got := accounting.compiled_largest(root)):
            out[f"largest_{k}"] = Claim(got[label], src)
            out[f"largest_{k}_estimate"] = Claim(accounting.analytic_largest(accounting.compute_of(label)),
                                                 "jaxlm.analysis.memory at the same usable share")
    chunk = cached("loss-chunk", "h100-80gb", root / "compiled")
    whole, cut = chunk.get("float32, whole logits, batch 128"), chunk.get("bfloat16, chunked, batch 128")
    if whole and cut:
        out["chunk_b128_whole_f32"] = Claim(whole["total_bytes"] / GIB, src)
        out["chunk_b128_bf16"] = Claim(cut["total_bytes"] / GIB, src)
        out["chunk_b128_cut"] = Claim(100 * (1 - cut["total_bytes"] / whole["total_bytes"]), src)
    for (preset, mode), r in predicted.sizes(root).items():
        key = f"pred_{preset.replace('.', '_')}_{mode}"
        out[f"{key}_ms"] = Claim(r["predicted_step_ms"], src + ", predicted time")
        out[f"{key}_mfu"] = Claim(100 * r["predicted_mfu"], src + ", predicted time")
    return out


def recipe(root: Path) -> dict[str, Claim]:
    """The TinyStories recipe's predicted H100 minutes: 327,680,000 tokens at the compiled step's predicted rate."""
    path = root / "compiled" / "tinystories-17M-h100.json"
    rows = (read_json(path, default=None) or {}).get("rows") or []
    out = {}
    for r in rows:
        if r.get("predicted_tokens_per_s"):
            out[f"recipe_{r['dtype']}_min"] = Claim(327_680_000 / r["predicted_tokens_per_s"] / 60,
                                                      f"{path} (predicted)")
    return out


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


REPORTS = {  # key: (plan, pattern in its generated report.md, from its records)
    "peft_full_mib": ("peft", r"\| `pretrain` \.\.\. `full-s2` \(4 runs\) \|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB"),
    "peft_r4_mib": ("peft", r"\| `lora_r4-s0`[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB"),
    "peft_r64_mib": ("peft", r"\| `lora_r64-s0`[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB"),
    "par_fsdp_share": ("parallelism", r"memory_small: fsdp=8 holds ([\d.]+)"),
    "par_tp_share": ("parallelism", r"memory_small: data=2,tensor=4 holds ([\d.]+)"),
    "par_pp_share": ("parallelism", r"memory_small: data=2,pipeline=4 holds ([\d.]+)"),
    "par_dp_speed": ("parallelism", r"dp_on: data=8 ran \d+ tokens/s against one device's \d+ \(([\d.]+)x\)"),
}
for _m, _batches in ((1, "micro-batch"), (4, "micro-batches"), (8, "micro-batches")):  # the pipeline bubble, measured
    REPORTS[f"par_bubble_m{_m}"] = ("parallelism", rf"with {_m} {_batches} lost (\d+) %")
    REPORTS[f"par_bubble_m{_m}_gpipe"] = ("parallelism",
                                          rf"with {_m} {_batches} lost \d+ % [^(]*\(analytic GPipe bubble (\d+) %")


def fits(root: Path) -> dict[str, Claim]:
    """Memory against context of the profiling plan, fitted per source: the T² term's share at the longest T."""
    rows = [r for r in bench_rows(load_results(root / "profiling" / "records")) if r.get("mode") == "train_step"]
    out = {}
    for (mode, dtype, _, source), (xs, coef, ys) in fit_memory_points(rows, "context", "batch", 2).items():
        key = "cpu" if source.startswith("XLA:CPU") else "h100" if "h100" in source else None
        if key and dtype == "float32":
            out[f"fit_t2_share_{key}"] = Claim(100 * coef[2] * xs[-1] ** 2 / ys[-1], f"{root}/profiling records")
            out[f"fit_t2_bytes_{key}"] = Claim(coef[2], f"{root}/profiling records")
    return out


def lr(root: Path) -> dict[str, Claim]:
    by: dict[float, list[dict]] = {}
    runs = load_results(root / "lr_sweep" / "records")
    for r in runs:
        if isinstance(x := (r.get("axes") or {}).get("optim.lr"), (int, float)):
            by.setdefault(float(x), []).append(r)
    vocab = ((runs[0].get("config") or {}).get("model") or {}).get("vocab_size")
    e = edge(sorted(by.items()), math.log(vocab))
    src = f"{root}/lr_sweep records"
    broken_acc = [a for r in by[e["broken"]] if (a := (r.get("metrics") or {}).get("eval_acc")) is not None]
    return {"lr_threshold": Claim(LEARNED_WITHIN, "deliverables.report.divergence"),
            "lr_broken_acc": Claim(100 * max(broken_acc) / e["best_acc"], src), "lr_best": Claim(e["best"], src),
            "lr_best_loss": Claim(e["best_loss"], src),
            "lr_best_acc": Claim(100 * e["best_acc"], src), "lr_trained": Claim(e["trained"], src),
            "lr_broken": Claim(e["broken"], src), "lr_nonfinite": Claim(e["nonfinite"], src),
            "lr_runs": Claim(len(runs), src), "lr_rates": Claim(len(by), src)}


def cpu(root: Path) -> dict[str, Claim]:
    """The CPU train step's throughput span over the profiling plan's batches, and the optimizations' seeds."""
    rows = [r for r in bench_rows(load_results(root / "profiling" / "records"))
            if r.get("device") == "cpu" and r.get("tokens_per_s") and r.get("mode") == "train_step"]
    tps = [r["tokens_per_s"] / 1e3 for r in rows]
    opt = group_settings([r for r in load_results(root / "optimizations" / "records") if r.get("kind") != "bench"])
    src = f"{root} records"
    return {"cpu_ktok_min": Claim(min(tps), src), "cpu_ktok_max": Claim(max(tps), src),
            "opt_seeds": Claim(max(len(s.runs) for s in opt), src)}


def claims(root: Path = RESULTS) -> dict[str, Claim]:
    root = Path(root)
    out = analytic() | compiled(root) | recipe(root) | fits(root) | lr(root) | cpu(root)
    for key, (plan, words, pattern) in FINDINGS.items():
        out[key] = Claim(finding(root, plan, words, pattern), f"{root}/{plan}/findings.json")
    for key, (plan, pattern) in REPORTS.items():
        out[key] = Claim(float(re.search(pattern, (root / plan / "report.md").read_text()).group(1)),
                         f"{root}/{plan}/report.md (from its records)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.report.claims", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the committed records, a folder per plan")
    args = p.parse_args(argv)
    print("| key | value | source |\n|---|---:|---|")
    for key, c in sorted(claims(args.results).items()):
        print(f"| `{key}` | {c.value:.6g} | {c.source} |")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
