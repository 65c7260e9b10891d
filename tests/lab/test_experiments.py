"""The experiment runner: failure / divergence labels, final records only from a committed tree, resuming after
an interruption, and a real two-run training plan end to end with its report."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deliverables.report.build import write_report
from experiments.plan import PlanError, load_plan
from experiments.run import run_plan
from jaxlm.core.errors import UsageError
from tests.lab.plan_helpers import CPU, command_plan, write

REPO = Path(__file__).resolve().parents[2]


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
        log = {{ every = 3, progress = false, tensorboard = false, sample_tokens = 0 }}
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
        assert "| 1 | ok |" in row  # one seed, said as such: no interval
    assert "±" not in runs_table and "<summary>Every run</summary>" in runs_table
    base, other = results["w32"]["metrics"]["eval_loss"], results["w48"]["metrics"]["eval_loss"]
    change = 100 * (other - base) / base  # a plan without seeds: one seed per setting
    assert f"`w48` against `w32`: validation loss {other:.3f} against {base:.3f} ({change:+.1f}%, one seed" in text
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
        run_plan(plan, tmp_path / "runs", device=CPU, draft=True)
    assert not (tmp_path / "runs").exists()


def test_a_dry_run_previews_a_plan_and_names_the_missing_corpus(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAXLM_DATA", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiments").symlink_to(REPO / "experiments")
    plan = load_plan("lr_sweep", "cpu")
    counts = run_plan(plan, tmp_path / "runs", dry_run=True, device=CPU)
    out = capsys.readouterr().out
    assert counts == {"pending": len(plan.runs)}
    assert "needs corpus 'wikitext-2', not in the data root" in out
    assert "`python -m jaxlm.data download wikitext-2`" in out
