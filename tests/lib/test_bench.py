"""jaxlm.analysis.flops against XLA, the benchmark's timing and rows, and every `python -m jaxlm.bench` command of the
library end to end on tiny configs (CPU). No torch: the torch side's rows are tests/parity/test_bench_torch.py."""

import argparse
import csv
import functools
import importlib
import json
import sys
from collections import Counter

import jax
import pytest

from jaxlm import cli
from jaxlm.analysis import flops
from jaxlm.analysis.memory import search_largest
from jaxlm.bench import measure, output, sides, steps, timing
from jaxlm.bench.commands import COMMANDS, main
from jaxlm.core.config import ComputeConfig, Config, ModelConfig, OptimConfig

TINY = ["--set", "model.d_model=32", "--set", "model.num_layers=2", "--set", "model.num_heads=2",
        "--set", "model.vocab_size=67", "--set", "model.d_ff=96"]
TINY_CFG = ModelConfig(d_model=32, num_layers=2, num_heads=2, vocab_size=67, d_ff=96, context_length=32)


# --------------------------------------------------------------------------- analytic model

# Measured on CPU (jax 0.10.2): XLA's cost_analysis() flops exceed the analytic matmul count by
# 0.2-2.8 % for forward, forward+backward and train step at d_model 128-512, contexts 64-256
# (elementwise work: norms, softmax, SiLU, RoPE, AdamW). Tolerance 5 %.
FLOP_TOLERANCE = 0.05


@pytest.mark.parametrize("mode", [pytest.param("forward", marks=pytest.mark.extended),
                                  pytest.param("forward_backward", marks=pytest.mark.extended), "train_step"])
def test_flops_agree_with_xla_cost_analysis(mode):
    """Extended: forward and forward_backward, in train_step's count (by hand: test_step_flops_and_mfu_hand_counted)."""
    cfg = ModelConfig(d_model=256, num_layers=2, num_heads=4, vocab_size=512, context_length=128)
    xla = steps.compiled_flops(steps.compile_step(steps.build_step(mode, cfg, ComputeConfig(), 2, 128)))
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
    assert flops.step_flops(cfg, 2, 3, "train_step") == 3 * 2 * 1344 + 14 * 252  # AdamW: 3 + 4 + 5 + 2 per parameter
    # 1000 tokens/s x 1344 training FLOPs per token on a 1e7 FLOP/s device
    assert flops.mfu(1000, cfg, 3, "any", override=1e7) == pytest.approx(0.1344)
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989e12
    assert flops.peak_flops("cpu", "float32") is None


# --------------------------------------------------------------------------- the step timed is training's


def test_the_train_step_timed_is_the_one_training_builds():
    """Two steps of the benchmark's step and of `python -m jaxlm.train`'s (loop.build) from one config: the same
    losses and weights, to the bit, and the optimizer is the config's (its learning rate, 100x the default)."""
    from jaxlm.core import sharding
    from jaxlm.training.loop import build

    run = Config(model=TINY_CFG, optim=OptimConfig(lr=0.1, warmup_steps=0))
    step = steps.build_step("train_step", TINY_CFG, ComputeConfig(), 4, 16, seed=3, run=run)
    full = steps.run_config(TINY_CFG, ComputeConfig(), 4, 3, run)
    built = build(full, sharding.make_mesh(jax.devices()[:1], full.parallel))
    state = jax.jit(built.make_state, out_shardings=built.shardings)()
    args = step.args
    for _ in range(2):
        out = step.jitted(*args)
        state, metrics = built.step_fn(state, *args[1:])
        assert float(out[1]["loss"]) == float(metrics["loss"]) and float(metrics["lr"]) == pytest.approx(0.1, rel=1e-4)
        args = step.advance(args, out)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), args[0].params, state.params)))


# --------------------------------------------------------------------------- the one timing loop


def test_time_calls_warms_up_settles_and_waits_for_every_call():
    calls, waited = [], []
    got = timing.time_calls(lambda: calls.append(1) or len(calls), 3, warmup=2, wait=waited.append, settled=True)
    assert len(got.seconds) == 3 and all(s >= 0 for s in got.seconds) and got.cpu_s >= 0
    assert len(calls) >= 2 + 1 + 3 and waited == list(range(1, len(calls) + 1))  # every call waited for, in order
    assert timing.time_calls(lambda: None, 0, warmup=0).seconds == []


def test_the_machine_reading_counts_other_processes_only():
    busy = timing.machine_busy_seconds()
    if busy is None:
        pytest.skip("no /proc/stat here: the load is not measured")
    with timing.Load() as load:
        sum(i * i for i in range(2_000_000))  # this process's own CPU time is not the others'
    assert load.other_cpus is not None and 0 <= load.other_cpus <= load.cpus


class ScriptedSide:
    """A side whose steps take scripted times: `timed()` is what the scripted loop below reads."""

    events = []  # ("prepare" | "finish", side name) in the order run_group asks

    def __init__(self, name, seconds, device="cpu", fail_at=None):
        self.name, self.seconds, self.device, self.fail_at, self.log, self.done = name, seconds, device, fail_at, [], 0

    def device_kind(self):
        return self.device

    def prepare(self, setting, cfg, compute, batch, context, opts, row):
        self.events.append(("prepare", self.name))

        def call():
            return None

        def timed():
            if self.fail_at is not None and self.done == self.fail_at:
                raise RuntimeError("a step failed half way")
            self.done += 1
            return self.seconds[(self.done - 1) % len(self.seconds)]

        call.timed, call.side = timed, self
        return call, lambda out: out, lambda: self.events.append(("finish", self.name)) or row.update(memory_gb=0.0)


def scripted_time_calls(call, n, *, warmup=0, wait=None, settled=False):
    """`timing.time_calls` with the scripted side's times instead of a clock."""
    if n:
        call.side.log.append((call.side.name, n))
    return timing.Timing([call.timed() for _ in range(n)], 0.0)


@pytest.fixture
def scripted(monkeypatch):
    """Install scripted sides "jax" and "ref" on a quiet machine; returns the function that sets them up."""
    monkeypatch.setattr(measure, "time_calls", scripted_time_calls)
    monkeypatch.setattr(timing, "machine_busy_seconds", lambda: None)  # the load: not measured unless a test says

    def install(own, ref):
        monkeypatch.setattr(ScriptedSide, "events", [])
        monkeypatch.setattr(sides, "LOADED", {"jax": own, "ref": ref})

    return install


PAIR = [measure.BenchCase("jax", "forward"), measure.BenchCase("ref", "forward")]


def test_rows_on_the_cpu_are_timed_in_alternating_rounds_and_compared_round_by_round(scripted):
    # jax is twice as fast in every round but the last, where the machine slows it 10x: the median of
    # the paired ratios says 2.0, a ratio of the mean times would say 8 / 13 = 0.62.
    own, ref = ScriptedSide("jax", [1.0, 1.0, 1.0, 10.0]), ScriptedSide("ref", [2.0])
    scripted(own, ref)
    rows = measure.run_sweep(TINY_CFG, PAIR, [16], [1], measure.Options(warmup=0, steps=4))
    assert own.log == [("jax", 1)] * 4 and ref.log == [("ref", 1)] * 4  # one timed step per round
    jax_row, ref_row = rows
    assert jax_row["step_ms"] == pytest.approx(1e3 * 13 / 4) and ref_row["step_ms"] == pytest.approx(2e3)
    assert jax_row["speed_vs_reference"] == pytest.approx(2.0) and jax_row["reference"] == "ref"
    assert jax_row["speed_vs_reference_iqr"] == pytest.approx([2.0 * 0.75 + 0.2 * 0.25, 2.0])
    table = output.format_table(rows)
    assert "speedup vs ref" in table and "2 (1.55-2)" in table
    # the printed step ms (3.25 vs 2000) give 0.62: the table says the 2.0 is the median of per-round ratios
    assert table.splitlines()[-1] == f"speedup vs ref: {measure.PAIRED_RATIO}" and "median" in measure.PAIRED_RATIO
    assert ScriptedSide.events == [("prepare", "jax"), ("prepare", "ref"), ("finish", "jax"), ("finish", "ref")]


def test_interleaved_rounds_alternate_their_order(scripted, monkeypatch):
    scripted(ScriptedSide("jax", [1.0]), ScriptedSide("ref", [1.0]))
    order = []

    def logged(call, n, **kw):
        if n:
            order.append(call.side.name)
        return scripted_time_calls(call, n, **kw)

    monkeypatch.setattr(measure, "time_calls", logged)
    measure.run_sweep(TINY_CFG, PAIR, [16], [1], measure.Options(warmup=0, steps=4))
    assert order == ["jax", "ref", "ref", "jax", "jax", "ref", "ref", "jax"]


def test_a_row_that_fails_half_way_is_an_error_row_and_the_others_finish(scripted):
    scripted(ScriptedSide("jax", [1.0], fail_at=2), ScriptedSide("ref", [2.0]))
    jax_row, ref_row = measure.run_sweep(TINY_CFG, PAIR, [16], [1], measure.Options(warmup=0, steps=4))
    assert jax_row["status"] == "error" and "half way" in jax_row["error"] and jax_row["speed_vs_reference"] is None
    assert ref_row["status"] == "ok" and ref_row["step_ms"] == pytest.approx(2e3)


def test_rows_off_the_cpu_are_timed_one_after_the_other(scripted):
    own, ref = ScriptedSide("jax", [1.0], device="gpu"), ScriptedSide("ref", [2.0], device="gpu")
    scripted(own, ref)
    jax_row, _ = measure.run_sweep(TINY_CFG, PAIR, [16], [1], measure.Options(warmup=0, steps=5))
    assert own.log == [("jax", 5)] and ref.log == [("ref", 5)]
    assert jax_row["speed_vs_reference"] == pytest.approx(2.0) and "speed_vs_reference_iqr" not in jax_row
    assert output.format_table([jax_row, _]).splitlines()[-1] == f"speedup vs ref: {measure.MEAN_RATIO}"
    # each row released before the next is built: a GPU need not hold both models at once
    assert ScriptedSide.events == [("prepare", "jax"), ("finish", "jax"), ("prepare", "ref"), ("finish", "ref")]


@pytest.mark.parametrize("others_share, busy", [(0.5, True), (0.02, False)])
def test_rows_timed_on_a_busy_machine_are_marked_and_their_ratio_is_not_printed(scripted, monkeypatch, others_share,
                                                                               busy):
    """A simulated reading: over 10 s this process took 5 CPU-seconds and the others `others_share` of the CPUs."""
    scripted(ScriptedSide("jax", [1.0]), ScriptedSide("ref", [2.0]))
    cpus = timing.Load().cpus
    readings = iter([timing.Snapshot(0.0, 0.0, 100.0), timing.Snapshot(10.0, 5.0, 105.0 + others_share * cpus * 10)])
    monkeypatch.setattr(timing, "snapshot", lambda: next(readings))
    rows = measure.run_sweep(TINY_CFG, PAIR, [16], [1], measure.Options(warmup=0, steps=3))
    assert [r["busy"] for r in rows] == [busy, busy]
    assert rows[0]["other_cpus"] == pytest.approx(others_share * cpus)
    assert rows[0]["speed_vs_reference"] == pytest.approx(2.0)  # kept in the JSON, with the mark
    lines = output.format_table(rows).splitlines()
    if busy:
        assert lines[2].split()[-1] == "withheld" and lines[2].split()[-2] == "busy"
        assert len(lines) == 5 and lines[-1].startswith("speedup vs ref withheld: other processes kept up to ")
    else:
        assert len(lines) == 5 and lines[2].split()[-3:] == ["quiet", "2", "(2-2)"]
        assert lines[-1] == f"speedup vs ref: {measure.PAIRED_RATIO}"


def test_oom_and_invalid_rows_do_not_stop_the_sweep():
    rows = measure.run_sweep(TINY_CFG, [measure.BenchCase("jax", "forward")], [16], [1, 100_000, 2],
                             measure.Options(warmup=1, steps=1, memory_limit_gb=0.05))
    assert [r["status"] for r in rows] == ["ok", "OOM", "ok"]
    assert "memory-limit-gb" in rows[1]["error"]
    (row,) = measure.run_sweep(TINY_CFG, [measure.BenchCase("jax", "forward", "float32", "cudnn")], [16], [1],
                               measure.Options(warmup=0, steps=1))
    assert row["status"] == "invalid" and "cudnn" in row["error"]


# --------------------------------------------------------------------------- the commands


def test_sweep_writes_json_and_csv(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["model", *TINY, "--context", "16", "--batch", "2", "--mode", "forward", "train_step",
                 "--warmup", "1", "--steps", "2", "--json", str(out), "--csv", str(tmp_path / "r.csv"), "--quiet"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1 * 2 and all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    for r in rows:
        assert r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["params"] == flops.param_counts(TINY_CFG)["total"]
        assert r["flops_per_step"] == flops.step_flops(TINY_CFG, r["batch"], r["context"], r["mode"])
        assert r["memory_source"] == "memory_analysis" and r["memory_gb"] > 0 and r["compiled"] is True
        assert r["busy"] in (True, False, None) and r["speed_vs_reference"] is None
    with open(tmp_path / "r.csv") as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    assert "step ms" in capsys.readouterr().out


def test_a_side_whose_extra_is_missing_stops_in_one_line_naming_the_extra_and_the_option(monkeypatch, capsys):
    """The torch side found through parity's entry point, with torch not importable (as on the core install)."""
    monkeypatch.setattr(sides, "LOADED", {})
    monkeypatch.delitem(sys.modules, "parity.bench_torch", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ModuleNotFoundError
    assert sides.plugins()["torch"].module == "parity.bench_torch"  # `pip install -e .` registered the entry point
    for argv in (["model", *TINY, "--framework", "both", "--context", "8", "--batch", "1"],
                 ["decode", *TINY, "--framework", "torch"], ["matmul", *TINY, "--framework", "both"]):
        assert cli.run(main, argv) == 1
        err = capsys.readouterr().err.splitlines()
        flag = f"--framework {argv[-1] if argv[0] != 'model' else 'both'}"
        assert err == [f"error: {flag}: the torch side needs the 'torch' extra (torch is not installed): "
                       "pip install -e '.[torch]'"], err


def test_every_command_and_option_says_what_it_needs_and_its_default():
    for command, (module, help) in COMMANDS.items():
        assert "core install" in help, command
        parser = argparse.ArgumentParser(formatter_class=cli.HelpFormatter)
        importlib.import_module(module).add_args(parser)
        formatter = cli.HelpFormatter("x")
        for action in parser._actions:
            if action.option_strings and action.default != argparse.SUPPRESS:
                shown = not (action.default is None or action.default is False or action.default == [])
                assert action.help and (not shown or "default" in formatter._get_help_string(action)), action
            if "--framework" in action.option_strings:
                assert "the 'torch' extra" in action.help and action.choices == ["jax", "torch", "both"]


@pytest.mark.parametrize("argv", [["model", "--batch", "4", "0"], ["model", "--context", "0"],
                                  ["model", "--steps", "0"], ["decode", "--batch", "0"],
                                  ["decode", "--new-tokens", "-1"], ["data", "--batch", "0"],
                                  ["data", "--context", "0"]])
def test_sizes_below_one_are_one_line_errors(argv, capsys):
    assert cli.run(main, argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {argv[1]} {argv[-1]}: "), err


def test_find_max_batch_against_the_memory_limit_estimate(monkeypatch):
    setting = measure.BenchCase("jax", "forward")
    limit_gb = 0.0005
    # one compile per batch, the search's and the checks' alike
    monkeypatch.setattr(measure, "estimate_bytes", functools.cache(measure.estimate_bytes))
    est = lambda b: measure.estimate_bytes(setting, TINY_CFG, ComputeConfig(), b, 32)
    best = search_largest(measure.batch_fits(setting, TINY_CFG, 32, measure.Options(memory_limit_gb=limit_gb)), 256)
    assert best > 1
    assert est(best) <= limit_gb * 1e9 < est(best + 1)
    assert est(1) < est(best // 2) < est(best)  # monotone in the batch


def test_breakdown_and_memory_profile(tmp_path):
    from jaxlm.bench.breakdown import component_breakdown
    from jaxlm.bench.memory_profile import memory_profile

    comps = component_breakdown(TINY_CFG, ComputeConfig(), 2, 16, warmup=1, steps=1)["components"]
    assert set(comps) == {"attention", "ffn", "lm_head"}
    assert sum(c["flop_share"] for c in comps.values()) == pytest.approx(1.0)
    assert all(c["forward_s"] > 0 for c in comps.values())
    paths = memory_profile(TINY_CFG, ComputeConfig(), 2, 16, tmp_path)
    assert {"jax_forward.prof", "jax_train_step.prof", "jax_train_step_buffers.txt"} <= {p.name for p in paths}
    assert all(p.stat().st_size > 0 for p in paths)


def test_decode_bench_counts_tokens_and_compilations(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["decode", *TINY, "--set", "model.context_length=16", "--prompt-tokens", "4", "--new-tokens", "20",
                 "--batch", "2", "--repeats", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["model"]["context_length"] == 24  # raised to prompt + new tokens: no sliding in the timed calls
    for mode in ("cache", "no-cache"):
        assert res["jax"][mode]["compiled"] == {"begin": 1, "resume": 0}  # one compiled generation for every call
        assert res["jax"][mode]["tokens_per_second"] == pytest.approx(2 * 20 / res["jax"][mode]["seconds_mean"])
    cache, no_cache = res["jax"]["cache"]["tokens_per_second"], res["jax"]["no-cache"]["tokens_per_second"]
    assert res["jax"]["speedup"] == pytest.approx(cache / no_cache)
    assert "speedup of the jax cache" in capsys.readouterr().out


def test_decode_first_difference():
    from jaxlm.bench.decode import first_difference

    assert first_difference([[1, 2], [3, 4]], [[1, 2], [3, 4]]) is None
    assert first_difference([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == [1, 1]
    assert first_difference([[1, 2]], [[1, 2, 7]]) == [0, 2]  # one row stopped earlier


@pytest.mark.parametrize("form", ["forward", "input grad", "weight grad"])
def test_matmul_calls_compute_the_forms_of_a_train_step(form):
    import numpy as np

    from jaxlm.bench.matmul import FORMS

    _, shapes, product = FORMS[form]
    a, b = (np.random.default_rng(0).standard_normal(s).astype(np.float64) for s in shapes(24, 7, 5))
    expected = {"forward": lambda: a @ b.T, "input grad": lambda: a @ b, "weight grad": lambda: a.T @ b}[form]()
    got = steps.matmul_call(product, a.astype(np.float32), b.astype(np.float32))()
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)  # against float64


def test_experiments_bench_runs_call_the_model_command(tmp_path):
    from experiments.commands import build_bench
    from experiments.plan import RunSpec

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
        return steps.compiled_matmuls(steps.compile_step(steps.build_step("train_step", cfg, compute, 2, 32)))

    plain = matmuls(ComputeConfig())
    # By hand: per layer q, k, v, output, QK^T, PV, w1, w3, w2 (9) plus the head; backward two per forward dot.
    assert plain == {"hlo_dots": 3 * (9 * 2 + 1), "matmul_dtypes": ["f32"]}
    assert matmuls(ComputeConfig(remat="full"))["hlo_dots"] > plain["hlo_dots"]  # the recomputation, compiled
    assert matmuls(ComputeConfig(dtype="bfloat16"))["matmul_dtypes"] == ["f32"]  # XLA:CPU: bfloat16 through float32


def test_op_profile_places_every_matmul_of_the_compiled_train_step():
    from jaxlm.bench.op_profile import category, parse_hlo, per_step

    hlo = parse_hlo(steps.compile_step(steps.build_step("train_step", TINY_CFG, ComputeConfig(), 2, 16)).as_text())
    places = Counter(category(op, TINY_CFG.vocab_size) for op in hlo.values() if op.opcode == "dot"
                     or op.op_name.endswith("/dot_general"))
    L = TINY_CFG.num_layers  # by hand: per layer q, k, v, output, w1, w3, w2 projections and QK^T, PV; the head
    assert places == {"projection matmuls, forward": 7 * L + 1, "attention matmuls, forward": 2 * L,
                      "projection matmuls, backward": 2 * (7 * L + 1), "attention matmuls, backward": 2 * 2 * L}
    assert "optimizer, clipping, metrics" in {category(op, TINY_CFG.vocab_size) for op in hlo.values()}
    assert per_step([1.0, 2.0, 3.0, 4.0], 2, "mean") == 5.0  # two steps
    assert per_step([1.0, 2.0, 3.0, 4.0], 2, "min") == 3.0  # two runs a step: min(1, 3) + min(2, 4)
    assert per_step([1.0, 2.0, 3.0], 2, "min") == 3.0  # runs that do not divide into the steps: the mean


def test_the_library_side_is_built_in_and_both_adds_every_plugged_in_side():
    assert sides.load("jax") is steps and sides.chosen("jax") == ["jax"]
    assert sides.chosen("both") == ["jax", *sides.plugins()] and "torch" in sides.plugins()
