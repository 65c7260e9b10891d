"""The claims that are a number in a plan's generated report.md (the study pages', docs/studies/*.md, and the
written report's).

A page restates a few of its report's results; each of those numbers is read back here from the report the
records generated (`python -m deliverables.report docs/results/PLAN/records --out docs/results/PLAN`), so a page
cannot drift from its records. `SCALE` turns a report's seconds into the page's milliseconds.
"""

from __future__ import annotations

import re
from pathlib import Path

_LOSS = r"validation loss ([\d.]+) ± [\d.]+ against ([\d.]+) ± [\d.]+ \([-+]([\d.]+)%"  # the change unsigned


STUDIES: dict[str, tuple[str, str, int]] = {  # key: (plan, pattern in report.md, group)
    "abl_nope": ("ablations", rf"`nope` against `baseline`: {_LOSS}", 1),
    "abl_base": ("ablations", rf"`nope` against `baseline`: {_LOSS}", 2),
    "abl_silu": ("ablations", rf"`silu` against `baseline`: {_LOSS}", 1),
    "abl_post": ("ablations", rf"`post_norm` against `baseline`: {_LOSS}", 1),
    "abl_post_gap": ("ablations", rf"`post_norm` against `baseline`: {_LOSS}", 3),
    "abl_nonorm": ("ablations", rf"`no_norm` against `baseline`: {_LOSS}", 1),
    "abl_nonorm_gap": ("ablations", rf"`no_norm` against `baseline`: {_LOSS}", 3),
    "abl_nonorm_lr": ("ablations", rf"`no_norm_lr0.01` against `baseline_lr0.01`: {_LOSS}", 1),
    "abl_base_lr": ("ablations", rf"`no_norm_lr0.01` against `baseline_lr0.01`: {_LOSS}", 2),
    "abl_nonorm_lr_gap": ("ablations", rf"`no_norm_lr0.01` against `baseline_lr0.01`: {_LOSS}", 3),
    "bs_b8_loss": ("batch_size", r"batch 8: ([\d.]+) ±", 1),
    "bs_eq1_gap": ("batch_size", r"whole run of data.batch_size=1\): data.batch_size=8 [^(]*\(\+([\d.]+)%", 1),
    "bs_eq8_gap": ("batch_size", r"whole run of data.batch_size=8\): data.batch_size=32 [^(]*\(\+([\d.]+)%", 1),
    "bs_jitter_b1": ("batch_size", r"2nd half\): batch 1: ([\d.]+)", 1),
    "bs_jitter_b32": ("batch_size", r"2nd half\): batch 1: [\d.]+, batch 8: [\d.]+, batch 32: ([\d.]+)", 1),
    "bs_step_b1_ms": ("batch_size", r"step time batch 1: ([\d.]+) ±", 1),
    "bs_step_b32_ms": ("batch_size", r"step time batch 1: .*?batch 32: ([\d.]+) ±", 1),
    "bs_maxbatch": ("batch_size", r"Largest batch within an estimated [\d.]+ GB \(max_batch[^)]*\): (\d+)", 1),
    "bs_maxbatch_gb": ("batch_size", r"Largest batch within an estimated ([\d.]+) GB", 1),
    "ctx_32_loss": ("context_length", r"context 32: ([\d.]+) ±", 1),
    "ctx_64_loss": ("context_length", r"context 64: ([\d.]+) ±", 1),
    "ctx_256_loss": ("context_length", r"context 256: ([\d.]+) ±", 1),
    "ctx_32_ms": ("context_length", r"\| `ctx32` \|(?:[^|]*\|){11} ([\d.]+) ms", 1),
    "ctx_256_ms": ("context_length", r"\| `ctx256` \|(?:[^|]*\|){11} ([\d.]+) ms", 1),
    "lr_003_loss": ("lr_sweep", r"lr 0.003: ([\d.]+) ±", 1),
    "lr_003_gap": ("lr_sweep", r"the next, `lr0.003`: validation loss [^(]*\(\+([\d.]+)%", 1),
    "lr_01_loss": ("lr_sweep", r"lr 0.1: ([\d.]+) ±", 1),
    "lr_20_loss": ("lr_sweep", r"lr 20: ([\d.]+) ±", 1),
    "lr_margin": ("lr_sweep", r"the [\d.]+ used here is ([\d.]+) nats from moving it", 1),
    "size_s_loss": ("model_size", r"\bs \(\w+ params\): ([\d.]+)", 1),
    "size_m_loss": ("model_size", r"m \(\w+ params\): ([\d.]+)", 1),
    "size_m_gap": ("model_size", r"the next, `m`: validation loss [^(]*\(\+([\d.]+)%", 1),
    "size_xs_ms": ("model_size", r"\| `xs` \|(?:[^|]*\|){11} ([\d.]+) ms", 1),
    "size_l_ms": ("model_size", r"\| `l` \|(?:[^|]*\|){11} ([\d.]+) ms", 1),
    "peft_r8_share": ("peft", r"LoRA rank 8 trained ([\d.]+) % of the parameters", 1),
    "peft_r8_mem": ("peft", r"LoRA rank 8 trained [\d.]+ % of the parameters with ([\d.]+) %", 1),
    "peft_r4_loss": ("peft", r"r4: ([\d.]+) ±", 1),
    "peft_r64_loss": ("peft", r"r64: ([\d.]+) ±", 1),
    "peft_rank_range": ("peft", r"r64: [\d.]+ ± [\d.]+; range ([\d.]+)%", 1),
    "peft_nf4_bytes": ("peft", r"frozen weights at ([\d.]+) bytes per parameter", 1),
    "peft_nf4_mib": ("peft", r"float32: 4\), ([\d.]+) MiB of frozen weights", 1),
    "qlora_gap": ("peft", r"qlora_r16 [\d.]+ ± [\d.]+ vs lora_r16 [\d.]+ ± [\d.]+ \(\+([\d.]+)%", 1),
    "q_int8_diff": ("quantization", r"float32 with int8 \(PTQ\) weights: [^,]*, \+([\d.]+) ±", 1),
    "q_int8_ratio": ("quantization", r"float32 with int8 \(PTQ\) weights: .*?weights ([\d.]+)x smaller", 1),
    "q_int4_diff": ("quantization", r"float32 with int4 \(PTQ\) weights: [^,]*, \+([\d.]+) ±", 1),
    "q_int4_ratio": ("quantization", r"float32 with int4 \(PTQ\) weights: .*?weights ([\d.]+)x smaller", 1),
    "q_qat_gap": ("quantization", r"QAT w4a8 at int4 [\d.]+ ± [\d.]+ vs [^(]*\(\+([\d.]+)%", 1),
    "opt_window_b32": ("optimizations", rf"`window16_b32` against `float32_b32`: {_LOSS}", 3),
    "opt_h100_f32_mib": ("optimizations", r"\| `float32_b128-s0`[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB", 1),
    "opt_h100_bf16_mib": ("optimizations", r"\| `bfloat16_b128-s0`[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB", 1),
    "opt_h100_remat_mib": ("optimizations", r"\| `remat_b128-s0`[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB", 1),
    "opt_ba_f32_gib": ("optimizations", r"\| `before_after_float32` [^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) GiB", 1),
    "opt_ba_bf16_gib": ("optimizations", r"\| `before_after_bfloat16` [^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) GiB", 1),
    "opt_ba_remat_mib": ("optimizations", r"\| `before_after_remat` [^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB", 1),
    "opt_maxbatch_gb": ("optimizations", r"Largest batch within an estimated ([\d.]+) GB", 1),
    "prof_batch_a": ("profiling", r"context 256 \(XLA:CPU compiled estimate\): ([\d.]+) MiB \+", 1),
    "prof_batch_b": ("profiling", r"context 256 \(XLA:CPU compiled estimate\): [\d.]+ MiB \+ ([\d.]+) MiB per", 1),
    "prof_batch_r2": ("profiling", r"per sequence, batch [\d-]+, R² ([\d.]+)", 1),
    "prof_batch_dev": ("profiling", r"R² [\d.]+ \(largest deviation [\d.]+ MiB, ([\d.]+)%", 1),
    "peft_full_mib": ("peft", r"\| `pretrain` \.\.\. `full-s2` \(4 runs\) \|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB", 1),
    "peft_r4_mib": ("peft", r"\| `lora_r4-s0`[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB", 1),
    "peft_r64_mib": ("peft", r"\| `lora_r64-s0`[^|]*\|[^|]*\|[^|]*\|[^|]*\| ([\d.]+) MiB", 1),
    "par_fsdp_share": ("parallelism", r"memory_small: fsdp=8 holds ([\d.]+)", 1),
    "par_tp_share": ("parallelism", r"memory_small: data=2,tensor=4 holds ([\d.]+)", 1),
    "par_pp_share": ("parallelism", r"memory_small: data=2,pipeline=4 holds ([\d.]+)", 1),
    "par_dp_speed": ("parallelism", r"dp_on: data=8 ran \d+ tokens/s against one device's \d+ \(([\d.]+)x\)", 1),
}
for _m, _batches in ((1, "micro-batch"), (4, "micro-batches"), (8, "micro-batches")):  # the pipeline bubble, measured
    STUDIES[f"par_bubble_m{_m}"] = ("parallelism", rf"with {_m} {_batches} lost (\d+) %", 1)
    STUDIES[f"par_bubble_m{_m}_gpipe"] = ("parallelism",
                                          rf"with {_m} {_batches} lost \d+ % [^(]*\(analytic GPipe bubble (\d+) %", 1)
SCALE = {"bs_step_b1_ms": 1e3, "bs_step_b32_ms": 1e3}  # the report's seconds, the page's milliseconds


def studies(root: Path) -> dict[str, tuple[float, str]]:
    """key -> (value, source) for every STUDIES pattern found in its plan's report."""
    out, texts = {}, {}
    for key, (plan, pattern, group) in STUDIES.items():
        text = texts.setdefault(plan, (root / plan / "report.md").read_text())
        if m := re.search(pattern, text):
            out[key] = (float(m.group(group)) * SCALE.get(key, 1), f"{root}/{plan}/report.md (from its records)")
    return out
