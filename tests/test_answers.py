"""experiments.answers: the analytical answers against hand calculations, and the measured answers from a bench result."""

import json

import pytest

from experiments import answers
from jaxlm import cli
from jaxlm.analysis import flops, memory
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
    est = memory.estimate(m, 7, T, ComputeConfig(loss_chunk=0))
    assert est.activation_total == pytest.approx(7 * per_seq)
    b = answers.max_batch(sum(fixed.values()), per_seq, 80e9)
    assert sum(fixed.values()) + b * per_seq <= 80e9 < sum(fixed.values()) + (b + 1) * per_seq
    bf16 = ComputeConfig(dtype="bfloat16", attention="cudnn", loss_chunk=0)  # the weights' bfloat16 copies count too
    fixed, per_seq = answers.memory_terms(m, T, bf16)
    assert sum(fixed.values()) == 18 * 2_127_057_600
    assert answers.max_batch(sum(fixed.values()), per_seq, 80e9) == memory.largest_batch(m, T, 80e9, bf16)


def test_document_has_every_answer_with_the_hand_numbers(tmp_path):
    out = tmp_path / "a.md"
    assert cli.run(answers.main, ["--out", str(out)]) == 0
    text = out.read_text()
    for heading in ("## 1. Parameters", "## 2. Forward FLOPs", "### Context 1024", "### Context 16384",
                    "## 3. AdamW memory", "## 4. Training time", "## 5. Measured timings"):
        assert heading in text
    assert "2,127,057,600" in text and "4,513,336,524,800" in text
    days = 400_000 * (3 * 1024 * 4_513_336_524_800 + 12 * 2_127_057_600) / (0.5 * 989e12) / 86400
    assert f"| bfloat16 | 989 TFLOP/s | {days:,.1f} |" in text


def test_measured_answers_from_a_bench_result(tmp_path):
    rows = [{"framework": "jax", "mode": m, "dtype": "float32", "attention": "xla", "remat": "none", "context": 64,
             "batch": 2, "status": "ok", "step_ms": ms, "step_ms_std": 0.5} for m, ms in (("forward", 10.0), ("forward_backward", 31.0))]
    comps = {"attention": {"forward_s": 0.004, "flops_forward": 1e9}, "ffn": {"forward_s": 0.006, "flops_forward": 3e9}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"meta": {"breakdown": [{"context": 64, "batch": 2, "dtype": "float32", "components": comps}]},
                                "rows": rows}))
    text = "\n".join(answers.measured_section(path))
    assert "| jax | forward | float32 | 64 | 2 | 10 | 0.5 |" in text
    assert "backward 21 ms (2.10x the forward" in text
    assert "time ratio 1.50, FLOP ratio 3.00" in text


def test_missing_bench_is_one_line(tmp_path, capsys):
    assert cli.run(answers.main, ["--bench", str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --bench") and "nope.json" in err and "\n" not in err
