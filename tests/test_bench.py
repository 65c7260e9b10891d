"""jaxlm.flops against XLA and both models, and every `python -m jaxlm.bench` command end to end on tiny configs (CPU)."""

import argparse
import csv
import functools
import importlib
import json
import math

import pytest
import torch
from flax import nnx

import torchref
from jaxlm import cli
from jaxlm.analysis import flops
from jaxlm.bench import core, jax_side
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.nn.model import TransformerLM, count_params
from parity.bench import (  # jaxlm.bench's commands with the torch side added
    COMMANDS,
    main,
)
from parity.convert import torch_config
from tests.train_helpers import make_corpus, tiny_overrides

TINY = ["--set", "model.d_model=32", "--set", "model.num_layers=2", "--set", "model.num_heads=2",
        "--set", "model.vocab_size=67", "--set", "model.d_ff=96"]
TINY_CFG = ModelConfig(d_model=32, num_layers=2, num_heads=2, vocab_size=67, d_ff=96, context_length=32)


# --------------------------------------------------------------------------- analytic model


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(tie_embeddings=True), dict(ffn="silu"), dict(norm="none", rope=False), dict(d_model=60, num_heads=5)],
)
def test_param_counts_match_both_models(overrides):
    cfg = ModelConfig(**{**dict(d_model=48, num_layers=3, num_heads=4, vocab_size=101, context_length=16), **overrides})
    counts = flops.param_counts(cfg)
    assert counts["total"] == count_params(TransformerLM(cfg, rngs=nnx.Rngs(0)))
    assert counts["total"] == torchref.TransformerLM(torch_config(cfg)).num_params()
    assert counts["non_embedding"] == counts["total"] - cfg.vocab_size * cfg.d_model


# Measured on CPU (jax 0.10.2): XLA's cost_analysis() flops exceed the analytic matmul count by
# 0.2-2.8 % for forward, forward+backward and train step at d_model 128-512, contexts 64-256
# (elementwise work: norms, softmax, SiLU, RoPE, AdamW). Tolerance 5 %.
FLOP_TOLERANCE = 0.05


@pytest.mark.parametrize("mode", ["forward", "forward_backward", "train_step"])
def test_flops_agree_with_xla_cost_analysis(mode):
    cfg = ModelConfig(d_model=256, num_layers=2, num_heads=4, vocab_size=512, context_length=128)
    compiled = jax_side.compile_step(jax_side.build_step(mode, cfg, ComputeConfig(), 2, 128))
    xla = jax_side.compiled_flops(compiled)
    analytic = flops.step_flops(cfg, 2, 128, mode)
    assert xla is not None
    assert abs(xla / analytic - 1) < FLOP_TOLERANCE, (xla, analytic)
    assert xla >= analytic  # XLA counts every matmul we count, plus elementwise work


def test_step_flops_and_mfu_hand_counted():
    """d=4, d_ff=8, vocab 10, 1 layer, 3 tokens, counted by hand at 2mkn FLOPs per (m,k)x(k,n) matmul:
    q/k/v/output projections 4 x 2*3*4*4 = 384; Q K^T and P V 2 x 2*3*3*4 = 144 (heads sum to d);
    SwiGLU 3 x 2*3*4*8 = 576; head 2*3*4*10 = 240: 1344 per sequence. Parameters: embedding 40,
    attention 64, ffn 96, norms 12, head 40 = 252."""
    cfg = ModelConfig(d_model=4, d_ff=8, vocab_size=10, num_layers=1, num_heads=2, context_length=3)
    assert flops.param_counts(cfg)["total"] == 252
    assert flops.step_flops(cfg, 2, 3, "forward") == 2 * 1344
    assert flops.step_flops(cfg, 2, 3, "forward_backward") == 3 * 2 * 1344
    assert flops.step_flops(cfg, 2, 3, "train_step") == 3 * 2 * 1344 + 12 * 252
    # 1000 tokens/s x 1344 training FLOPs per token on a 1e7 FLOP/s device
    assert flops.mfu(1000, cfg, 3, "any", override=1e7) == pytest.approx(0.1344)
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert flops.peak_flops("cpu", "float32") is None


# --------------------------------------------------------------------------- the tool


def test_sweep_both_frameworks_writes_json_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["model", *TINY, "--context", "16", "32", "--batch", "1", "2", "--mode", "forward",
               "--dtype", "float32", "bfloat16", "--framework", "both", "--no-compile", "--warmup", "1",
               "--steps", "2", "--json", str(out), "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "png"),
               "--quiet"])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 2 * 2
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    for r in rows:
        assert r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["params"] == flops.param_counts(TINY_CFG)["total"]
        assert r["flops_per_step"] == flops.step_flops(TINY_CFG, r["batch"], r["context"], "forward")
    jax_rows = [r for r in rows if r["framework"] == "jax"]
    assert all(r["memory_source"] == "memory_analysis" and r["memory_gb"] > 0 for r in jax_rows)
    assert all(r["jax_torch_speed"] > 0 for r in jax_rows)
    with open(tmp_path / "r.csv") as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    pngs = {p.name: p.stat().st_size for p in (tmp_path / "png").glob("*.png")}
    for name in ("memory_vs_context.png", "memory_vs_batch.png", "throughput_vs_batch.png", "optimisation_bf16.png"):
        assert pngs.get(name, 0) > 1000, pngs
    assert "speedup vs torch" in capsys.readouterr().out

    # The experiments runner's path: plots from the saved JSON alone.
    assert main(["plot", str(out), "--out", str(tmp_path / "again")]) == 0
    assert len(list((tmp_path / "again").glob("*.png"))) == len(pngs)


def test_oom_rows_do_not_stop_the_sweep():
    opts = core.Options(warmup=1, steps=1, memory_limit_gb=0.05)
    settings = [core.Setting("jax", "forward"), core.Setting("torch", "forward", compile=False)]
    rows = core.run_sweep(TINY_CFG, settings, [16], [1, 100_000, 2], opts)
    assert [r["status"] for r in rows] == ["ok", "OOM", "ok"] * 2
    assert all("memory-limit-gb" in r["error"] for r in rows if r["status"] == "OOM")


def test_invalid_setting_is_a_row_not_a_crash():
    (row,) = core.run_sweep(TINY_CFG, [core.Setting("jax", "forward", "float32", "cudnn")], [16], [1],
                            core.Options(warmup=0, steps=1))
    assert row["status"] == "invalid" and "cudnn" in row["error"]


def test_find_max_batch_search():
    calls = []

    def fits(b):
        calls.append(b)
        return b <= 37

    assert core.find_max_batch(fits) == 37
    assert len(calls) < 15
    assert core.find_max_batch(lambda b: False) == 0
    assert core.find_max_batch(lambda b: True, limit=100) == 100
    assert core.find_max_batch(lambda b: b <= 64) == 64


def test_find_max_batch_against_the_memory_limit_estimate():
    setting = core.Setting("jax", "forward")
    limit_gb = 0.0005
    opts = core.Options(memory_limit_gb=limit_gb)
    est = functools.cache(lambda b: core.estimate_bytes(setting, TINY_CFG, ComputeConfig(), b, 32))
    probed = []
    fits = core.batch_fits(setting, TINY_CFG, 32, opts)
    best = core.find_max_batch(lambda b: probed.append(b) or fits(b), limit=256)
    assert best > 1
    assert est(best) <= limit_gb * 1e9 < est(best + 1)
    assert est(1) < est(best // 2) < est(best)  # monotone in the batch


def test_breakdown_and_memory_profile(tmp_path):
    from jaxlm.bench.breakdown import component_breakdown
    from jaxlm.bench.memory_profile import memory_profile

    res = component_breakdown(TINY_CFG, ComputeConfig(), 2, 16, warmup=1, steps=1)
    comps = res["components"]
    assert set(comps) == {"attention", "ffn", "lm_head"}
    assert sum(c["flop_share"] for c in comps.values()) == pytest.approx(1.0)
    assert all(c["forward_s"] > 0 for c in comps.values())
    paths = memory_profile(TINY_CFG, ComputeConfig(), 2, 16, tmp_path, torch_too=True)
    names = {p.name for p in paths}
    assert {"jax_forward.prof", "jax_train_step.prof", "jax_train_step_buffers.txt"} <= names
    assert all(p.stat().st_size > 0 for p in paths)
    if not torch.cuda.is_available():
        assert "torch_memory_snapshot_skipped.txt" in names


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("argv", [["model", "--batch", "4", "0"], ["model", "--context", "0"], ["model", "--steps", "0"],
                                  ["decode", "--batch", "0"], ["decode", "--new-tokens", "-1"], ["data", "--batch", "0"],
                                  ["data", "--context", "0"], ["nanogpt", "--steps", "0"]])
def test_sizes_below_one_are_one_line_errors(argv, capsys):
    assert cli.run(main, argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {argv[1]} {argv[-1]}: "), err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_shows_its_default(command):
    parser = argparse.ArgumentParser(formatter_class=cli.HelpFormatter)
    importlib.import_module(COMMANDS[command][0]).add_args(parser)
    formatter = cli.HelpFormatter("x")
    for action in parser._actions:
        if action.option_strings and action.default != argparse.SUPPRESS:
            shown = not (action.default is None or action.default is False or action.default == [])  # else: "not given"
            assert action.help and (not shown or "default" in formatter._get_help_string(action)), action.option_strings


def test_decode_bench_counts_tokens_and_compilations(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["decode", *TINY, "--set", "model.context_length=16", "--prompt-tokens", "4", "--new-tokens", "20",
                 "--batch", "2", "--repeats", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["model"]["context_length"] == 24  # raised to prompt + new tokens: no sliding in the timed calls
    assert res["compiled"] == {"prefill": 1, "decode": 1, "full": 1}  # one compilation each, reused by every call
    for mode in ("cache", "no-cache"):
        r = res[mode]
        assert r["tokens_per_second"] == pytest.approx(2 * 20 / r["seconds_mean"])
    assert res["speedup"] == pytest.approx(res["cache"]["tokens_per_second"] / res["no-cache"]["tokens_per_second"])
    assert "speedup of the cache" in capsys.readouterr().out


def test_nanogpt_baseline_trains_the_recipe(tmp_path, capsys):
    corpus = make_corpus(tmp_path / "corpus")
    flags = [a for o in tiny_overrides(corpus, tmp_path / "run", **{"train.steps": 6}) for a in ("--set", o)]
    assert main(["nanogpt", *flags, "--steps", "3", "--warmup", "1"]) == 0
    timed = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert timed["timed_steps"] == 3 and timed["step_time_s"] > 0
    assert timed["extrapolated_total_s"] == pytest.approx(6 * timed["step_time_s"])
    assert abs(timed["train_loss"] - math.log(257)) < 1.0  # 4 steps from a random init: about ln(vocab)
    assert main(["nanogpt", *flags, "--full", "--warmup", "1"]) == 0
    full = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert full["timed_steps"] == 5 and math.isfinite(full["val_loss"]) and full["val_loss"] < math.log(257) + 0.5


def test_experiments_bench_runs_call_the_model_command(tmp_path):
    from experiments.commands import build_bench
    from experiments.spec import RunSpec

    spec = RunSpec(name="b", kind="bench", set={"model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2,
                                                "model.vocab_size": 67, "optim.lr": 1.0},
                   args={"context": [16], "batch": [1], "steps": 1, "warmup": 0, "quiet": True})
    argv = build_bench(spec, tmp_path)
    assert argv[1:4] == ["-m", "jaxlm.bench", "model"] and "optim.lr=1.0" not in argv
    assert main(argv[3:]) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [(r["status"], r["context"], r["batch"]) for r in rows] == [("ok", 16, 1)]


def test_compiled_matmuls_count_remat_and_show_bfloat16_through_float32_on_cpu():
    cfg = ModelConfig(d_model=64, num_layers=2, num_heads=4, vocab_size=257, context_length=32)

    def matmuls(compute):
        return jax_side.compiled_matmuls(jax_side.compile_step(jax_side.build_step("train_step", cfg, compute, 2, 32)))

    plain = matmuls(ComputeConfig())
    # By hand: per layer q, k, v, output, QK^T, PV, w1, w3, w2 (9) plus the head; backward two per forward dot.
    assert plain == {"hlo_dots": 3 * (9 * 2 + 1), "matmul_dtypes": ["f32"]}
    assert matmuls(ComputeConfig(remat="full"))["hlo_dots"] > plain["hlo_dots"]  # the recomputation, compiled
    assert matmuls(ComputeConfig(dtype="bfloat16"))["matmul_dtypes"] == ["f32"]  # XLA:CPU: bfloat16 through float32


def test_jaxlm_bench_alone_asks_for_parity_bench_for_torch_rows(capsys):
    from jaxlm.cli import bench

    saved = core.SIDES.pop("torch", None)  # as in a process that never imported parity.bench
    try:
        assert cli.run(bench.main, ["model", *TINY, "--framework", "both", "--context", "8", "--batch", "1"]) == 2
    finally:
        if saved:
            core.SIDES["torch"] = saved
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "python -m parity.bench model" in err[0], err
