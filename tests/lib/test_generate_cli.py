"""`python -m jaxlm.generate` on trained runs: checkpoints, compute flags, the other layer layout, and one-line
errors for bad options, missing or corrupt runs."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxlm import cli
from jaxlm.cli.generate import build_parser, main, run_config
from jaxlm.core.config import load_config
from jaxlm.training.checkpoint import load_for_generation
from tests.train_helpers import ROOT, make_corpus, tiny_overrides

# One xdist group: the trained runs are trained once.
pytestmark = pytest.mark.xdist_group("generate_cli")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    from jaxlm.training.loop import train

    base = tmp_path_factory.mktemp("gen_run")
    corpus = make_corpus(base / "corpus")
    extra = {"train.steps": 4, "checkpoint.every": 4, "train.eval_every": 4, "log.tensorboard": "false"}
    train(load_config(None, tiny_overrides(corpus, base / "run", **extra)))
    return base / "run"


def test_trained_checkpoint_generates_without_flags(trained_run, capsys):
    args = ["--prompt", "def f(x):", "--max-new-tokens", "6", "--temperature", "0"]
    assert main(["--run", str(trained_run), *args, "--num-samples", "2"]) == 0
    samples = capsys.readouterr().out.splitlines()
    assert samples[0].startswith("def f(x):") and samples[0] == samples[len(samples) // 2]  # greedy: equal samples
    assert main(["--checkpoint", str(trained_run / "checkpoints" / "4"), *args, "--stream", "--no-cache"]) == 0
    streamed = capsys.readouterr().out.splitlines()
    assert streamed == samples[: len(streamed)]  # streamed, full-forward text is the same


def test_compute_flags_change_how_the_run_decodes(trained_run):
    args = argparse.Namespace(config=None, preset=None, overrides=["compute.dtype=bfloat16"])
    cfg = run_config(str(trained_run), args)
    model, _ = load_for_generation(trained_run, cfg)
    assert model.compute.dtype == "bfloat16" and model.init_cache(1, 8).layers[0][0].dtype == jnp.bfloat16
    saved, _ = load_for_generation(trained_run)
    np.testing.assert_array_equal(model.token_embeddings.weight[...], saved.token_embeddings.weight[...])


@pytest.fixture(scope="session")
def scanned_run(tmp_path_factory):
    from jaxlm.training.loop import train

    base = tmp_path_factory.mktemp("gen_scanned_run")
    extra = {"train.steps": 2, "checkpoint.every": 2, "train.eval_every": 2, "log.tensorboard": "false",
             "compute.scan_layers": "true"}
    train(load_config(None, tiny_overrides(make_corpus(base / "corpus"), base / "run", **extra)))
    return base / "run"


@pytest.mark.parametrize("trained_in", ["unrolled", "scanned"])
def test_a_run_decodes_in_the_other_layer_layout(trained_in, trained_run, scanned_run, capsys):
    """--set compute.scan_layers=... flips the layout a run was trained in: the same logits and greedy text."""
    run, flip = (trained_run, "true") if trained_in == "unrolled" else (scanned_run, "false")
    args = argparse.Namespace(config=None, preset=None, overrides=[f"compute.scan_layers={flip}"])
    model, _ = load_for_generation(run, run_config(str(run), args))
    saved, _ = load_for_generation(run)
    assert isinstance(model.layers, nnx.List) == (flip == "false") != isinstance(saved.layers, nnx.List)
    tok = jnp.arange(12)[None] * 7 % 257  # (1, 12)
    np.testing.assert_allclose(np.asarray(model(tok)), np.asarray(saved(tok)), atol=1e-5)
    argv = ["--run", str(run), "--prompt", "The ", "--max-new-tokens", "6", "--temperature", "0"]
    assert main(argv) == 0 and main([*argv, "--set", f"compute.scan_layers={flip}"]) == 0
    as_trained, flipped = capsys.readouterr().out.splitlines()
    assert flipped == as_trained


def run_cli(argv, capsys) -> tuple[int, list[str]]:
    """Exit code and stderr lines of `python -m jaxlm.generate ARGV`, in this process."""
    code = cli.run(main, argv)
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("flag, value", [("--max-new-tokens", "-5"), ("--top-p", "0"), ("--top-k", "-1"),
                                         ("--temperature", "-1"), ("--num-samples", "0"),
                                         ("--prompt-file", "nope.txt")])
def test_bad_option_is_one_line_exit_2(tmp_path, capsys, flag, value):
    code, err = run_cli(["--run", str(tmp_path), "--prompt", "x", flag, value], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {flag} ") and value in err[0], err


def test_architecture_override_refused(trained_run, capsys):
    code, err = run_cli(["--run", str(trained_run), "--prompt", "x", "--set", "model.d_model=64"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: model.d_model: ") and "64" in err[0], err
    code, err = run_cli(["--run", str(trained_run), "--prompt", "x", "--preset", "small"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: model.vocab_size: "), err


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN attention runs on a GPU")
def test_cudnn_without_a_gpu_is_one_line(trained_run, capsys):
    code, err = run_cli(["--run", str(trained_run), "--prompt", "x", "--set", "compute.dtype=bfloat16",
                         "--set", "compute.attention=cudnn"], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: compute.attention: "), err


def test_missing_or_corrupt_checkpoint_exit_2(tmp_path, trained_run, capsys):
    missing = tmp_path / "nope"
    assert run_cli(["--run", str(missing), "--prompt", "x"], capsys) == (
        2, [f"error: {missing}: no such run or checkpoint directory"])
    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    code, err = run_cli(["--run", str(not_a_run), "--prompt", "x"], capsys)
    assert code == 2 and len(err) == 1 and str(not_a_run) in err[0]
    corrupt = tmp_path / "corrupt"
    shutil.copytree(trained_run, corrupt)
    for f in (corrupt / "checkpoints" / "4" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    code, err = run_cli(["--run", str(corrupt), "--prompt", "x"], capsys)
    assert code == 2 and str(corrupt) in err[-1]


@pytest.mark.parametrize("argv, culprit", [(["--run", "missing", "--prompt", "x"], "missing"),
                                           (["--run", "missing", "--top-p", "0"], "--top-p 0.0")])
def test_cli_exit_code_in_a_subprocess(tmp_path, argv, culprit):
    r = subprocess.run([sys.executable, "-m", "jaxlm.generate", *argv], cwd=tmp_path, capture_output=True, text=True,
                       env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, timeout=300)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {culprit}: "), r.stderr


def test_every_option_has_help_with_its_default():
    formatter = cli.HelpFormatter("x")
    for action in build_parser()._actions:
        if action.option_strings and action.default != argparse.SUPPRESS:
            shown = not (action.default is None or action.default is False or action.default == [])  # else: "not given"
            assert action.help and (not shown or "default" in formatter._get_help_string(action)), action.option_strings
