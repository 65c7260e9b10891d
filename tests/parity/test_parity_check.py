"""`python -m parity.check`: the figures, the JSON keys and the exit code."""

import json

import pytest

from jaxlm import cli
from parity import check

KEYS = ("logits_max_abs_err", "logits_max_rel_err", "loss_abs_err", "grad_max_rel_err", "train_loss_max_abs_diff")


def test_default_config_passes_float32_thresholds(tmp_path, capsys):
    out = tmp_path / "parity.json"
    assert check.main(["--steps", "15", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(KEYS) <= set(figures) and figures["passed"] and figures["round_trip_exact"]
    for key, limit in check.THRESHOLDS["float32"].items():
        assert figures[key] <= limit, key
    assert figures["train_loss_last_torch"] < figures["train_loss_first"]  # the runs really trained
    assert "parity: PASS" in capsys.readouterr().out


def test_exceeded_threshold_exits_nonzero(monkeypatch, capsys):
    strict = dict(check.THRESHOLDS["float32"], loss_abs_err=0.0, logits_max_rel_err=0.0)
    monkeypatch.setitem(check.THRESHOLDS, "float32", strict)
    assert check.main(["--set", "model.num_layers=1"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_bfloat16_is_reported_against_float32_reference(tmp_path):
    out = tmp_path / "bf16.json"
    assert check.main(["--set", "compute.dtype=bfloat16", "--set", "model.num_layers=1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["compute"]["dtype"] == "bfloat16"
    assert figures["logits_max_rel_err"] > check.THRESHOLDS["float32"]["logits_max_rel_err"]  # bf16 is visibly coarser


def test_bad_override_names_the_key(capsys):
    assert cli.run(check.main, ["--set", "model.d_modle=3"]) == 2
    assert "model.d_modle" in capsys.readouterr().err


@pytest.mark.extended
def test_lora_parity_trains_only_the_adapters_in_both(tmp_path, capsys):
    """LoRA's logits and gradients against torchref's are test_peft_torch.py::test_lora_matches_torchref's, in the
    default suite; this runs them through the command."""
    out = tmp_path / "parity.json"
    assert check.main(["--set", "lora.rank=4", "--set", "model.num_layers=1", "--steps", "5", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    for key, limit in check.THRESHOLDS["float32"].items():
        assert figures[key] <= limit, key
    assert "lora rank=4" in capsys.readouterr().out


@pytest.mark.extended
def test_scanned_layers_pass_the_float32_thresholds(tmp_path):
    """The stacked layout's gradients are compared per layer under torch's names (in the default suite:
    test_parity.py::test_scanned_layers_convert_and_match_torchref, in this process)."""
    out = tmp_path / "scan.json"
    assert check.main(["--set", "compute.scan_layers=true", "--steps", "5", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["compute"]["scan_layers"] is True
    for key, limit in check.THRESHOLDS["float32"].items():
        assert figures[key] <= limit, key


def test_help_config_lists_the_config_tree(capsys):
    """In this process: a fresh one spends its seconds importing torch and JAX, not listing."""
    with pytest.raises(SystemExit) as done:
        check.main(["--help-config"])
    assert done.value.code == 0 and "optim.lr = 0.001" in capsys.readouterr().out
