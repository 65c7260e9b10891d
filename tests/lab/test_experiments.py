"""The experiment runner and report: plan parsing, a real two-run training plan end to end,
resuming after an interruption, failure / divergence labels, and report numbers against the JSON."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments.estimate import THROUGHPUT, bench_seconds, plan_seconds
from experiments.plan import PlanError, load_plan, plan_names
from experiments.report.build import write_report
from experiments.run import Device, run_plan
from jaxlm.core.errors import UsageError
from jaxlm.core.typedconfig import toml_value

REPO = Path(__file__).resolve().parents[2]
CPU = Device("cpu", "cpu", 1)

# A stand-in program for `command` runs: counts its invocations, logs a loss curve, and
# fails / diverges / blocks on request.
FAKE = textwrap.dedent(
    """
    import json, math, os, sys, time
    run_dir, mode = sys.argv[1], sys.argv[2]
    os.makedirs(run_dir, exist_ok=True)
    counter = os.path.join(run_dir, "..", "calls-" + os.path.basename(run_dir))
    n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
    open(counter, "w").write(str(n))
    print("started", flush=True)
    if mode == "block" and os.path.exists(os.path.join(run_dir, "..", "BLOCK")):
        time.sleep(3600)  # until the test interrupts the runner
    loss = 4.0
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        for step in range(1, 4):
            loss = float("nan") if mode == "nan" and step == 3 else loss * 0.8
            f.write(json.dumps({"step": step, "kind": "train", "time": time.time(), "train/loss": loss}) + "\\n")
        f.write(json.dumps({"step": 3, "kind": "eval", "time": time.time(), "eval/loss": loss,
                            "eval/perplexity": math.exp(loss)}) + "\\n")
    if mode == "fail":
        print("something broke: a detail worth keeping", file=sys.stderr)
        sys.exit(3)
    if mode == "nan":
        print("error: loss nan, parameter norm 12.5 at step 3 (grad_norm nan, lr 0.01); stopped without saving",
              file=sys.stderr)
        sys.exit(1)
    """
)


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def command_plan(tmp_path: Path, runs: str) -> Path:
    """A plan of `command` runs; FAKE in `runs` stands for the fake program's path."""
    fake = write(tmp_path / "fake.py", FAKE)
    body = f"""
        [defaults]
        kind = "command"
        argv = ["{{python}}", "{fake}", "{{run_dir}}", "ok"]
        """
    return write(tmp_path / "fakeplan.toml", textwrap.dedent(body) + textwrap.dedent(runs).replace("FAKE", str(fake)))


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
    assert main(["--list"]) == 0 and capsys.readouterr().out == out
    # the CS395T studies' WikiText setting, CPU and GPU
    model_size = out[out.index("  model_size  ("):out.index("  optimizations  (")]
    assert ("data: cpu: train wikitext-2/test.txt, validate wikitext-2/valid.txt, tokenizer bpe:4096; gpu:\n"
            "      train wikitext103/wiki.train.raw, validate wikitext103/wiki.valid.raw, tokenizer bpe:16384"
            ) in model_size


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
    seconds, unknown = plan_seconds(plan, "cpu", lambda spec: False)
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


# --------------------------------------------------------------------------- runner (command kind)


def test_failed_diverged_skipped_are_labelled_and_the_plan_continues(tmp_path, monkeypatch):
    plan = command_plan(
        tmp_path,
        """
        [[runs]]
        name = "broken"
        argv = ["{python}", "FAKE", "{run_dir}", "fail"]
        [[runs]]
        name = "nan"
        argv = ["{python}", "FAKE", "{run_dir}", "nan"]
        [[runs]]
        name = "needs_gpu"
        requires = "gpu"
        [[runs]]
        name = "flash"
        set = { "compute.attention" = "cudnn" }
        [[runs]]
        name = "fine"
        """,
    )
    monkeypatch.chdir(tmp_path)
    counts = run_plan(load_plan(plan), tmp_path / "runs", device=CPU, draft=True)
    assert counts == {"failed": 1, "diverged": 1, "skipped": 2, "ok": 1}
    res = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/result.json")}
    assert "a detail worth keeping" in res["broken"]["error_tail"] and res["broken"]["returncode"] == 3
    assert res["nan"]["status"] == "diverged" and res["nan"]["reason"].startswith("error: loss nan, parameter norm")
    assert "cuDNN" in res["flash"]["reason"] and "cpu" in res["flash"]["reason"]
    assert res["fine"]["metrics"]["eval_loss"] == pytest.approx(4.0 * 0.8**3)
    assert res["fine"]["max_rss_bytes"] > 1e6
    # Failed runs are retried next time; the rest are complete.
    counts = run_plan(load_plan(plan), tmp_path / "runs", device=CPU, draft=True)
    assert counts == {"complete": 4, "failed": 1}


def test_runner_writes_final_records_only_from_a_committed_tree(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    plan = command_plan(tmp_path, """
        [[runs]]
        name = "only"
        """)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="not a git checkout.*--draft"):
        run_plan(load_plan(plan), tmp_path / "runs", device=CPU)
    write(tmp_path / ".gitignore", "/runs/\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "plan")
    (tmp_path / "fake.py").write_text((tmp_path / "fake.py").read_text() + "\n")  # a tracked file modified
    (tmp_path / "new_module.py").touch()  # and an untracked one
    with pytest.raises(UsageError, match=r"uncommitted changes \(fake.py, new_module.py\).*--draft"):
        run_plan(load_plan(plan), tmp_path / "runs", device=CPU)
    assert not (tmp_path / "runs").exists()
    assert run_plan(load_plan(plan), tmp_path / "runs", device=CPU, dry_run=True) == {"pending": 1}
    assert run_plan(load_plan(plan), tmp_path / "runs", device=CPU, draft=True) == {"ok": 1}
    draft = json.loads((tmp_path / "runs" / "only" / "result.json").read_text())["git"]
    assert draft["dirty"] is True and draft["draft"] is True
    git("add", "-A")
    git("commit", "-qm", "the change")
    shutil.rmtree(tmp_path / "runs")
    assert run_plan(load_plan(plan), tmp_path / "runs", device=CPU) == {"ok": 1}
    final = json.loads((tmp_path / "runs" / "only" / "result.json").read_text())["git"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert final == {"commit": head, "dirty": False, "changed": [], "draft": False}


def test_interrupted_plan_resumes_without_redoing_finished_runs(tmp_path):
    plan = command_plan(
        tmp_path,
        """
        [[runs]]
        name = "first"
        [[runs]]
        name = "second"
        argv = ["{python}", "FAKE", "{run_dir}", "block"]
        """,
    )
    runs = tmp_path / "runs" / "fakeplan"
    runs.mkdir(parents=True)
    (runs / "BLOCK").touch()
    cmd = [sys.executable, "-m", "experiments.run", str(plan), "--runs-dir", str(tmp_path / "runs"), "--draft"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # As from a terminal: a test runner started in the background (`cmd &`) passes SIGINT on ignored.
    terminal = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=terminal)
    while not (runs / "calls-second").exists() and proc.poll() is None:  # no time limit: the machine may be busy
        time.sleep(0.1)
    assert (runs / "first" / "result.json").exists()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out
    assert json.loads((runs / "second" / "result.json").read_text())["status"] == "interrupted"  # resumed, not wiped
    first_mtime = (runs / "first" / "result.json").stat().st_mtime_ns

    (runs / "BLOCK").unlink()
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[1/2] first (command): already ok, skipped" in done.stdout
    assert (runs / "first" / "result.json").stat().st_mtime_ns == first_mtime
    assert (runs / "calls-first").read_text() == "1" and (runs / "calls-second").read_text() == "2"
    assert json.loads((runs / "second" / "result.json").read_text())["resumed"] is True
    assert json.loads((runs / "plan.json").read_text())["file"] == "fakeplan.toml"  # no machine path


# --------------------------------------------------------------------------- real training, end to end


@pytest.mark.slow
def test_two_run_training_plan_end_to_end_and_report(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    plan_path = write(
        tmp_path / "smoke.toml",
        f"""
        [plan]
        description = "two tiny training runs"
        [defaults]
        kind = "train"
        config = "experiments/configs/quickstart.toml"
        [defaults.set]
        "data.dir" = "{tmp_path / 'data'}"
        model = {{ d_model = 32, num_layers = 1, num_heads = 2, d_ff = 64, context_length = 32 }}
        data = {{ batch_size = 4, eval_tokens = 256 }}
        train = {{ steps = 12, eval_every = 6 }}
        log = {{ every = 3, progress = false, tensorboard = false, sample_tokens = 8 }}
        optim.warmup_steps = 2
        checkpoint.every = 100
        [[runs]]
        name = "w{{model.d_model}}"
        grid = {{ "model.d_model" = [32, 48] }}
        [report]
        baseline = {{ "model.d_model" = 32 }}
        x = "model.d_model"
        """,
    )
    plan = load_plan(plan_path)
    plan_dir = tmp_path / "runs" / "smoke"
    assert run_plan(plan, plan_dir, device=CPU, draft=True) == {"ok": 2}

    results = {n: json.loads((plan_dir / n / "result.json").read_text()) for n in ("w32", "w48")}
    for name, r in results.items():
        assert r["status"] == "ok" and r["device"] == "cpu" and r["config"]["train"]["out_dir"] == str(plan_dir / name)
        assert r["metrics"]["steps"] == 12 and math.isfinite(r["metrics"]["eval_loss"])
        assert r["metrics"]["tokens"] == 12 * 4 * 32
        assert r["wall_time_s"] > 0 and "commit" in r["git"] and r["git"]["draft"] is True
        assert r["versions"]["jax"] == importlib.metadata.version("jax") and r["versions"]["python"].startswith("3.")
        assert r["data"]["tokens"]["train"] > 0 and r["data"]["tokenizer"] == "bytes"
    assert results["w48"]["metrics"]["params"] > results["w32"]["metrics"]["params"]

    mtimes = {n: (plan_dir / n / "result.json").stat().st_mtime_ns for n in results}
    assert run_plan(plan, plan_dir, device=CPU, draft=True) == {"complete": 2}
    assert {n: (plan_dir / n / "result.json").stat().st_mtime_ns for n in results} == mtimes

    report = write_report(plan_dir, tmp_path / "report")
    text = report.read_text()
    runs_table = text[text.index("## Runs"):]
    for name, r in results.items():
        row = next(line for line in runs_table.splitlines() if line.startswith(f"| `{name}`"))
        assert f"{r['metrics']['eval_loss']:.3f}" in row and f"{r['metrics']['eval_ppl']:.2f}" in row
    base, other = results["w32"]["metrics"]["eval_ppl"], results["w48"]["metrics"]["eval_ppl"]
    change = 100 * (other - base) / base
    phrase = ("left validation perplexity unchanged" if abs(change) < 0.5
              else f"validation perplexity by {abs(change):.0f}%")
    assert re.search(rf"model\.d_model=48 against model\.d_model=32: .*{phrase}", text), text
    assert (tmp_path / "report" / "curves_by_step.png").stat().st_size > 1000
    assert (tmp_path / "report" / "model_d_model_vs_metrics.png").exists()


def test_missing_corpus_parses_but_refuses_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXLM_DATA", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)  # plans run from the repository root; here one without runs/
    (tmp_path / "experiments").symlink_to(REPO / "experiments")
    plan = load_plan("lr_sweep", "cpu")
    assert plan.runs[0].set["data.source"] == ["wikitext-2/test.txt"]
    with pytest.raises(PlanError, match=r"lr0\.001-s0.*wikitext-2/test\.txt: corpus 'wikitext-2' not found; "
                                        r"run `python -m jaxlm\.data download wikitext-2`"):
        run_plan(plan, tmp_path / "runs", dry_run=True, device=CPU)


# --------------------------------------------------------------------------- seeds and findings


def test_seed_statistics_by_hand():
    from experiments.report.noise import Family, holm, judged, t_quantile
    from experiments.report.seeds import Stats, compare_phrase, resolved

    # Student's t table: t(0.975, 2) = 4.303, t(0.975, 4) = 2.776
    assert t_quantile(0.975, 2) == pytest.approx(4.303, abs=5e-4) and t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-4)
    a = Stats.of([2.0, 2.1, 1.9])  # mean 2.0, sample std 0.1; 95 % half-width 4.303 * 0.1 / sqrt(3) = 0.2484
    assert (a.mean, a.std, a.lo, a.hi, a.ci) == pytest.approx((2.0, 0.1, 1.9, 2.1, 0.2484), abs=1e-4)
    worse = Stats.of([2.3, 2.4, 2.2])  # Welch: t = 0.3 / sqrt(0.01/3 + 0.01/3) = 3.674 on 4 df > 2.776: p < 0.05
    close = Stats.of([2.1, 2.2, 2.0])  # t = 1.225 < 2.776
    alone = Family()
    assert resolved(worse, a, alone) is True and resolved(close, a, alone) is False
    assert resolved(Stats.of([2.5]), a, alone) is None
    assert compare_phrase(worse, a, alone) == "validation loss 2.300 ± 0.248 against 2.000 ± 0.248 (+15.0%, beyond noise)"
    # Holm over p = 0.01, 0.04, 0.03: 3 x 0.01 = 0.03, then max(0.03, 2 x 0.03) = 0.06, then max(0.06, 1 x 0.04) = 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # worse vs a: p between 0.05 and 0.02 (2.776 < 3.674 < 3.747, the 0.99 quantile on 4 df); with two more
    # comparisons Holm multiplies it by 3 (> 0.06): within noise. The repeated comparison (a vs worse) counts once.
    verdicts, family = judged(lambda f: [resolved(worse, a, f), resolved(close, a, f), resolved(a, a, f), resolved(a, worse, f)])
    assert verdicts == [False, False, False, False] and family.size == 3
    assert "Holm's correction over the 3 comparisons" in family.note()


def fake_seeded_plan(plan_dir: Path, name: str, finals: dict[str, list[float]], axis: str, report: dict) -> None:
    """A plan directory as the runner leaves it: per seed a result.json and a metrics.jsonl ending at `final`."""
    plan_dir.mkdir(parents=True)
    runs = []
    for label, losses in finals.items():
        for seed, final in enumerate(losses):
            run = f"{label}-s{seed}"
            (plan_dir / run).mkdir()
            recs = [{"step": s, "kind": "eval", "time": 1000.0 + s, "eval/loss": final + (100 - s) / 50} for s in (50, 100)]
            recs += [{"step": s, "kind": "train", "time": 1000.0 + s, "train/loss": final + 0.1, "perf/step_time_s": 0.01} for s in (25, 50, 75, 100)]
            (plan_dir / run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
            value = label if axis == "variant" else float(label.split("=")[1])
            batch = int(value) if axis == "data.batch_size" else 2
            result = {"name": run, "plan": name, "kind": "train", "status": "ok" if math.isfinite(final) else "diverged", "axes": {axis: value, "seed": seed},
                      "device": "cpu", "metrics": {"steps": 100, "tokens": 100 * batch * 8, "eval_loss": final, "step_time": 0.01, "params": 1000},
                      "config": {"model": {"vocab_size": 257, "context_length": 8}, "data": {"batch_size": batch}}}
            (plan_dir / run / "result.json").write_text(json.dumps(result))
            runs.append({"name": run, "kind": "train", "axes": result["axes"]})
    (plan_dir / "plan.json").write_text(json.dumps({"name": name, "size": "cpu", "report": report, "runs": runs}))


def test_seeded_report_findings_and_records_round_trip(tmp_path):
    plan_dir = tmp_path / "runs" / "ablations"
    fake_seeded_plan(plan_dir, "ablations", {
        "baseline": [2.0, 2.1, 1.9],
        "no_norm": [2.5, 2.6, 2.4],  # worse beyond noise (p 0.0036, x4 by Holm): agree
        "post_norm": [2.1, 2.2, 2.0],  # within noise: agree ("about as well")
        "nope": [2.05, 2.15, 1.95],  # worse, but within noise: not resolved
        "silu": [1.6, 1.7, 1.5],  # better beyond noise (p 0.008, x3 by Holm): disagree
    }, "variant", {"baseline": {"variant": "baseline"}})
    out = tmp_path / "docs" / "ablations"
    text = write_report(plan_dir, out, records=True).read_text()
    verdicts = {f["claim"]: f["verdict"] for f in json.loads((out / "findings.json").read_text())["findings"]}
    assert verdicts == {"removing RMSNorm hurts": "agree", "post-norm trains about as well as pre-norm": "agree",
                        "NoPE is worse than RoPE": "not resolved at this size", "SwiGLU beats the ungated SiLU feed-forward": "disagree"}
    assert "| `no_norm` | no_norm | 3 | ok |" in text and "2.500 ± 0.248" in text and "+25.0% (beyond noise)" in text
    assert "`nope` against `baseline`: validation loss 2.050 ± 0.248 against 2.000 ± 0.248 (+2.5%, within noise)" in text
    # Measured: 4 losses and 4 step times against the baseline (best vs next repeats silu vs baseline): silu's
    # p 0.008 x 7 > 0.05 is within noise there, though beyond it among the findings' 4 comparisons.
    assert "Holm's correction over the 4 comparisons" in text and "Holm's correction over the 8 comparisons" in text
    assert "`silu` against `baseline`: validation loss 1.600 ± 0.248 against 2.000 ± 0.248 (-20.0%, within noise)" in text
    assert "above the baseline at 2 of 2 evaluations" in text
    rebuilt = write_report(out / "records", tmp_path / "rebuilt").read_text()
    assert rebuilt == text
    assert (tmp_path / "rebuilt" / "curves_by_step.png").stat().st_size > 1000


def test_sweep_findings_by_hand(tmp_path):
    from experiments.report.findings import findings_rows
    from experiments.report.noise import Family, judged
    from experiments.report.seeds import equal_token_sentences, group_settings
    from experiments.results import load_results

    plan_dir = tmp_path / "batch_size"
    fake_seeded_plan(plan_dir, "batch_size", {"b=1": [2.6, 2.65, 2.55], "b=8": [2.2, 2.25, 2.15], "b=32": [2.0, 2.02, 1.98]},
                     "data.batch_size", {"x": "data.batch_size"})
    settings = group_settings(load_results(plan_dir))
    rows, _ = judged(lambda noise: findings_rows("batch_size", settings, {"noise": noise}))
    first = rows[0]
    # Welch p: batch 8 vs 1 0.0006, 32 vs 8 0.0113; with the two step-time tests (equal: p 1) Holm gives 0.0024, 0.034
    assert first["verdict"] == "agree" and "batch 1: 2.600 ± 0.124, batch 8: 2.200 ± 0.124, batch 32: 2.000 ± 0.050" in first["measured"]
    assert rows[2]["verdict"] == "disagree"  # every step time is 10 ms: not growing with batch
    # The training loss is logged from step 25 at final + 0.1: batch 8 at batch 1's 800 tokens is step 12.5 (not logged);
    # batch 32 at batch 8's 6400 tokens is step 25: 2.100 ± 0.050 against 2.300 ± 0.124 (Welch p 0.0113).
    assert equal_token_sentences(settings, "data.batch_size", Family()) == [
        "At equal tokens (800, the whole run of data.batch_size=1): data.batch_size=8 logged no training loss that early.",
        "At equal tokens (6.4k, the whole run of data.batch_size=8): data.batch_size=32 training loss 2.100 ± 0.050 "
        "against 2.300 ± 0.124 (-8.7%, beyond noise).",
    ]


def test_memory_fits_by_hand():
    from experiments.report.bench import fit_memory_batch, fit_memory_context

    row = {"status": "ok", "mode": "train_step", "dtype": "float32", "remat": "none"}
    batch = [{**row, "context": 256, "batch": b, "memory_gb": (10e6 + 2e6 * b) / 1e9} for b in (1, 2, 4, 8)]
    text, verdict = fit_memory_batch(batch)
    assert verdict == "agree" and "9.54 MiB + 1.91 MiB per sequence, batch 1-8, R² 1.0000 (largest deviation" in text
    # 10 MB at batch 1, 2, 4 then 100 MB at 8: R² = Sxy² / (Sxx Syy) = 38.25² / (28.75 * 60.75) = 0.8377 (in units of 10 MB)
    step = [{**r, "memory_gb": (0.01 if r["batch"] < 8 else 0.1)} for r in batch]
    assert fit_memory_batch(step)[1] == "disagree" and "R² 0.8377" in fit_memory_batch(step)[0]
    # 1 MB + 1 kB T + 10 B T^2: at T = 512 the T^2 term is 2.62 MB of 4.13 MB (63 %)
    ctx = [{**row, "batch": 4, "context": t, "memory_gb": (1e6 + 1e3 * t + 10 * t * t) / 1e9} for t in (64, 128, 256, 512)]
    text, verdict = fit_memory_context(ctx)
    assert verdict == "agree" and "+ 10 B·T², the T² term 63% of the total at T=512" in text
    flat = [{**r, "memory_gb": (1e6 + 1e3 * r["context"]) / 1e9} for r in ctx]
    assert fit_memory_context(flat)[1] == "disagree"


def test_lr_sweet_spot_by_hand(tmp_path):
    from experiments.report.findings import findings_rows
    from experiments.report.noise import judged
    from experiments.report.seeds import group_settings
    from experiments.results import load_results

    nan = float("nan")
    fake_seeded_plan(tmp_path / "lr", "lr_sweep", {"lr=0.001": [2.2, 2.25, 2.15], "lr=0.003": [2.0, 2.02, 1.98],
                                                   "lr=0.01": [2.1, 2.12, 2.08], "lr=0.1": [nan, nan, nan]}, "optim.lr", {})
    settings = group_settings(load_results(tmp_path / "lr"))
    (sweet, diverge), _ = judged(lambda noise: findings_rows("lr_sweep", settings, {"untrained_loss": math.log(257), "noise": noise}))
    assert sweet["verdict"] == "agree", sweet  # Welch p 0.0113 and 0.0036; Holm over the two: 0.0113, 0.0072
    assert sweet["measured"] == ("best lr 0.003 (val loss 2.000 ± 0.050); lr 0.001: 2.200 ± 0.124, lr 0.01: 2.100 ± 0.050; "
                                 "best beyond noise of every other rate; this best is 3x the seed reports' 1e-3 "
                                 "(where it lies depends on model and batch)")
    assert diverge["verdict"] == "agree" and diverge["measured"] == (
        "lr 0.1 (33x the best): 3 of 3 seeds diverged (non-finite after step 100; non-finite after step 100; non-finite after step 100)")


def test_divergence_defined_and_the_edge_located(tmp_path):
    from experiments.report.divergence import divergence_section
    from experiments.report.seeds import group_settings
    from experiments.results import load_results

    nan = float("nan")
    fake_seeded_plan(tmp_path / "lr", "lr_sweep", {"lr=0.01": [2.1, 2.12, 2.08], "lr=0.02": [2.3, 2.2, 2.25],
                                                   "lr=0.05": [6.0, 2.9, 3.1], "lr=0.1": [nan, 6.1, nan]}, "optim.lr", {})
    stopped = tmp_path / "lr" / "lr=0.1-s2" / "result.json"  # the runner keeps the trainer's stop message as `reason`
    stopped.write_text(json.dumps({**json.loads(stopped.read_text()), "reason": "error: loss 9.1, parameter norm nan at step 45 (lr 0.1)"}))
    text = "\n".join(divergence_section(group_settings(load_results(tmp_path / "lr")), "optim.lr", math.log(257)))
    assert "final validation loss is above ln V" in text
    # ln 257 = 5.549: 6.0 and 6.1 ended above it, the NaN runs stopped; 0.05 is mixed, 0.1 diverged at every seed
    assert "| 0.05 | 3 | 1 | final val loss 6.00 > ln V = 5.55; val loss 2.900; val loss 3.100 |" in text
    assert "| 0.1 | 3 | 3 | non-finite after step 100; final val loss 6.10 > ln V = 5.55; non-finite at step 45 |" in text
    assert ("Edge of stability: every seed trained at lr 0.02 and every seed diverged from lr 0.1 (5x higher); "
            "between them some seeds diverged (lr 0.05).") in text


def test_the_trainers_divergence_line_is_recognised():
    from experiments.run import DIVERGED_RE

    line = "error: loss 5.549072742462158, parameter norm nan at step 41 (grad_norm nan, lr 29.9); stopped without saving"
    assert DIVERGED_RE.search(line) and DIVERGED_RE.search("error: loss -inf, parameter norm 3.2 at step 7 (lr 5)")
    assert not DIVERGED_RE.search("error: loss 5.5 at step 41; data.batch_size must divide by grad_accum")


@pytest.mark.parametrize("plan", sorted(p.parent.name for p in (REPO / "docs" / "results").glob("*/records")))
def test_committed_reports_rebuild_from_their_records(plan, tmp_path, monkeypatch):
    """Each committed CPU report is what `python -m experiments.report docs/results/PLAN/records` writes."""
    monkeypatch.chdir(REPO)
    committed = REPO / "docs" / "results" / plan
    rebuilt = write_report(committed / "records", tmp_path / plan)
    assert rebuilt.read_text() == (committed / "report.md").read_text()
    if (committed / "findings.json").exists():
        assert json.loads((tmp_path / plan / "findings.json").read_text()) == json.loads((committed / "findings.json").read_text())


def test_quantization_and_peft_tables_average_over_seeds(tmp_path):
    """The PTQ / QAT and fine-tuning tables give one row per setting, mean ± 95 % interval over its seeds (by hand)."""
    from experiments.report.noise import Family
    from experiments.report.peft import peft, quantization

    runs = []
    for seed, (f32, int4, qat4) in enumerate([(1.90, 1.92, 1.93), (1.91, 1.93, 1.95), (1.92, 1.94, 1.94)]):
        d = tmp_path / f"ptq-s{seed}"
        d.mkdir()
        rows = [{"run": f"float32-s{seed}", "trained": "float32", "weights": "as trained (float32)", "bits": None, "val_loss": f32, "weight_bytes": 1000},
                {"run": f"float32-s{seed}", "trained": "float32", "weights": "int4 (PTQ)", "bits": 4, "val_loss": int4, "weight_bytes": 250},
                {"run": f"qat_w4a8-s{seed}", "trained": "qat w4a8", "weights": "int4 (PTQ)", "bits": 4, "val_loss": qat4, "weight_bytes": 250}]
        (d / "quantize.json").write_text(json.dumps(rows))
        runs.append({"name": f"ptq-s{seed}", "_dir": str(d)})
    findings, lines = quantization(runs, Family())
    text = "\n".join(lines)
    assert "| float32 | float32 | int4 (PTQ) | 3 | 1.9300 ± 0.0248 | 250 |" in text  # sd 0.01: 4.303 x 0.01 / sqrt(3)
    assert "| qat_w4a8 | qat w4a8 | int4 (PTQ) | 3 | 1.9400 ± 0.0248 | 250 |" in text
    # QAT - PTQ by seed: 0.01, 0.02, 0.00 -> mean 0.0100, sd 0.0100: t = 1.73 < 4.303 on 2 df, within noise
    assert any(f.startswith("At int4") and f.endswith("above PTQ of the float32 model (1.9300 ± 0.0248): "
                                                      "+0.0100 ± 0.0248 (paired by seed, within noise).") for f in findings), findings
    # int4 PTQ - float32 by seed: 0.02 each time -> beyond noise however small the spread
    assert any(f.startswith("float32 with int4 (PTQ) weights") and "+0.0200 ± 0.0000 (paired by seed, beyond noise)" in f
               for f in findings), findings

    tuned = []
    for name, losses, rank in (("full", [2.0, 2.1, 2.2], 0), ("lora_r8", [2.3, 2.3, 2.3], 8)):
        for seed, loss in enumerate(losses):
            d = tmp_path / f"{name}-s{seed}"
            d.mkdir()
            trainable = 100 if not rank else 10
            (d / "metrics.jsonl").write_text(json.dumps({"kind": "params", "params/trainable_params": trainable,
                                                         "params/frozen_params": 100 - trainable, "params/grad_bytes": 4 * trainable,
                                                         "params/optimizer_bytes": 8 * trainable, "params/frozen_bytes": 4 * (100 - trainable)}) + "\n")
            axes = {"method": "lora", "lora.rank": rank, "seed": seed} if rank else {"method": "full", "seed": seed}
            tuned.append({"name": f"{name}-s{seed}", "_dir": str(d), "metrics": {"eval_loss": loss}, "axes": axes,
                          "config": {"train": {"init_from": "x"}, "lora": {"rank": rank}}})
    findings, lines = peft(tuned, Family())
    assert "| lora_r8 | LoRA rank 8 | 3 | 10 | 10.00 % |" in "\n".join(lines)
    # Welch with one side constant: t = 0.2 / (0.1 / sqrt(3)) = 3.46 on 2 df < 4.303: within noise
    assert findings == ["LoRA rank 8 trained 10.00 % of the parameters with 10.0 % of full fine-tuning's gradient + optimizer-state "
                        "memory: validation loss 2.3000 ± 0.0000 against 2.1000 ± 0.2484 (+9.5%, within noise) for full fine-tuning."]


def test_parallel_table_shares_and_bubble(tmp_path):
    """The parallelism table divides each layout's per-device state by the replicated layout's, and states the
    measured bubble beside GPipe's formula (hand-checked numbers)."""
    from experiments.report.parallel import parallel

    none = {"count": 0, "bytes": 0}
    rows = {"mem": [{"layout": "data=8", "scan_layers": True, "compile_s": 2.0, "state_mb_per_device": 800.0, "collectives": {"all-reduce": {"count": 2, "bytes": 2**21}}},
                    {"layout": "fsdp=8", "scan_layers": True, "compile_s": 2.5, "state_mb_per_device": 100.0, "collectives": {"all-gather": {"count": 16, "bytes": 2**20}, "all-reduce": none}}],
            "bubble": [{"layout": "data=2,pipeline=4", "scan_layers": True, "compile_s": 3.0, "state_mb_per_device": 1.0, "collectives": {},
                        "step_ms": 40.0, "tokens_per_s": 100.0, "bubble": 0.6, "microbatches": 2, "bubble_measured": 0.75,
                        "reference_layout": "data=8", "reference_step_ms": 10.0}]}
    runs = []
    for name, rs in rows.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "bench.json").write_text(json.dumps({"rows": rs}))
        runs.append({"name": name, "_dir": str(tmp_path / name)})
    findings, lines = parallel(runs, tmp_path)
    assert findings == ["mem: fsdp=8 holds 0.125 of the replicated (data=8) per-device parameters + optimizer state (100 vs 800 MiB, "
                        "compiled program's shardings).",
                        "bubble: data=2,pipeline=4 with 2 micro-batches lost 75 % of its step time against data=8 (analytic GPipe bubble 60 %)."]
    text = "\n".join(lines)
    assert "| `mem` | fsdp=8 | yes | 2.5 | 100.0 | 0.125 | – | – | – | all-gather 16 (1.0 MiB) | - |" in text
    assert "M=2: 0.60 / 0.75" in text and (tmp_path / "parallel_memory.png").is_file() and (tmp_path / "pipeline_bubble.png").is_file()


def test_peft_quantization_and_remat_findings_by_hand():
    """The fine-tuning, quantisation and remat rows of the findings table, on hand-made seed losses."""
    from experiments.report.findings import AGREE, CHECKS, DISAGREE, UNRESOLVED
    from experiments.report.noise import Family
    from experiments.report.seeds import Setting

    def setting(name, losses, **axes):
        return Setting(name, axes, [{"name": f"{name}-s{i}", "status": "ok", "metrics": {"eval_loss": v}} for i, v in enumerate(losses)])

    peft = [setting("full", [2.00, 2.01, 1.99]), setting("lora_r8", [2.10, 2.11, 2.09]),
            setting("lora_r16", [2.05, 2.06, 2.04]), setting("qlora_r16", [2.05, 2.07, 2.04])]
    # LoRA r8: +5 % of full's 2.00, t = 0.1 / 0.00816 = 12.2 on 4 df -> beyond SMALL (2 %) and noise: disagree
    assert CHECKS["lora_close"](peft, {"noise": Family()})[1] == DISAGREE
    assert CHECKS["lora_ranks"](peft, {"noise": Family()}) == ("r8: 2.100 ± 0.025, r16: 2.050 ± 0.025; range 2.4% of the loss", DISAGREE)
    assert CHECKS["qlora_matches"](peft, {"noise": Family()})[1] == AGREE  # 2.0533 vs 2.05: within noise
    rows = [{"trained": t, "bits": b, "val_loss": v} for t, b, vs in (
        ("float32", None, [1.90, 1.91, 1.92]), ("float32", 8, [1.90, 1.91, 1.92]), ("float32", 4, [1.95, 1.96, 1.97]),
        ("qat w4a8", 4, [1.92, 1.93, 1.94])) for v in vs]
    assert CHECKS["ptq8_lossless"]([], {"quantize_rows": rows, "noise": Family()})[1] == AGREE
    text, verdict = CHECKS["qat_recovers"]([], {"quantize_rows": rows, "noise": Family()})
    assert verdict == AGREE and "1.930 ± 0.025 vs int4 PTQ of float32 1.960 ± 0.025" in text  # t = 3.67 > 2.776
    assert CHECKS["qat_recovers"]([], {"quantize_rows": rows[:9], "noise": Family()})[1] == UNRESOLVED  # no QAT model: not run
    remat = [setting("float32_b32", [2.0, 2.1], technique="float32", b=32), setting("remat_b32", [2.0, 2.1], technique="remat", b=32)]
    assert CHECKS["similar:remat"](remat, {"noise": Family()})[1] == AGREE
