"""The torch side of `python -m jaxlm.bench` (parity's plugin: parity/bench_plugin.py, parity/bench_torch.py,
parity/nanogpt.py): torchref rows beside jaxlm's on tiny configs (CPU)."""

import argparse
import importlib
import json
import math
import os
import subprocess
import sys

import jax
import pytest
import torch
from flax import nnx

import torchref
from jaxlm import cli
from jaxlm.analysis import flops
from jaxlm.bench import measure, sides
from jaxlm.bench.commands import main
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.nn.model import TransformerLM
from parity.convert import torch_config
from tests.train_helpers import ROOT, make_corpus, tiny_overrides

TINY = ["--set", "model.d_model=32", "--set", "model.num_layers=2", "--set", "model.num_heads=2",
        "--set", "model.vocab_size=67", "--set", "model.d_ff=96"]
TINY_CFG = ModelConfig(d_model=32, num_layers=2, num_heads=2, vocab_size=67, d_ff=96, context_length=32)


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(tie_embeddings=True), dict(ffn="silu"), dict(norm="none", rope=False), dict(d_model=60, num_heads=5)],
)
def test_param_counts_match_both_models(overrides):
    cfg = ModelConfig(**{**dict(d_model=48, num_layers=3, num_heads=4, vocab_size=101, context_length=16), **overrides})
    counts = flops.param_counts(cfg)
    params = nnx.state(TransformerLM(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    assert counts["total"] == sum(p.size for p in jax.tree.leaves(params))
    assert counts["total"] == torchref.TransformerLM(torch_config(cfg)).num_params()
    assert counts["non_embedding"] == counts["total"] - cfg.vocab_size * cfg.d_model


def test_the_torch_side_is_a_plugin_found_through_its_entry_point():
    plugin = sides.plugins()["torch"]
    assert (plugin.module, plugin.extra) == ("parity.bench_torch", "torch") and "nanogpt" in sides.commands()
    assert sides.load("torch").__name__ == "parity.bench_torch"
    gone = subprocess.run([sys.executable, "-m", "parity.bench"], capture_output=True, text=True, cwd=ROOT)
    assert gone.returncode != 0 and "No module named parity.bench" in gone.stderr  # one entry point: jaxlm.bench


def test_sweep_both_frameworks_gives_jax_and_torch_rows_with_a_ratio(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["model", *TINY, "--context", "16", "--batch", "1", "2", "--mode", "forward", "--dtype", "float32",
                 "bfloat16", "--framework", "both", "--no-compile", "--warmup", "1", "--steps", "2",
                 "--json", str(out), "--quiet"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["framework"] for r in rows] == ["jax"] * 4 + ["torch"] * 4
    assert all(r["status"] == "ok" and r["step_ms"] > 0 for r in rows), [r.get("error") for r in rows]
    assert all(r["compiled"] is False and r["memory_source"] == "n/a (cpu)" for r in rows[4:])  # --no-compile: eager
    for r in rows[:4]:
        torch_row = next(t for t in rows[4:] if (t["dtype"], t["batch"]) == (r["dtype"], r["batch"]))
        assert r["reference"] == "torch" and r["speed_vs_reference"] > 0 and r["busy"] in (True, False)
        low, high = r["speed_vs_reference_iqr"]  # two rounds: the median of the two per-round ratios
        assert low <= r["speed_vs_reference"] <= high
        assert r["params"] == torch_row["params"] and r["flops_per_step"] == torch_row["flops_per_step"]
    assert "speedup vs torch" in capsys.readouterr().out


def test_torch_rows_over_the_memory_limit_are_oom_without_running():
    rows = measure.run_sweep(TINY_CFG, [measure.BenchCase("torch", "forward")], [16], [1, 100_000],
                             measure.Options(warmup=1, steps=1, memory_limit_gb=0.05, side_args={"no_compile": True}))
    assert [r["status"] for r in rows] == ["ok", "OOM"] and rows[1]["memory_source"] == "analytic estimate"


@pytest.mark.parametrize("form", ["forward", "input grad", "weight grad"])
def test_torch_matmul_calls_compute_the_forms_of_a_train_step(form):
    import numpy as np

    from jaxlm.bench.matmul import FORMS
    from parity import bench_torch

    _, shapes, product = FORMS[form]
    a, b = (np.random.default_rng(0).standard_normal(s).astype(np.float64) for s in shapes(24, 7, 5))
    expected = {"forward": lambda: a @ b.T, "input grad": lambda: a @ b, "weight grad": lambda: a.T @ b}[form]()
    got = bench_torch.matmul_call(product, a.astype(np.float32), b.astype(np.float32))().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # against float64


def test_matmul_command_times_every_projection_in_every_form(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["matmul", *TINY, "--context", "16", "--batch", "2", "--repeats", "2", "--framework", "both",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    shapes = {(r["projection"], r["form"]): r["m_k_n"] for r in rows}
    assert len(shapes) == 4 * 3
    assert shapes["feed-forward in", "weight grad"] == "32x32->96" and shapes["output head", "forward"] == "32x32->67"
    for r in rows:
        assert r["jax_gflops"] > 0 and r["torch_gflops"] > 0 and r["reference"] == "torch"
        assert r["speed_vs_reference"] == pytest.approx(r["jax_gflops"] / r["torch_gflops"])
    assert "jax/torch" in capsys.readouterr().out


def test_the_memory_profile_asks_the_torch_side_too(tmp_path):
    from jaxlm.bench.memory_profile import memory_profile

    names = {p.name for p in memory_profile(TINY_CFG, ComputeConfig(), 2, 16, tmp_path, other_sides=("torch",))}
    assert "jax_train_step.prof" in names
    torch_file = ("torch_train_step_snapshot.pickle" if torch.cuda.is_available()
                  else "torch_memory_snapshot_skipped.txt")
    assert torch_file in names


def test_the_plugin_options_and_command_show_their_defaults():
    parser = argparse.ArgumentParser(formatter_class=cli.HelpFormatter)
    importlib.import_module("jaxlm.bench.sweep").add_args(parser)
    importlib.import_module("parity.nanogpt").add_args(nano := argparse.ArgumentParser())
    formatter = cli.HelpFormatter("x")
    options = {o for a in parser._actions for o in a.option_strings}
    assert {"--no-compile", "--torch-optimizer"} <= options
    for action in [*parser._actions, *nano._actions]:
        if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in formatter._get_help_string(action), action.option_strings
    assert "the 'torch' extra" in sides.commands()["nanogpt"][1]


def test_nanogpt_sizes_below_one_are_one_line_errors(capsys):
    assert cli.run(main, ["nanogpt", "--steps", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: --steps 0: must be >= 1"]


def test_decode_against_torchref_gives_the_same_greedy_tokens(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["decode", *TINY, "--set", "model.context_length=16", "--prompt-tokens", "4", "--new-tokens", "20",
                 "--batch", "2", "--repeats", "1", "--framework", "both", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    for mode in ("cache", "no-cache"):
        assert res["torch"][mode]["tokens_per_second"] == pytest.approx(2 * 20 / res["torch"][mode]["seconds_mean"])
        # torchref's eager loop on the same weights gives the same greedy tokens, and the ratio is of the two rows.
        compared = res["compared"][mode]
        assert compared["greedy_tokens_identical"] and compared["first_difference"] is None
        speed = res["jax"][mode]["tokens_per_second"] / res["torch"][mode]["tokens_per_second"]
        assert compared["speed_vs_reference"] == pytest.approx(speed) and compared["reference"] == "torch"
    assert "greedy tokens identical" in capsys.readouterr().out


def test_nanogpt_baseline_trains_the_recipe_and_says_which_ratio_it_prints(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "corpus")
    flags = [a for o in tiny_overrides(corpus, tmp_path / "run", **{"train.steps": 6}) for a in ("--set", o)]
    out = tmp_path / "n.json"
    assert main(["nanogpt", *flags, "--steps", "3", "--warmup", "1", "--json", str(out)]) == 0
    timed = json.loads(out.read_text())
    assert timed["timed_steps"] == 3 and timed["step_time_s"] > 0
    assert timed["extrapolated_total_s"] == pytest.approx(6 * timed["step_time_s"])
    assert abs(timed["train_loss"] - math.log(257)) < 1.0  # 4 steps from a random init: about ln(vocab)
    assert f"{1e3 * timed['step_time_s']:10.1f} ms per step" in capsys.readouterr().out
    assert main(["nanogpt", *flags, "--full", "--warmup", "1", "--json", str(out)]) == 0
    full = json.loads(out.read_text())
    assert full["timed_steps"] == 5 and math.isfinite(full["val_loss"]) and full["val_loss"] < math.log(257) + 0.5
    # side by side: jaxlm's train step (the trainer's, 2 steps per call) and the loop, 3 timed blocks each
    capsys.readouterr()
    assert main(["nanogpt", *flags, "--set", "train.steps_per_call=2", "--steps", "6", "--framework", "both",
                 "--json", str(out)]) == 0
    both, printed = json.loads(out.read_text()), capsys.readouterr().out
    assert (both["steps_per_block"], both["blocks"]) == (2, 3) and both["speedup"] > 0
    assert both["speedup_iqr"][0] <= both["speedup"] <= both["speedup_iqr"][1]
    assert both["speedup_of_medians"] == pytest.approx(both["torch_step_time_s"] / both["jax_step_time_s"])
    for side in ("jax", "torch"):  # each side trained: its loss fell below ln(vocab) (settling adds many steps)
        assert both[f"{side}_step_time_s"] > 0 and 0 < both[f"{side}_train_loss"] < math.log(257) - 0.5
        assert f"{1e3 * both[f'{side}_step_time_s']:20.2f}" in printed
    assert ("the median over the blocks of (the loop's time / jaxlm's in the same block)" in printed
            if not both["busy"] else "speedup of jaxlm over the loop withheld: " in printed)


def test_op_profile_places_torch_ops_by_name_and_pass():
    from parity.bench_torch import op_category

    assert op_category("aten::mm", "backward") == "projection matmuls, backward"
    assert op_category("aten::bmm", "forward") == "attention matmuls, forward"
    assert op_category("graph_0_cpp_fused_clone_transpose_view_5", "forward") == "copies and transposes"
    assert op_category("graph_0_cpp_fused__unsafe_view_amax_exp_gather_log_mean_3", "forward").startswith("loss")
    assert op_category("graph_0_cpp_fused_mul_sigmoid_5", "backward") == "element-wise and reductions, backward"
    assert op_category("aten::_foreach_sqrt", "optimizer") == "optimizer, clipping, metrics"
    assert op_category("CompiledFunctionBackward", "backward") == "dispatch and bookkeeping"


@pytest.mark.parametrize("framework", [
    "jax", pytest.param("both", marks=[pytest.mark.slow, pytest.mark.extended])])
def test_ops_command_profiles_each_side(tmp_path, framework):
    """In a fresh process (XLA:CPU's per-op events need a flag set before JAX starts). `both` adds torch.compile's
    profile (20 s more on a CPU); its op placement is covered by test_op_profile_places_torch_ops_by_name_and_pass,
    the jax side by the `jax` case."""
    out = tmp_path / "ops.json"
    r = subprocess.run([sys.executable, "-m", "jaxlm.bench", "ops", *TINY, "--context", "16", "--batch", "2",
                        "--steps", "2", "--warmup", "1", "--framework", framework, "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    for side in ("jax", "torch") if framework == "both" else (framework,):
        cats = res[side]["categories"]
        assert cats["projection matmuls, forward"] > 0 and cats["projection matmuls, backward"] > 0, (side, cats)
        assert res[side]["ops_ms"] == pytest.approx(sum(cats.values()))
        assert len(res[side]["top"]) == 12
