"""deliverables.gpu: the dry runs' plans fit their budgets; without a GPU only --dry-run and --smoke run, and a smoke
run never writes into docs/results/gpu; the offline command's CPU smoke runs its install (a dry run for the offline
machine), checks and every campaign step, and copies its summary to $OUT."""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from deliverables.gpu import campaign, carry, merge, offline
from jaxlm import cli
from jaxlm.core import platform


def _total(out: str) -> float:
    return float(re.search(r"^total\s+(\d+)", out, re.M).group(1))


def test_dry_run_lists_every_step_with_seconds_within_the_budget(capsys):
    assert cli.run(campaign.main, ["--dry-run"]) == 0
    out = capsys.readouterr().out
    for step in campaign.steps():
        assert re.search(rf"^{step.name}\s+\d+\s", out, re.M), step.name
    assert _total(out) <= 540
    planned = campaign.plan(campaign.steps(), 540, None, False)
    assert campaign.STARTUP_S + sum(est for _, est, status in planned if status == "run") <= 540
    assert planned[0][0].name == "profile" and planned[0][2] == "run"  # the most important step is never deferred
    # a step that stops between rows runs cut rather than not at all; the others wait for a call with --only
    assert [s for _, _, s in planned if s.startswith("cut")] and all(
        step.cuts or not status.startswith("cut") for step, _, status in planned)


def test_offline_dry_run_fits_eight_minutes_install_and_checks_included(capsys):
    assert cli.run(offline.main, ["--dry-run"]) == 0
    out = capsys.readouterr().out
    for name, seconds, _ in offline.PHASES:
        assert re.search(rf"^{name}\s+{seconds:.0f}\s", out, re.M), name
    assert _total(out) <= 480 == offline.BUDGET_S
    overhead = campaign.overhead(offline.PHASES, offline.FINISH)
    rows = campaign.plan(campaign.steps(), 480, None, False, startup=overhead)
    used = overhead + sum(e for _, e, st in rows if st == "run")
    assert used <= 480 and rows[0][2] == "run"
    assert "deferred" in out  # what does not fit is named, with the call that runs it


@pytest.mark.parametrize("main", [campaign.main, offline.main])
def test_unknown_step_is_one_line_exit_2(capsys, main):
    assert cli.run(main, ["--dry-run", "--only", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: --only nope: unknown step; known: profile, techniques")


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the full campaign runs on a GPU")
def test_without_a_gpu_the_full_campaign_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.run(campaign.main, ["--only", "attention"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: python -m deliverables.gpu: no GPU here (JAX's backend is cpu)")
    assert err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(platform.has_nvidia_driver(), reason="the offline command runs on a GPU there")
def test_without_a_gpu_the_offline_command_stops_in_one_line_before_installing(tmp_path):
    """Issue 46, item 19: it installed the carried wheels first, then failed with pip's command cut at 300
    characters. Here a carried wheel that is not the listed file would fail the install: the GPU is checked first."""
    carried = tmp_path / "whl"
    carried.mkdir()
    (carried / carry.read_manifest()[0].file).write_bytes(b"not a wheel")
    proc = subprocess.run([sys.executable, "-m", "deliverables.gpu.offline", "--carry", str(carried),
                           "--site", str(tmp_path / "site"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(campaign.REPO)))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "no GPU here" in errors[0], proc.stderr[-2000:]
    assert "install" not in proc.stdout + proc.stderr.replace("installing anything", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whl"]


def test_a_smoke_with_a_missing_wheel_and_a_failed_step_says_both_and_exits_1(tmp_path, monkeypatch, capsys):
    """Issue 46, item 5: the missing wheel showed only in offline.json and the failed step only in report.md; the
    call exited 0. The phases' work is stood in for; what the call makes of their results is the real code."""
    from deliverables.gpu import check

    missing = "/x/.whl/qwix-0.1.6-py3-none-any.whl: missing (python -m deliverables.gpu.carry download)"
    monkeypatch.setattr(carry, "install", lambda *a: {"simulated": "dry run", "problem": missing, "seconds": 0.0})
    monkeypatch.setattr(offline, "preflight", lambda smoke: ({"devices": {"platform": "cpu", "kind": "cpu"}}, None))
    monkeypatch.setattr(check, "run_checks", lambda *a: {"rows": [{"check": "train", "ok": True}], "ok": True})
    monkeypatch.setattr(campaign, "run", lambda *a, **kw: {"shakespeare": "RuntimeError: exited 2"})
    monkeypatch.chdir(tmp_path)
    assert cli.run(offline.main, ["--smoke", "--out", "out"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert f"warning: install: {missing}" in err, err
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and missing in errors[0] and "step shakespeare: RuntimeError: exited 2" in errors[0]


def test_the_shakespeare_step_reads_the_repository_from_anywhere_and_fails_as_a_step(tmp_path, monkeypatch):
    """Issue 46, item 5: from outside the repository it read experiments/plans/_shakespeare.toml from the working
    directory, and a failed training run was a result ("exit 1: ...") rather than a failed step."""
    from deliverables.gpu import steps

    ran = []
    monkeypatch.setattr(steps.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or subprocess.CompletedProcess(
        cmd, 2, "", "error: data.source: no corpus"))
    monkeypatch.chdir(tmp_path)
    ctx = steps.Context(out=tmp_path / "out", smoke=True, deadline=float("inf"))
    with pytest.raises(RuntimeError, match="exited 2: error: data.source: no corpus"):
        steps.run_shakespeare(ctx)
    config = ran[0][ran[0].index("--config") + 1]
    assert Path(config).is_absolute() and Path(config).is_file() and Path(config).is_relative_to(campaign.REPO)


def test_without_wheels_the_install_says_what_to_carry(tmp_path, monkeypatch):
    assert carry.install(tmp_path, tmp_path / "site", False) == {
        "skipped": f"no wheels in {tmp_path}: every carried package is installed here already"}
    monkeypatch.setattr(carry, "installed", lambda name: None if name == "grain" else "1.0")
    assert carry.install(tmp_path, tmp_path / "site", False)["error"] == (
        f"no wheels in {tmp_path} and grain==0.2.18 not installed: run python -m deliverables.gpu.carry download "
        "where pip reaches PyPI, and carry .whl")


@pytest.mark.parametrize("out", ["docs/results/gpu", "docs/results/gpu/smoke", str(campaign.REPO / "docs/results/gpu")])
def test_smoke_never_writes_into_the_gpu_report(tmp_path, monkeypatch, capsys, out):
    monkeypatch.chdir(tmp_path)
    assert cli.run(campaign.main, ["--smoke", "--out", out]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {out}: a --smoke run's tiny-model figures never go into")
    assert cli.run(offline.main, ["--smoke", "--out", out]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {out}: the offline run writes its own folder")
    assert list(tmp_path.iterdir()) == []


def test_smoke_without_out_goes_to_runs():
    assert campaign.output_dir(argparse.Namespace(smoke=True, out=None)) == campaign.SMOKE_OUT
    assert not campaign.SMOKE_OUT.resolve().is_relative_to((campaign.REPO / campaign.DEFAULT_OUT).resolve())


def on_smoke(test):
    """The tests of the offline command's smoke run share one run (about 50 s of CPU): one xdist worker, once. Extended
    (.ci/run runs them): in the default suite, the dry runs above check the plan and its budget,
    test_gpu_predict.py the predictions, test_gpu_carry.py the wheels, and tests/lib the timing loop, the
    largest-batch search and the GPU compile each step calls."""
    return pytest.mark.extended(pytest.mark.slow(pytest.mark.xdist_group("gpu_smoke")(test)))


@pytest.fixture(scope="session")
def smoke(tmp_path_factory, tinyshakespeare):
    """`python3 -m deliverables.gpu.offline --smoke` with $OUT set, as the device tool sets it."""
    out, dest = tmp_path_factory.mktemp("gpu"), tmp_path_factory.mktemp("OUT")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OUT", str(dest))
        assert cli.run(offline.main, ["--smoke", "--out", str(out)]) == 0
    return out, dest


@on_smoke
def test_smoke_runs_every_step_and_writes_report_and_json(smoke):
    out, _ = smoke
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())["steps"]
    for step in campaign.steps():
        assert f"## {step.title}" in report
        assert "error" not in results[step.name], results[step.name]
        assert "cut" not in results[step.name], step.name  # a smoke run is never cut short
        assert (out / f"{step.name}.json").exists()
    assert "skipped: cuDNN attention needs an NVIDIA GPU" in report
    assert "Not run" not in report and "Failed" not in report


@on_smoke
def test_smoke_attention_parity_and_profile_are_real_numbers(smoke):
    results = json.loads((smoke[0] / "results.json").read_text())["steps"]
    xla = [r for r in results["attention"]["rows"] if r["implementation"] == "xla"]
    assert xla and all(r["status"] == "ok" and 0 < r["out_rel_err"] < 1e-2 for r in xla)  # bfloat16 vs float32
    assert all(r["predicted_fwd_ms"] > 0 and r["predicted_fwd_bwd_ms"] > r["predicted_fwd_ms"] for r in xla)
    prof = results["profile"]
    assert prof["forward"]["top"] and 0 < prof["train_step"]["matmul_share"] <= 1
    bench = results["bench_bf16"]["rows"]
    assert {r["mode"] for r in bench} == {"forward", "forward_backward", "train_step"}
    assert all(r["status"] == "ok" and r["step_ms"] > 0 for r in bench)


@on_smoke
def test_every_timed_row_carries_its_prediction(smoke):
    results = json.loads((smoke[0] / "results.json").read_text())["steps"]
    rows = [r for name in ("bench_bf16", "bench_f32", "techniques") for r in results[name]["rows"]
            if r["status"] == "ok"]
    assert rows
    for r in rows:
        assert r["predicted_step_ms"] > 0 and "no prediction" in r["prediction"], r  # a CPU: H100 rates, labelled
        assert r["predicted_tokens_per_s"] == pytest.approx(r["batch"] * r["context"] / r["predicted_step_ms"] * 1e3)
        assert r["measured_over_predicted"] == pytest.approx(r["step_ms"] / r["predicted_step_ms"])
        assert 0 < r["predicted_mfu"] <= 1
    by = {(r["mode"], r["dtype"]): r["predicted_step_ms"] for r in rows if r.get("remat") == "none"}
    assert by[("forward", "bfloat16")] < by[("forward_backward", "bfloat16")] < by[("train_step", "bfloat16")]


@on_smoke
def test_profile_compares_predicted_and_measured_time_per_kernel_group(smoke):
    from jaxlm.predict.roofline import GROUPS

    roof = json.loads((smoke[0] / "results.json").read_text())["steps"]["profile"]["train_step"]["roofline"]
    assert [g["group"] for g in roof["groups"]] == list(GROUPS)
    assert roof["matched_share"] > 0.9  # XLA:CPU's op events name their instructions too
    assert roof["measured_ms"] == pytest.approx(sum(g["measured_ms"] for g in roof["groups"]))
    assert roof["predicted_ms"] == pytest.approx(sum(g["predicted_ms"] for g in roof["groups"]))
    assert roof["error"] == pytest.approx(roof["predicted_ms"] / roof["measured_ms"] - 1)
    assert "Predicted against measured, per call" in (smoke[0] / "report.md").read_text()
    # the train step's calibration file: measured on no GPU, so no --target command takes it
    from jaxlm.predict import calibration

    cal = calibration.load(smoke[0] / "calibration.json")
    assert cal.device.startswith("no GPU") and cal.groups
    measured = {g["group"]: g["measured_ms"] for g in roof["groups"]}
    assert all(r.measured_ms == pytest.approx(measured[g]) for g, r in cal.groups.items())


@on_smoke
def test_offline_smoke_records_install_checks_and_copies_the_summary_to_out(smoke):
    out, dest = smoke
    record = json.loads((out / "offline.json").read_text())
    assert set(record["phases"]) == {"install", "startup", "checks", "campaign"}
    install = record["install"]
    assert install.get("problem") is None and ("simulated" in install or "installed here already" in install["skipped"])
    checks = {(r["check"], r.get("implementation"), r.get("window")): r for r in record["checks"]["rows"]}
    assert record["checks"]["ok"] and checks[("train", None, None)]["max_rel_diff"] < 2e-2
    assert checks[("checkpoint", None, None)]["arrays_equal"] is True
    assert checks[("attention", "cudnn", None)]["ok"] is None  # skipped on a CPU, with the reason
    assert {p.name for p in dest.iterdir()} == {*offline.OUT_FILES, *merge.PROFILE_FILES}
    assert "## Correctness on this device" in (out / "report.md").read_text()


@on_smoke
def test_merge_refuses_smoke_results_and_takes_a_gpu_run_in(smoke, tmp_path, capsys):
    _, dest = smoke
    into = tmp_path / "report"
    assert cli.run(merge.main, [str(dest), "--into", str(into)]) == 2
    assert "a --smoke run's tiny-model figures never go into" in capsys.readouterr().err
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    data = json.loads((dest / "results.json").read_text())
    data["meta"].update(smoke=False, device="NVIDIA H100 80GB HBM3")
    profile = {"profile": data["steps"]["profile"]}
    (gpu / "results.json").write_text(json.dumps({"meta": data["meta"], "steps": profile}))
    (into).mkdir()
    (into / "results.json").write_text(json.dumps({"meta": data["meta"], "steps": {"max_batch": {"rows": []}}}))
    measured = json.loads((dest / "calibration.json").read_text())
    (gpu / "calibration.json").write_text(json.dumps({**measured, "device": "h100-80gb"}))  # as an H100 writes it
    calibrations = tmp_path / "calibrations"
    assert cli.run(merge.main, [str(gpu), "--into", str(into), "--calibrations", str(calibrations)]) == 0
    assert json.loads((calibrations / "h100-80gb.json").read_text())["groups"] == measured["groups"]
    merged = json.loads((into / "results.json").read_text())["steps"]
    assert set(merged) == {"profile", "max_batch"}  # the earlier call's step stays
    assert merged["profile"]["measured_by"]["device"] == "NVIDIA H100 80GB HBM3"
    assert "Predicted against measured, per call" in (into / "report.md").read_text()
