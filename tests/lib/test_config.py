"""The config tree: typed loading, presets, overrides blamed on their source, migration, --help-config."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib

import pytest

from jaxlm.core.config import PRESETS, Config, ConfigError, ModelConfig, load_config
from jaxlm.core.typedconfig import dumps_toml, help_config, to_dict
from tests.train_helpers import ROOT

QUICKSTART = ROOT / "experiments" / "configs" / "quickstart.toml"


@pytest.mark.parametrize("override, name", [("optim.lrr=1", "optim.lrr"), ("train.steps=1.5", "train.steps"),
                                            ("compute.dtype=float16", "compute.dtype"),
                                            ("data.batch_size=\"x\"", "data.batch_size")])
def test_bad_override_is_blamed_on_the_flag_and_names_the_key(override, name):
    with pytest.raises(ConfigError, match=rf"^--set {override.split('=')[0]}.*{name}"):
        load_config(QUICKSTART, [override])


def test_value_rules_name_key_and_value():
    with pytest.raises(ConfigError, match=r"^--set train.steps=-5: train.steps = -5: must be >= 1$"):
        load_config(QUICKSTART, ["train.steps=-5"])
    with pytest.raises(ConfigError, match=r"data.batch_size = 10: must be divisible by train.grad_accum \(4\)"):
        load_config(None, ["data.batch_size=10", "train.grad_accum=4"])
    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        load_config(None, ["optim.lrr=1"])


def test_error_in_the_file_is_blamed_on_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlr = -1.0\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: optim.lr = -1.0: must be > 0"):
        load_config(bad)


def test_preset_sits_between_file_and_flags():
    cfg = load_config(QUICKSTART, ["model.num_layers=2"], preset="small")
    assert (cfg.model.d_model, cfg.model.d_ff, cfg.model.num_layers) == (768, 3072, 2)  # preset, then --set
    assert cfg.train.out_dir == "runs/quickstart"  # the file's other sections stay
    assert ModelConfig.from_name("gpt2-xl").vocab_size == 50257
    with pytest.raises(ConfigError, match="--preset 'tiny'"):
        load_config(None, preset="tiny")


def test_every_preset_is_a_valid_model():
    for name, preset in PRESETS.items():
        cfg = load_config(None, preset=name)
        assert dataclasses.asdict(cfg.model).items() >= preset["model"].items(), name


def test_compute_keys_under_model_are_unknown(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text('[model]\nd_model = 64\nnum_heads = 4\ndtype = "bfloat16"\n')
    with pytest.raises(ConfigError, match="dtype"):
        load_config(old)
    with pytest.raises(ConfigError, match="--set model.remat=full"):
        load_config(None, ["model.remat=full"])


def test_an_unknown_key_is_an_error_naming_it(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("[train]\nsteps = 7\neval_batches = 20\n")
    with pytest.raises(ConfigError, match=r"run.toml: unknown key 'train.eval_batches'"):
        load_config(toml)
    with pytest.raises(ConfigError, match=r"--set train.eval_batches=3: .*eval_batches"):
        load_config(None, ["train.eval_batches=3"])
    with pytest.raises(ConfigError, match=r"data.eval_tokens = -1: must be >= 0"):
        load_config(None, ["data.eval_tokens=-1"])


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = load_config(QUICKSTART, ["optim.cosine_steps=500", "log.profile_steps=[3, 5]"], preset="tinystories-17M")
    text = dumps_toml(to_dict(cfg))
    assert tomllib.loads(text)["compute"]["dtype"] == "float32" and "window" not in tomllib.loads(text)["model"]
    (tmp_path / "config.toml").write_text(text)
    assert load_config(tmp_path / "config.toml") == cfg


def test_help_config_lists_every_key_with_its_doc():
    text = help_config(Config)
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(getattr(Config(), section.name)):
            line = next((l for l in text.splitlines() if l.strip().startswith(f"{section.name}.{f.name} = ")), None)
            assert line is not None, f"{section.name}.{f.name}"
            assert len(line.split(")  ", 1)[-1]) > 10, line  # a doc follows the type


def test_help_config_flag_on_every_command():
    for command in ("jaxlm.train", "jaxlm.bench model", "jaxlm.generate"):  # parity.check: tests/parity
        r = subprocess.run([sys.executable, "-m", *command.split(), "--help-config"], capture_output=True, text=True,
                           timeout=300, cwd=ROOT)
        assert r.returncode == 0 and "optim.lr = 0.001" in r.stdout, (command, r.stderr[-500:])


@pytest.mark.parametrize("path", sorted((ROOT / "experiments" / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_parses(path, capsys):
    cfg = load_config(path)
    assert cfg.data.batch_size % cfg.train.grad_accum == 0
    assert "warning:" not in capsys.readouterr().err  # shipped configs use the current keys (none moved or dropped)
