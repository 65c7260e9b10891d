"""A resumed run whose config changed: said in one line, recorded in metrics.jsonl (docs/training.md)."""

import json

import pytest

from jaxlm.core.config import load_config
from tests.train_helpers import make_corpus, tiny_overrides


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


def tiny(corpus, out_dir, **extra):
    return load_config(None, tiny_overrides(corpus, out_dir, **extra))


def test_a_resumed_run_with_a_changed_config_says_so_and_records_it(corpus, tmp_path, capsys):
    """Anything but train.steps changed on resume: one line naming each key (saved -> now), and a "start" row in
    metrics.jsonl with the change; a fresh start gets a "start" row too."""
    from jaxlm.training.loop import train

    train(tiny(corpus, tmp_path / "run", **{"train.steps": 8, "checkpoint.every": 8}))
    capsys.readouterr()
    train(tiny(corpus, tmp_path / "run", **{"train.steps": 10, "checkpoint.every": 8, "optim.lr": 5e-3}))
    err = capsys.readouterr().err
    assert "resumed at step 8 with a changed config: optim.lr 0.003 -> 0.005; config.toml now holds" in err, err
    starts = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
              if r["kind"] == "start"]
    assert [(r["step"], r.get("changed")) for r in starts] == [(0, None), (8, {"optim.lr": [0.003, 0.005]})]
    train(tiny(corpus, tmp_path / "run", **{"train.steps": 12, "checkpoint.every": 8, "optim.lr": 5e-3}))
    assert "changed config" not in capsys.readouterr().err  # config.toml holds the values it resumed with
