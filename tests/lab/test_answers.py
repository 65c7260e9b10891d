"""deliverables.answers: every answer against a hand calculation, a known value or a synthetic record."""

import json

import numpy as np
import pytest

from deliverables.answers import accounting as answers
from deliverables.answers import gpu, measured, studies, text
from deliverables.answers.__main__ import main
from jaxlm import cli
from jaxlm.analysis import flops, memory
from jaxlm.analysis.devices import DEVICES
from jaxlm.core.config import ComputeConfig

# GPT-2 XL under docs/spec.md's architecture: d 1600, 48 layers, 25 heads, d_ff 6400, vocab 50257, untied.
D, L, F, V, T = 1600, 48, 6400, 50257, 1024


def test_gpt2_xl_parameters_by_hand():
    per_layer = 4 * D * D + 3 * D * F + 2 * D  # attention, SwiGLU, two RMSNorm gains
    by_hand = L * per_layer + D + 2 * V * D  # final norm, embedding, output head
    assert by_hand == 2_127_057_600
    assert flops.param_counts(answers.model("gpt2-xl"))["total"] == by_hand


def test_gpt2_xl_forward_flops_by_hand():
    macs_per_layer = 4 * T * D * D + 2 * T * T * D + 3 * T * D * F  # projections, QK^T and AV, SwiGLU
    by_hand = 2 * (L * macs_per_layer + T * D * V)
    assert by_hand == 4_513_336_524_800
    assert flops.forward_flops(answers.model("gpt2-xl"), T).total == by_hand


def test_memory_is_linear_in_batch_and_the_largest_batch_fits():
    m = answers.model("gpt2-xl")
    fixed, per_seq = answers.memory_terms(m, T, ComputeConfig(loss_chunk=0))
    assert sum(fixed.values()) == 16 * 2_127_057_600
    est = memory.estimate(m, 7, T, ComputeConfig(loss_chunk=0), backend="cpu")
    assert est.activation_total == pytest.approx(7 * per_seq)
    b = answers.max_batch(sum(fixed.values()), per_seq, 80e9)
    assert sum(fixed.values()) + b * per_seq <= 80e9 < sum(fixed.values()) + (b + 1) * per_seq
    bf16 = ComputeConfig(dtype="bfloat16", attention="cudnn", loss_chunk=0)  # the weights' bfloat16 copies count too
    fixed, per_seq = answers.memory_terms(m, T, bf16)
    assert sum(fixed.values()) == 18 * 2_127_057_600
    assert answers.max_batch(sum(fixed.values()), per_seq, 80e9) == memory.largest_batch(m, T, 80e9, bf16,
                                                                                       backend="cpu")


QUESTION_IDS = ("unicode1", "unicode2", "train_bpe_tinystories", "tokenizer_experiments", "transformer_accounting",
                "adamwAccounting", "learning_rate", "generate", "benchmarking_script", "nsys_profile",
                "mixed_precision_accumulation", "benchmarking_mixed_precision", "memory_profiling")


def test_document_answers_every_question_id_with_the_hand_numbers(tmp_path):
    from deliverables.answers.__main__ import answers as document

    text_md = document(DEVICES["h100-80gb"], tmp_path / "no-records", out_dir=tmp_path)
    for qid in QUESTION_IDS:
        assert f"### {qid}\n" in text_md
    assert "2,127,057,600" in text_md and "4,513,336,524,800" in text_md
    days = 400_000 * (3 * 1024 * 4_513_336_524_800 + 14 * 2_127_057_600) / (0.5 * 989e12) / 86400
    assert f"| H100 | bfloat16 | 989 TFLOP/s | {days:,.1f} |" in text_md
    assert "training takes 6,584 days" in text_md  # the A100 at 19.5 TFLOP/s float32, by hand: 6,583.6
    assert "**Missing**: no `lr_sweep` records" in text_md and "**Pending**" in text_md
    assert "**Missing**: no `tokenizer` plan report" in text_md


def test_measured_answers_from_a_bench_result(tmp_path):
    rows = [{"framework": "jax", "mode": m, "dtype": "float32", "attention": "xla", "remat": "none", "context": 64,
             "batch": 2, "status": "ok", "step_ms": ms, "step_ms_std": 0.5}
            for m, ms in (("forward", 10.0), ("forward_backward", 31.0))]
    comps = {"attention": {"forward_s": 0.004, "flops_forward": 1e9}, "ffn": {"forward_s": 0.006, "flops_forward": 3e9}}
    path = tmp_path / "bench.json"
    breakdown = [{"context": 64, "batch": 2, "dtype": "float32", "components": comps}]
    path.write_text(json.dumps({"meta": {"breakdown": breakdown},
                                "rows": rows}))
    text = "\n".join(measured.measured_section(path))
    assert "| jax | forward | float32 | 64 | 2 | 10 | 0.5 |" in text
    assert "backward 21 ms (2.10x the forward" in text
    assert "time ratio 1.50, FLOP ratio 3.00" in text


def test_missing_bench_is_one_line(tmp_path, capsys):
    assert cli.run(main, ["--bench", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --bench") and "nope.json" in err and "\n" not in err


# --------------------------------------------------------------------------- adamwAccounting


def test_adamw_activation_formula_by_hand():
    m = answers.model("gpt2-xl")
    floats = L * (16 * T * D + 2 * 25 * T * T) + T * D + 2 * T * V  # n(16Td + 2hT^2) + Td + 2TV, d_ff = 4d
    assert sum(answers.activation_floats(m, T).values()) == floats == 3_879_438_336
    a, b = answers.peak_terms(m, T)
    assert (a, b) == (4 * floats, 16 * 2_127_057_600)
    assert answers.max_batch(b, a, 80e9) == 2  # (80 - 34.03) / 15.52 = 2.96
    assert "**peak = 15.52 GB · batch_size + 34.03 GB**" in "\n".join(answers.adamw_section())


def test_adamw_flops_term_by_term():
    assert [n for *_, n in flops.ADAMW_TERMS] == [3, 4, 5, 2]  # m: 2 mul + add; v: square, 2 mul, add; ...
    assert flops.ADAMW_FLOPS_PER_PARAM == 14
    assert "Total **14 FLOPs per parameter**" in "\n".join(answers.adamw_section())


# --------------------------------------------------------------------------- unicode, tokenizers, mixed precision


def test_unicode_answers_come_from_python():
    one = "\n".join(text.unicode1())
    assert "U+0000" in one and "`'\\x00'`" in one and "has 21 characters" in one
    # 7 ASCII + 5 x 3 + 1 bytes in UTF-8; 2 or 4 bytes a character in UTF-16 and UTF-32
    assert "| `hello! こんにちは!` | 13 | 23 (0% zero) | 26 (31% zero) | 52 (65% zero) |" in "\n".join(text.unicode2())
    wrong = text.decode_error("héllo".encode(), text.decode_utf8_bytes_to_str_wrong)
    assert wrong.startswith("raises UnicodeDecodeError")
    assert text.decode_error(b"\x80\x80").startswith("raises") and text.decode_error(b"hi") == "decodes to 'hi'"


def test_tokenizer_answers_quote_the_tokenizer_plans_sections(tmp_path):
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "report.md").write_text(
        "# tokenizer\n\n## Tokenizer experiments\n\n### BPE training\n\n| a | b |\n\n### Bytes per token\n\n"
        "ratio 4.03\n\n### Why uint16\n\nbelow 65,536\n\n### Encoding throughput\n\n5.49 MB/s\n\n"
        "## What this backend can show\n\nno\n")
    md = "\n".join(text.tokenizer_sections(tmp_path))
    assert md.index("### train_bpe_tinystories") < md.index("| a | b |") < md.index("### tokenizer_experiments")
    assert md.index("ratio 4.03") < md.index("5.49 MB/s") < md.index("below 65,536") and "backend" not in md


def test_float16_accumulation_matches_the_known_sums():
    sums = dict(gpu.accumulation())
    assert sums["float16 += float16"] == 9.953125  # the sum the curriculum's handout shows
    assert sums["float32 += float32"] == pytest.approx(10.0001335, abs=1e-6)
    assert sums["float32 += float16"] == sums["float32 += float32(float16)"] \
        == pytest.approx(1000 * float(np.float16(0.01)), rel=1e-5)


# --------------------------------------------------------------------------- answers from records


def write_run(root, plan, name, **fields):
    d = root / plan / "records" / name
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"name": name, "plan": plan, **fields}))


def test_learning_rate_from_records_names_the_best_rate_the_edge_and_the_grid(tmp_path):
    spec = {"set": {"model.num_layers": 2, "model.d_model": 32, "model.context_length": 16, "data.batch_size": 4,
                    "train.steps": 10}}
    for lr, losses in ((1e-3, [2.5, 2.7]), (1e-2, [2.0, 2.2]), (0.1, [2.9, 3.1])):
        for seed, loss in enumerate(losses):
            write_run(tmp_path, "lr_sweep", f"lr{lr}-s{seed}", status="ok", axes={"optim.lr": lr, "seed": seed},
                      spec=spec, metrics={"eval_loss": loss})
    for seed in range(2):
        write_run(tmp_path, "lr_sweep", f"lr10-s{seed}", status="diverged", axes={"optim.lr": 10.0, "seed": seed},
                  spec=spec)
    md = "\n".join(studies.learning_rate_section(tmp_path))
    assert "| 0.01 | 2 | 2.100 ± 0.141 | 2 trained |" in md  # mean 2.1, sample std sqrt(0.02)
    assert "| 10 | 2 | – | 2 diverged |" in md
    # lr 0.1 ends 0.8 and 1.0 nats above the best's mean 2.1: it no longer learns, though far below ln V.
    assert "| 0.1 | 2 | 3.000 ± 0.141 | 2 failed to learn |" in md
    assert "The best rate is 0.01 (validation loss 2.100)" in md and "no seed trained from lr 0.1 (10x)" in md
    assert "2 layers x 32" in md and "wisdom (the best rate is just below the edge of stability) holds loosely" in md


def test_generate_answer_quotes_the_run_pages_sample(tmp_path):
    page = tmp_path / "report.md"
    page.write_text("# Training run `tiny`\n\n| | |\n|---|---|\n| model | d_model 8, 1 layers: 1,234 parameters |\n"
                    "| data | `d` (bytes tokenizer), batch 2 |\n| steps | 5 |\n| final validation loss | 3.210 |\n\n"
                    "## Sample\n\nDecoding: prompt 'A', temperature 0.8, top-p 0.95.\n\n```text\nA cat\n\nsat\n```\n\n"
                    "Repetition, measured: 90% distinct.\n")
    md = "\n".join(studies.generate_section(page, "report.md"))
    assert "> A cat\n>\n> sat" in md and "validation loss 3.210" in md and "temperature 0.8" in md
    assert "this one has 1,234 parameters and reads bytes" in md and "Repetition, measured: 90% distinct." in md
    assert "**Missing**" in "\n".join(studies.generate_section(tmp_path / "none.md", "x"))


def test_warmup_answer_compares_the_first_step_with_the_warm_median(tmp_path):
    host = {"cpu_model": "Test CPU", "cpus": 2, "load_avg_1m_start": 1.0, "load_avg_1m_end": 3.0}
    for w, first in ((0, 300.0), (5, 11.0)):
        rows = [{"mode": m, "status": "ok", "step_ms": k * 12.0, "step_ms_std": k * 1.0, "step_ms_median": k * 10.0,
                 "step_ms_first": k * first, "compile_s": 2.0} for m, k in (("forward", 1), ("forward_backward", 3))]
        write_run(tmp_path, "benchmarking", f"warmup{w}", status="ok", axes={"warmup": w}, host=host,
                  spec={"args": {"preset": "tiny", "context": 16, "batch": 2}}, bench_rows=rows)
    md = "\n".join(measured.benchmarking_section(tmp_path, None))
    assert "on Test CPU, 2 cores, load average 1.0-3.0" in md
    assert "| 0 | 12 ± 1 | 300 | 36 ± 3 | 900 | 24 | 2.00 |" in md  # backward = 36 - 12
    assert "first timed step took 300 ms, 30.0x the median after 5 warm-up steps (10 ms)" in md
    assert "on the 2-core CPU host only `small` was timed" in md  # no size-table runs in these records


def test_memory_profiling_reads_the_compiled_profile_of_large(tmp_path):
    from deliverables import memory_profile as profile

    rows = {}
    for label, _ in profile.rows():  # "forward, float32, context 128"
        gb = (20 if label.startswith("forward") else 60) * (0.8 if "bfloat16" in label else 1.0)
        rows[label] = {"total_bytes": gb * 2**30, "argument_bytes": 16 * 2**30, "peak_live_bytes": 0.9 * gb * 2**30,
                       "instructions": 1000, "peak_position": 450, "label": "compiled for H100, not measured",
                       "phases": {"forward": [0, 399], "backward": [400, 799], "update": [800, 999]},
                       "largest": [{"bytes": 80 * 2**20, "shape": "f32[4,20,512,512]", "count": 36, "op": "jvp()/div",
                                    "source": "jaxlm/nn/attention.py:168 _attention_xla", "example": "fusion.1"}]}
    (tmp_path / "compiled").mkdir()
    (tmp_path / "compiled" / "large-memory-profile.json").write_text(json.dumps({"rows": rows}))
    md = "\n".join(gpu.memory_profiling_section(tmp_path))
    assert "| 512 | 20.00 GiB | 16.00 GiB | 60.00 GiB | 48.00 GiB |" in md and "0.80x to 0.80x the float32" in md
    assert "peak at 54.00 GiB at instruction 450 (45% of the way, in the backward)" in md
    assert "| 80.0 | `f32[4,20,512,512]` | 36 | `jvp()/div` | `jaxlm/nn/attention.py:168 _attention_xla` |" in md
    assert "10 MiB at T = 512" in md  # 4 x 512 x 1280 x 4 bytes = 10 MiB
    assert "compiled, not a CUDA trace" in md
    assert gpu.PROFILE_COMMAND in "\n".join(gpu.memory_profiling_section(tmp_path / "none"))


def test_nsys_answers_from_the_campaigns_profile(tmp_path):
    summary = lambda share: {"total_us": 2000.0, "matmul_share": share,
                             "top": [{"name": "nvjet_gemm", "us": 1500.0, "share": 0.75, "matmul": True}]}
    prof = {"model": "small", "context": 1024, "batch": 4, "dtype": "bfloat16", "forward": summary(0.75),
            "train_step": summary(0.6), "attention": summary(0.5)}
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "results.json").write_text(json.dumps({"steps": {"profile": prof}}))
    md = "\n".join(gpu.nsys_section(tmp_path))
    assert "forward pass: 2.00 ms of device time over the traced calls, 75% in matmul kernels" in md
    assert "train step: 2.00 ms" in md and "`nvjet_gemm`: 75.0% (matmul)" in md
    assert "**Pending**" in "\n".join(gpu.nsys_section(tmp_path / "none"))


def _predicted_store(tmp_path):
    """A compiled store holding predicted kernel tables for the size table's steps (synthetic figures)."""
    from deliverables.compiled_time import sections
    from jaxlm.predict.store import CompileCache
    from jaxlm.predict.target import parse_target

    target, stored = parse_target("h100-80gb"), {}
    groups = [{"group": "matmul", "share": 0.5}, {"group": "attention", "share": 0.2},
              {"group": "copies", "share": 0.01, "bound": "launch", "launches": 30}]
    ops = [{"op": "jvp(ki,oi->ko)/dot_general", "source": "jaxlm/nn/layers.py:64 dense", "group": "matmul",
            "component": "feed-forward", "launches": 48, "share": 0.5, "flops": 1e12, "predicted_ms": 5.0},
           {"op": "jvp()/div", "source": "jaxlm/nn/attention.py:160 _attention_xla", "group": "attention",
            "component": "attention softmax and mask", "launches": 12, "share": 0.1, "flops": 0.0,
            "predicted_ms": 1.0},
           {"op": "reduce_sum", "source": "optax/tree_utils/_tree_math.py:187 tree_sum", "group": "optimizer update",
            "component": "optimizer and clipping", "launches": 394, "share": 0.05, "flops": 0.0,
            "predicted_ms": 394 * 0.005}]  # 5 µs a launch: launch-bound at the roofline's launch cost
    rows = [r for s in sections() if s.name in ("sizes", "nsys") for r in s.rows]  # "small, forward, context 512"
    for label, job in rows:
        train = "train_step" in label
        stored[CompileCache.key(job, target)] = {
            "predicted_step_ms": 30.0 if train else 10.0, "predicted_tokens_per_s": 2048 / 0.03,
            "predicted_mfu": 0.4, "predicted_label": "predicted from the compiled program for H100, not measured",
            "predicted_phases": {"backward": 16.0, "recompute": 2.0, "forward": 8.0, "optimizer": 4.0},
            "predicted_components": {"feed-forward": 12.0, "attention matmuls": 3.0, "attention softmax and mask": 6.0,
                                     "attention projections": 3.0},
            "predicted_groups": groups, "predicted_ops": ops}
    (tmp_path / "compiled").mkdir()
    (tmp_path / "compiled" / "h100-80gb.json").write_text(json.dumps(stored))


def test_size_table_and_nsys_answers_from_the_predicted_kernel_tables(tmp_path):
    from deliverables.answers import predicted

    _predicted_store(tmp_path)
    md = "\n".join(predicted.size_section(tmp_path, {("small", "forward"): 12.5}))
    assert "**Predicted, not measured**" in md and "predicted from the compiled program for H100" in md
    # forward 10, train 30 = forward 8 + backward 16 + recompute 2 + optimizer 4; measured forward beside it
    assert "| small | 10 | 30 | 8 | 18 | 4 | 68,267 | 40% | 12.5 | – |" in md
    assert "backward pass takes 2.0x to 2.0x the forward's" in md  # 16 / 8, the recompute apart
    fl = flops.forward_flops(answers.model("small"), 512)
    # FFN 12 ms of 30, attention 12
    assert f"| small | 40% | 40% | 0% | 0% | 0% | 1.00 | {fl.ffn / fl.attention:.2f} |" in md
    nsys = "\n".join(predicted.nsys_lines(tmp_path))
    m = answers.model("small")  # softmax: 5 FLOPs per score; QK^T and PV: 4 d_model per query-key pair
    # forward 10 ms, train 30; matmul share: the matmul group's 50 % + attention matmuls 3 ms of 10 (of 30)
    assert (f"| small, 512 | 10 | 30 | `dot_general` (feed-forward) 50% | `dot_general` (feed-forward) 50% | 80% | "
            f"60% | 2.00 ({5 * m.num_heads / (4 * m.d_model):.3f}) |") in nsys
    assert "| large, 1024 |" in nsys and "the copies group is launch-bound (30 launches, 1% of the step)" in nsys
    assert "(c) Non-matmul ops with the most predicted time in the forward pass at context 1024: `small`: " \
           "`jvp()/div` (attention softmax and mask" in nsys
    launch = predicted.LAUNCH_MS / 0.005  # share of the reduce_sum's 5 µs launches that is the launch's fixed cost
    assert (f"`reduce_sum` (optimizer and clipping) launches 394 kernels of 5.0 µs on average, "
            f"{100 * launch:.0f}% of its time the {1e3 * predicted.LAUNCH_MS:.0f} µs cost of each launch") in nsys
    assert "Not predicted yet" in "\n".join(predicted.nsys_lines(tmp_path / "none"))
