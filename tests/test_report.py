"""experiments.report on one training run (learning curves + a 256-token sample) and --all over every plan."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments import report
from experiments.results import read_metrics, summarise_train
from jaxlm import cli
from jaxlm.config import load_config
from tests.train_helpers import make_corpus, tiny_overrides


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    from jaxlm.train import train

    tmp = tmp_path_factory.mktemp("run")
    train(load_config(None, tiny_overrides(make_corpus(tmp / "data"), tmp / "run")))
    return tmp / "run"


def test_single_run_page_has_curves_numbers_and_a_256_token_sample(tiny_run, tmp_path):
    from experiments.run_report import fluency
    from jaxlm.decode import Generator, SamplingParams, encode_prompt
    from jaxlm.generate import load_for_generation

    out = tmp_path / "page"
    assert cli.run(report.main, [str(tiny_run), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    for png in ("curves_by_step.png", "curves_by_time.png"):
        assert (out / png).stat().st_size > 1000 and f"]({png})" in text
    final = summarise_train(read_metrics(tiny_run / "metrics.jsonl"))
    assert f"| final validation loss | {final['eval_loss']:.3f} |" in text
    assert "256 new tokens, temperature 0.8, top-p 0.95, top-k off, seed 0" in text
    # The page's sample is exactly what the Generator gives with those settings.
    model, tok = load_for_generation(tiny_run)
    new = Generator(model).generate([encode_prompt(tok, "The ")], 256, SamplingParams(0.8, 0, 0.95), seed=0).tokens[0]
    assert len(new) == 256
    assert "The " + tok.decode(new) in text.replace("'''", "```")
    assert fluency(new, tok.decode(new))[0] in text


def test_fluency_measures_repetition():
    looped = [1, 2] * 10
    lines = fluency_of(looped, "a b c d " * 5)
    assert lines[0].startswith("11% of its 19 token bigrams") and "occurs 5 times" in lines[1]


def fluency_of(tokens, text):
    from experiments.run_report import fluency

    return fluency(tokens, text)


def test_single_run_options_are_checked(tiny_run, capsys):
    assert cli.run(report.main, [str(tiny_run), "--tokens", "10"]) == 2
    assert "--tokens" in capsys.readouterr().err
