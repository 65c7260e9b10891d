"""experiments.gpu: the dry run's plan fits the budget; without a GPU only --dry-run and --smoke run, and a smoke
run never writes into docs/results/gpu; the CPU smoke run writes every step's section."""

import argparse
import json
import re

import jax
import pytest

from experiments.gpu import campaign
from jaxlm import cli


def test_dry_run_lists_every_step_with_seconds_within_the_budget(capsys):
    assert cli.run(campaign.main, ["--dry-run"]) == 0
    out = capsys.readouterr().out
    for step in campaign.steps():
        assert re.search(rf"^{step.name}\s+\d+\s", out, re.M), step.name
    total = float(re.search(r"^total\s+(\d+)", out, re.M).group(1))
    assert total <= 540
    planned = campaign.plan(campaign.steps(), 540, None, False)
    assert campaign.STARTUP_S + sum(est for _, est, status in planned if status == "run") <= 540
    assert planned[0][0].name == "attention" and planned[0][2] == "run"  # the most important step is never deferred


def test_unknown_step_is_one_line_exit_2(capsys):
    assert cli.run(campaign.main, ["--dry-run", "--only", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: --only nope")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the full campaign runs on a GPU")
def test_without_a_gpu_the_full_campaign_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.run(campaign.main, ["--only", "attention"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: python -m experiments.gpu: no GPU here (JAX's backend is cpu)") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["docs/results/gpu", "docs/results/gpu/smoke", str(campaign.REPO / "docs/results/gpu")])
def test_smoke_never_writes_into_the_gpu_report(tmp_path, monkeypatch, capsys, out):
    monkeypatch.chdir(tmp_path)
    assert cli.run(campaign.main, ["--smoke", "--out", out]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {out}: a --smoke run's tiny-model figures never go into")
    assert list(tmp_path.iterdir()) == []


def test_smoke_without_out_goes_to_runs():
    assert campaign.output_dir(argparse.Namespace(smoke=True, out=None)) == campaign.SMOKE_OUT
    assert not campaign.SMOKE_OUT.resolve().is_relative_to((campaign.REPO / campaign.DEFAULT_OUT).resolve())


@pytest.fixture(scope="session")
def smoke(tmp_path_factory, tinyshakespeare):
    out = tmp_path_factory.mktemp("gpu")
    assert cli.run(campaign.main, ["--smoke", "--out", str(out)]) == 0
    return out


def test_smoke_runs_every_step_and_writes_report_and_json(smoke):
    report = (smoke / "report.md").read_text()
    results = json.loads((smoke / "results.json").read_text())["steps"]
    for step in campaign.steps():
        assert f"## {step.title}" in report
        assert "error" not in results[step.name], results[step.name]
        assert (smoke / f"{step.name}.json").exists()
    assert "skipped: cuDNN attention needs an NVIDIA GPU" in report
    assert "Not run" not in report and "Failed" not in report


def test_smoke_attention_parity_and_profile_are_real_numbers(smoke):
    results = json.loads((smoke / "results.json").read_text())["steps"]
    xla = [r for r in results["attention"]["rows"] if r["implementation"] == "xla"]
    assert xla and all(r["status"] == "ok" and 0 < r["out_rel_err"] < 1e-2 for r in xla)  # bfloat16 vs float32
    prof = results["profile"]
    assert prof["forward"]["top"] and 0 < prof["train_step"]["matmul_share"] <= 1
    bench = results["bench_bf16"]["rows"]
    assert {r["mode"] for r in bench} == {"forward", "forward_backward", "train_step"}
    assert all(r["status"] == "ok" and r["step_ms"] > 0 for r in bench)
