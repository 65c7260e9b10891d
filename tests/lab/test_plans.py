"""Experiment plans: grid/size expansion and precedence, seeds, errors naming file and key, the shipped plans,
and the run-time estimates against recorded runs."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from experiments.estimate import THROUGHPUT, bench_seconds, plan_seconds
from experiments.plan import PlanError, load_plan, plan_names
from experiments.run import run_plan
from jaxlm.core.typedconfig import toml_value
from tests.lab.plan_helpers import CPU, write

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- parsing


def test_grid_sizes_and_precedence(tmp_path):
    plan = write(
        tmp_path / "p.toml",
        """
        [defaults]
        kind = "train"
        config = "experiments/configs/quickstart.toml"
        set = { "train.steps" = 10, "model.d_model" = 64 }
        [sizes.cpu]
        set = { train = { steps = 20 } }
        [sizes.gpu]
        set = { "train.steps" = 5000 }
        [[runs]]
        name = "{technique}_b{data.batch_size}"
        grid.technique = [{ label = "fp32" }, { label = "bf16", set = { "compute.dtype" = "bfloat16" } }]
        grid."data.batch_size" = [8, 16]
        sizes.gpu.grid = { "data.batch_size" = [64] }
        [[runs]]
        name = "gpu_only"
        only_sizes = ["gpu"]
        """,
    )
    cpu = load_plan(plan, "cpu")
    assert [r.name for r in cpu.runs] == ["fp32_b8", "fp32_b16", "bf16_b8", "bf16_b16"]
    r = cpu.runs[3]
    assert r.set == {"train.steps": 20, "model.d_model": 64, "compute.dtype": "bfloat16", "data.batch_size": 16}
    assert r.axes == {"technique": "bf16", "data.batch_size": 16}
    gpu = load_plan(plan, "gpu")
    assert [r.name for r in gpu.runs] == ["fp32_b64", "bf16_b64", "gpu_only"]
    assert gpu.runs[0].set["train.steps"] == 5000
    assert cpu.runs[0].hash != gpu.runs[0].hash


def seeded_plan(tmp_path: Path, seeds: list[int], runs: str) -> Path:
    """A plan of train runs (quickstart's config) over `seeds`, with `runs` ([[runs]] tables)."""
    head = f'[plan]\nseeds = {seeds}\n[defaults]\nkind = "train"\nconfig = "experiments/configs/quickstart.toml"\n'
    return write(tmp_path / "p.toml", head + textwrap.dedent(runs))


def test_seeds_expand_train_runs_seed_major(tmp_path):
    plan = seeded_plan(
        tmp_path, [0, 7],
        """
        [[runs]]
        name = "lr{optim.lr}"
        grid = { "optim.lr" = [1e-3, 1e-2] }
        [[runs]]
        name = "bench"
        kind = "bench"
        """,
    )
    runs = load_plan(plan).runs
    assert [r.name for r in runs] == ["lr0.001-s0", "lr0.01-s0", "bench", "lr0.001-s7", "lr0.01-s7"]
    assert runs[3].set == {"optim.lr": 1e-3, "train.seed": 7} and runs[3].axes == {"optim.lr": 1e-3, "seed": 7}
    assert runs[2].axes == {} and "train.seed" not in runs[2].set
    assert len({r.hash for r in runs}) == 5


def test_unseeded_runs_and_per_seed_commands(tmp_path):
    """`seeded = false` runs a train run once; a command naming {seed} runs after each seed's training runs."""
    plan = seeded_plan(
        tmp_path, [0, 1],
        """
        [[runs]]
        name = "pretrain"
        seeded = false
        [[runs]]
        name = "tune"
        set = { "train.init_from" = "runs/p/pretrain" }
        [[runs]]
        name = "eval"
        kind = "command"
        argv = ["{python}", "-c", "pass", "{run_dir}/../tune-s{seed}"]
        [[runs]]
        name = "once"
        kind = "command"
        argv = ["{python}", "-c", "pass"]
        """,
    )
    runs = load_plan(plan).runs
    assert [r.name for r in runs] == ["pretrain", "tune-s0", "eval-s0", "once", "tune-s1", "eval-s1"]
    assert "train.seed" not in runs[0].set and runs[0].axes == {}
    assert runs[5].argv[-1] == "{run_dir}/../tune-s1" and runs[5].axes == {"seed": 1}


@pytest.mark.parametrize(
    "body, needle",
    [
        ("[[runs]]\nname = 'a'\nkind = 'command'\nargv = ['x', '{seed}']",
         "'a': its argv names {seed} but the plan has no [plan].seeds"),
        ("[plan]\nseeds = [0]\n[[runs]]\nname = 'a'\nkind = 'bench'\nseeded = 'no'",
         "runs[0] (a).seeded: expected true or false"),
        ("[defaults]\nkind = 'train'\nbogus = 1\n[[runs]]\nname = 'a'", "[defaults]: unknown key 'bogus'"),
        ("[[runs]]\nname = 'a'\nkind = 'train'\nconfig = 'x.toml'\nsett = {}", "runs[0] (a): unknown key 'sett'"),
        ("[[runs]]\nname = 'a'\nkind = 'trian'", "runs[0] (a).kind: 'trian' is not one of"),
        ("[[runs]]\nname = 'a{optim.lr}'\nkind = 'train'\nconfig = 'c'\ngrid = { 'optim.lr' = 3 }",
         "grid.optim.lr: expected a non-empty list"),
        ("[[runs]]\nname = 'a{x}'\nkind = 'bench'\ngrid = { batch = [1] }", "'{x}' is not a grid axis"),
        ("[[runs]]\nname = 'a'\nkind = 'bench'\ngrid = { batch = [1, 2] }", "run names are not unique: a"),
        ("[[runs]]\nname = 'a'\nkind = 'train'", "a train run needs 'config'"),
        ("[[runs]]\nname = 'a'\nkind = 'bench'\nrequires = 'tpu'", "requires: 'tpu' is not one of"),
        ("[runz]\n", "unknown key 'runz'"),
        ("[[runs]]\nname = 'a'\nkind = 'bench'\n[sizes.cpu]\nset = 3", "[sizes.cpu].set: expected a table"),
        ("[[runs]\nname = 'a'", "not valid TOML"),
        ("[plan]\nseeds = [0, 0]\n[[runs]]\nname = 'a'\nkind = 'bench'",
         "[plan].seeds: expected a non-empty list of distinct integers"),
        ("[plan]\nseeds = 3\n[[runs]]\nname = 'a'\nkind = 'bench'", "[plan].seeds: expected a non-empty list"),
    ],
)
def test_plan_errors_name_file_and_key(tmp_path, body, needle):
    path = write(tmp_path / "broken.toml", body)
    with pytest.raises(PlanError) as e:
        load_plan(path)
    assert str(path) in str(e.value) and needle in str(e.value), str(e.value)


def test_bad_config_override_fails_before_running(tmp_path):
    path = write(
        tmp_path / "p.toml",
        """
        [[runs]]
        name = "typo"
        kind = "train"
        config = "experiments/configs/quickstart.toml"
        set = { "optim.lrr" = 1e-3 }
        """,
    )
    with pytest.raises(PlanError, match=r"p\.toml: run 'typo': .*unknown key 'optim\.lrr'"):
        run_plan(load_plan(path), tmp_path / "runs", device=CPU)
    assert not (tmp_path / "runs" / "typo").exists()


def test_toml_values_round_trip():
    from jaxlm.core.typedconfig import parse_override

    for v in (3, 1e-3, True, "bfloat16", "a \"quoted\" path", [1, 2], ["x.txt"]):
        assert parse_override(f"a.b={toml_value(v)}")[1] == v


def test_shipped_plans_parse_for_every_size():
    plans = sorted(p for p in (REPO / "experiments" / "plans").glob("*.toml") if not p.name.startswith("_"))
    assert plans, "no plans shipped"
    for path in plans:
        first = load_plan(path)
        for size in first.sizes:
            plan = load_plan(path, size)
            assert plan.runs, f"{path.name} [{size}] has no runs"


def test_no_plan_lists_every_plan_with_its_estimates(capsys):
    from experiments.run import main

    assert main([]) == 0
    out = capsys.readouterr().out
    for name in plan_names():
        assert re.search(rf"^  {name}  \(cpu: \d+ runs, ~\d+ (s|min)", out, re.MULTILINE), out
    assert "Learning-rate sweep at a fixed number of steps:" in out
    # the CS395T studies' WikiText setting, CPU and GPU
    model_size = out[out.index("  model_size  ("):out.index("  optimizations  (")]
    assert ("data: cpu: train wikitext-2/test.txt, validate wikitext-2/valid.txt, tokenizer bpe:4096; gpu:\n"
            "      train "
            "wikitext103/wiki.train.raw, validate wikitext103/wiki.valid.raw, tokenizer bpe:16384") in model_size


# The lr_sweep plan as it was recorded on an otherwise idle 2-core x86 CPU (commit 24e072cc30): six runs of a
# 2-layer, 64-wide model, 300 steps at batch 16, context 64; 32.7 s in all (the sum of its total-time column).
RECORDED_LR_SWEEP = """
[defaults]
kind = "train"
config = "experiments/configs/quickstart.toml"
[defaults.set]
"data.dir" = "runs/data/tinyshakespeare-bytes"
"data.source" = ["tinyshakespeare"]
"model.vocab_size" = 257
model = { context_length = 64, d_model = 64, num_layers = 2, num_heads = 4, d_ff = 192 }
data = { batch_size = 16, eval_tokens = 20480 }
train = { steps = 300, eval_every = 100 }
[[runs]]
name = "lr{optim.lr}"
grid = { "optim.lr" = [3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 30.0] }
"""


def test_estimate_matches_the_recorded_cpu_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    plan = load_plan(write(tmp_path / "recorded.toml", RECORDED_LR_SWEEP), "default")
    seconds, unknown = plan_seconds(plan.runs, "cpu")
    assert unknown == 0 and seconds == pytest.approx(32.7, rel=0.25)
    run_plan(plan, Path("/nonexistent/runs"), dry_run=True, device=CPU)
    out = capsys.readouterr().out
    assert "[6/6] lr30 (train, ~6 s): " in out and f"estimated time: ~{seconds:.0f} s on cpu (fitted" in out


def test_bench_estimate_counts_every_row():
    tp = THROUGHPUT["cpu"]
    args = {"context": [64, 128], "batch": 2, "mode": "train_step"}
    one = bench_seconds(args, [], tp) - tp.startup_s
    four = bench_seconds({**args, "dtype": ["float32", "bfloat16"], "framework": "both"}, [], tp) - tp.startup_s
    assert four == pytest.approx(4 * one)
    assert bench_seconds({**args, "find_max_batch": True}, [], tp) is None  # its length depends on the outcome
