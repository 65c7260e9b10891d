"""Every number the written report states, computed from its source, so a test can hold the text to it.

    python -m deliverables.written.claims [--results docs/results]    # the table of claims and their sources

docs/report/report.md and appendix.md tag each number they state with its key, `30<!--c:largest_f32-->`;
tests/lab/test_report_written.py reads the tags and compares each number, at the precision the text gives it,
with `claims()` here. A stale number (the records, the compiled store or a formula changed) fails that test.
Sources: the plans' findings.json and records under ROOT, the compiled store ROOT/compiled/h100-80gb.json,
jaxlm.analysis (the analytic models) and the answers module.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import NamedTuple

from deliverables.answers import accounting
from deliverables.answers import predicted as answers
from deliverables.common import COURSE_MEMORY
from deliverables.compiled_memory import cached, cached_at_largest
from deliverables.compiled_time import stored
from deliverables.written.claims_records import records
from jaxlm import cli
from jaxlm.analysis import flops, memory
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.files import read_json

RESULTS = Path("docs/results")
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
    out = {}
    for r in rows:
        if r.get("predicted_tokens_per_s"):
            for key, tokens in (("recipe", HANDOUTS["cs336_tokens"][0]), ("cse_recipe", HANDOUTS["cse_tokens"][0])):
                out[f"{key}_{r['dtype']}_min"] = Claim(tokens / r["predicted_tokens_per_s"] / 60, f"{path} (predicted)")
    return out


def claims(root: Path = RESULTS) -> dict[str, Claim]:
    root = Path(root)
    out = analytic() | compiled(root) | predicted(root) | recipe(root)
    return out | {k: Claim(*v) for k, v in records(root).items()}


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.written.claims", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the committed records, a folder per plan")
    args = p.parse_args(argv)
    print("| key | value | source |\n|---|---:|---|")
    for key, c in sorted(claims(args.results).items()):
        print(f"| `{key}` | {c.value:.6g} | {c.source} |")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
