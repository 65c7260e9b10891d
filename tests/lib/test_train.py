"""Training: loop, resume, accumulation, precision/remat, parallelism, configs, CLI, NaN stop.

Multi-device and multi-process cases run in subprocesses so this process keeps one device.
"""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxlm.core import sharding
from jaxlm.core.config import load_config
from jaxlm.training.loop import steps_in_call
from tests.train_helpers import (
    LAYOUTS,
    ROOT,
    env,
    losses,
    make_corpus,
    max_param_diff,
    needs,
    run_steps,
    tiny_overrides,
    xla_devices,
)

PY = sys.executable


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


def tiny(corpus, out_dir, **extra):
    return load_config(None, tiny_overrides(corpus, out_dir, **extra))


# --------------------------------------------------------------------------- the loop


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A 30-step run of the tiny config with one evaluation and one sample: (train()'s result, run directory)."""
    from jaxlm.training.loop import train

    run = tmp_path_factory.mktemp("trained") / "run"
    return train(tiny(corpus, run, **{"train.steps": 30, "train.eval_every": 30, "log.sample_tokens": 8})), run


@pytest.mark.xdist_group("trained")
def test_loss_falls_and_run_dir_is_complete(trained):
    out, run = trained
    ls = losses(run)
    assert np.mean([ls[s] for s in range(26, 31)]) < np.mean([ls[s] for s in range(1, 6)]) - 1.0
    assert out["val_loss"] < 4.0 and out["sample"].startswith("The ")
    assert (run / "config.toml").is_file() and (run / "tokenizer" / "meta.json").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["20", "30"]
    kinds = [json.loads(l)["kind"] for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("eval") == 1 and kinds.count("sample") == 1


def test_resume_continues_exactly(corpus, tmp_path):
    from jaxlm.training.loop import train

    kw = {"model.dropout": 0.1}  # the dropout RNG stream must be checkpointed too
    train(tiny(corpus, tmp_path / "full", **{"train.steps": 16, "checkpoint.every": 8}, **kw))
    half = {"train.steps": 8, "checkpoint.every": 8, "log.sample_tokens": 0}
    first = train(tiny(corpus, tmp_path / "cut", **half, **kw))
    assert first["sample"] is None and '"sample"' not in (tmp_path / "cut" / "metrics.jsonl").read_text()  # 0: none
    out = train(tiny(corpus, tmp_path / "cut", **{"train.steps": 16, "checkpoint.every": 8}, **kw))
    full, cut = losses(tmp_path / "full"), losses(tmp_path / "cut")
    assert sorted(cut) == list(range(1, 17))
    np.testing.assert_allclose([cut[s] for s in range(1, 17)], [full[s] for s in range(1, 17)], rtol=0, atol=1e-6)
    assert out["step"] == 16


@pytest.mark.xdist_group("trained")
def test_restore_for_inference(trained):
    from jaxlm.nn.loss import cross_entropy
    from jaxlm.training.checkpoint import restore_for_inference

    _, run = trained
    model, cfg, tok = restore_for_inference(run)
    assert cfg.model.d_model == 32 and tok.decode(tok.encode("hi there")) == "hi there"
    model2, _, _ = restore_for_inference(run / "checkpoints" / "30")
    x = np.array([tok.encode("def f(x):\n    return x + 1\n")], np.int32)
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(model2(x)))
    assert np.isfinite(float(cross_entropy(model(x[:, :-1]), x[:, 1:])))


def test_a_profiled_run_says_where_its_trace_went_and_a_complete_rerun_does_not_say_resumed(corpus, tmp_path, capsys):
    from jaxlm.training.loop import train

    cfg = tiny(corpus, tmp_path / "run", **{"train.steps": 4, "log.profile_steps": [2, 3], "log.sample_tokens": 0})
    train(cfg)
    (line,) = [l for l in capsys.readouterr().err.splitlines() if l.startswith("profiler trace")]
    trace_dir = line.split(" in ", 1)[1].split(";")[0]
    assert list(Path(trace_dir).rglob("*.xplane.pb")) and f"tensorboard --logdir {tmp_path / 'run'}" in line
    train(cfg)
    err = capsys.readouterr().err
    assert "already complete (step 4 of train.steps = 4" in err and "nothing was trained" in err
    assert "resumed from" not in err and "profiler trace" not in err


def test_nan_stops_without_saving_bad_state(corpus, tmp_path):
    from jaxlm.training.loop import TrainingDiverged, train

    cfg = tiny(corpus, tmp_path / "run", **{"optim.lr": 1e30, "optim.min_lr": 0.0, "optim.warmup_steps": 3,
                                            "optim.grad_clip": 0.0, "checkpoint.every": 1})
    with pytest.raises(TrainingDiverged, match="last good checkpoint"):
        train(cfg)
    from jaxlm.training.checkpoint import restore_for_inference

    # Step 1 ran at lr 0 (warmup) and was saved; step 2's update blew up and was not.
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]
    model, _, _ = restore_for_inference(tmp_path / "run")
    from flax import nnx

    assert all(np.isfinite(np.asarray(p)).all() for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


# --------------------------------------------------------------------------- the step


def test_evaluation_scores_the_same_targets_at_every_batch_size(corpus):
    """Same weights at batch 1, 3 and 8 (3 leaves a padded last batch; 300 targets cut the last window):
    the loss and accuracy of a float64 numpy reference over the first 300 validation targets."""
    from types import SimpleNamespace

    from jaxlm.data.loader import TokenWindows
    from jaxlm.training.loop import build, evaluate

    mesh = sharding.make_mesh(jax.devices()[:1])
    results = []
    for batch in (1, 3, 8):
        cfg = tiny(corpus, "/unused", **{"data.batch_size": batch, "data.eval_tokens": 300})
        jitted = build(cfg, mesh)
        state = jax.jit(jitted.make_state, out_shardings=jitted.shardings)()
        results.append(evaluate(SimpleNamespace(cfg=cfg, mesh=mesh, jitted=jitted, state=state, data_dir=corpus)))
    val = np.asarray(TokenWindows.from_dir(corpus, "val", 32).tokens[:321], np.int32)
    x, y = val[:320].reshape(10, 32), val[1:321].reshape(10, 32)
    logits = np.asarray(state.model(jitted.graphdef)(x, deterministic=True), np.float64).reshape(320, -1)[:300]
    m = logits.max(-1)
    nll = m + np.log(np.exp(logits - m[:, None]).sum(-1)) - logits[np.arange(300), y.reshape(-1)[:300]]
    acc = np.mean(logits.argmax(-1) == y.reshape(-1)[:300])
    for r in results:
        assert r["eval/tokens"] == 300
        np.testing.assert_allclose(r["eval/loss"], nll.mean(), rtol=1e-6)
        np.testing.assert_allclose(r["eval/accuracy"], acc, rtol=1e-6)
    assert results[0]["eval/loss"] == pytest.approx(results[2]["eval/loss"], rel=1e-6)


@pytest.fixture(scope="module")
def plain_steps(corpus):
    """(losses, params) of 6 float32 steps of the tiny config on one device: the reference of the variants below
    (one xdist group, so it runs once)."""
    return run_steps(tiny(corpus, "/unused"), sharding.make_mesh(jax.devices()[:1]), 6)


@pytest.mark.xdist_group("plain_steps")
def test_accumulation_equals_big_batch(corpus, plain_steps):
    mesh = sharding.make_mesh(jax.devices()[:1])
    big, pb = plain_steps
    acc, pa = run_steps(tiny(corpus, "/unused", **{"train.grad_accum": 4}), mesh, 6)
    np.testing.assert_allclose(acc, big, atol=1e-5)
    assert max_param_diff(pa, pb) < 1e-5


@pytest.mark.parametrize(
    "variant, tol",
    [({"compute.remat": '"full"'}, 1e-5), ({"compute.remat": '"dots_saveable"'}, 1e-5),
     ({"compute.dtype": '"bfloat16"'}, 3e-2)],
)
@pytest.mark.xdist_group("plain_steps")
def test_precision_and_remat_match_float32(corpus, plain_steps, variant, tol):
    """Remat recomputes the same float32 math (1e-5); bfloat16 compute stays within 3e-2 of the loss."""
    mesh = sharding.make_mesh(jax.devices()[:1])
    ref, _ = plain_steps
    got, _ = run_steps(tiny(corpus, "/unused", **variant), mesh, 6)
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)


def _check_layouts(names: list[str]) -> None:
    """Run `names` of LAYOUTS on 8 simulated devices in one subprocess: the same loss and gradients as one
    device (relative 1e-5, float32) and the same 20-step loss trajectory (relative 1e-4)."""
    r = subprocess.run([PY, str(ROOT / "tests" / "train_helpers.py"), "devices", *names],
                       env=env(XLA_FLAGS=xla_devices(8)), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out) == set(names)
    for name, res in out.items():
        assert res["loss_rel"] < 1e-5 and res["grad_rel"] < 1e-5, (name, res)
        assert res["traj_rel"] < 1e-4, (name, res)
    for name, axis in (("fsdp", "fsdp"), ("tp", "tensor"), ("tp_fsdp", "fsdp"), ("scan_fsdp_tp", "tensor"),
                       ("pp_dp", "pipeline"), ("pp_lora", "pipeline"), ("tp2_chunk", "tensor"),
                       ("tp4_chunk", "tensor")):
        if name in out:  # the strategy really splits the parameters over its axis
            assert any(axis in s for s in out[name]["specs"]), (name, out[name]["specs"])


# One representative of each kind, in one subprocess: FSDP + tensor (scanned); data + pipeline (QLoRA). The other
# layouts (the chunked loss under tensor among them): the extended test.
FAST_LAYOUTS = ["scan_fsdp_tp", "pp_lora"]


@pytest.mark.slow
def test_mesh_layouts_on_8_devices_equal_one_device():
    """Scanned FSDP + tensor; QLoRA through a pipeline + data."""
    _check_layouts(FAST_LAYOUTS)


@pytest.mark.extended
def test_more_mesh_layouts_on_8_devices_equal_one_device():
    """Data alone, FSDP alone and + data, tensor alone (8), + data and + FSDP, accumulation + data, pipeline alone
    (8 stages) and + data, QAT through the pipeline, compute.loss_chunk under tensor = 2 and 4 (the head's
    vocabulary rows split, blocks padded; the single-device chunked loss: tests/lib/test_loss.py)."""
    _check_layouts([n for n in LAYOUTS if n not in FAST_LAYOUTS])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_equal_one(corpus, tmp_path):
    from jaxlm.training.loop import train

    train(tiny(corpus, tmp_path / "one", **{"train.steps": 6, "train.eval_every": 6, "checkpoint.every": 6}))
    cmd = [PY, "-m", "jaxlm.train"]
    port = _free_port()
    two = tiny_overrides(corpus, tmp_path / "two", **{"train.steps": 6, "train.eval_every": 6, "checkpoint.every": 6,
                                                         "parallel.distributed": "true",
                                                         "parallel.coordinator": f'"127.0.0.1:{port}"',
                                                         "parallel.num_processes": 2})
    procs = [
        subprocess.Popen(cmd + sum((["--set", o] for o in two + [f"parallel.process_id={i}"]), []), env=env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-3000:]
    one, two_l = losses(tmp_path / "one"), losses(tmp_path / "two")
    np.testing.assert_allclose([two_l[s] for s in sorted(one)], [one[s] for s in sorted(one)], atol=1e-5)
    assert (tmp_path / "two" / "checkpoints" / "6").is_dir()


# --------------------------------------------------------------------------- configs and CLI


def test_cli_reports_bad_config(tmp_path):
    r = subprocess.run([PY, "-m", "jaxlm.train", "--config", str(ROOT / "experiments/configs/quickstart.toml"),
                        "--set", "train.stepz=3"], env=env(), capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 2 and "train.stepz" in r.stderr and "Traceback" not in r.stderr


def test_cli_names_the_download_of_a_missing_corpus(tmp_path):
    r = subprocess.run([PY, "-m", "jaxlm.train", "--config", str(ROOT / "experiments/configs/shakespeare_char.toml")],
                       env=env(JAXLM_DATA=str(tmp_path / "data")), capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"error: {tmp_path}/data/tinyshakespeare/input.txt: corpus 'tinyshakespeare' not found; run "
        "`python -m jaxlm.data download tinyshakespeare` (or point JAXLM_DATA at a folder that holds it)"], r.stderr


def test_steps_in_call_cuts_at_every_scheduled_step():
    cfg = load_config(None, ["train.steps=23", "train.steps_per_call=10", "train.eval_every=7", "checkpoint.every=100",
                             "log.sample_every=0", "log.profile_steps=[15, 16]"])
    starts, step = [], 0
    while step < cfg.train.steps:
        n = steps_in_call(step, cfg)
        assert n >= 1
        starts.append((step, n))
        step += n
    # calls end at 7, 10 (steps_per_call), 14 (eval), 15 (profile starts), 16 and 17 (one step each
    # while profiling), 20 (steps_per_call), 21 (eval), 23 (end)
    assert [s + n for s, n in starts] == [7, 10, 14, 15, 16, 17, 20, 21, 23]
    assert steps_in_call(0, load_config(None, ["train.steps=5", "train.steps_per_call=1"])) == 1


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The README's first command, cut to a few steps and profiling two, in a fresh directory (it prepares its own
    data), run twice: (first, second) completed processes and the run directory."""
    cwd = tmp_path_factory.mktemp("quickstart")
    cmd = [PY, "-m", "jaxlm.train", "--config", str(ROOT / "experiments/configs/quickstart.toml"),
           "--set", "train.steps=6", "--set", "train.eval_every=3", "--set", "data.eval_tokens=512",
           "--set", "log.every=3", "--set", "log.sample_tokens=20", "--set", "log.profile_steps=[2, 3]"]
    first = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300, cwd=cwd)
    again = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300, cwd=cwd)
    return first, again, cwd / "runs" / "quickstart"


@pytest.mark.slow
@pytest.mark.xdist_group("quickstart")
def test_quickstart_cli_end_to_end(quickstart):
    r, again, run = quickstart
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--- sample after 6 steps ---" in r.stdout
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete (step 6 of train.steps = 6" in again.stderr, again.stderr[-3000:]
    assert (run / "checkpoints" / "6").is_dir() and (run / "config.toml").is_file()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()["tensors"] + events.Tags()["scalars"]
    for tag in ("train/loss", "train/lr", "eval/loss", "eval/perplexity", "perf/tokens_per_s", "samples/text"):
        assert tag in tags, tags
    assert list((run / "tb").rglob("*.xplane.pb")), "no profiler trace for log.profile_steps"


@pytest.mark.slow
@pytest.mark.xdist_group("quickstart")
@needs("profile")
def test_tensorboards_profile_tab_lists_the_quickstarts_traces(quickstart):
    _, _, run = quickstart
    profiles = [p.name for p in (run / "tb" / "plugins" / "profile").iterdir()]
    assert profiles and _tensorboard_profile_runs(run / "tb") == profiles


def _tensorboard_profile_runs(logdir: Path) -> list[str]:
    """The runs TensorBoard's profile plugin (xprof, the `profile` extra) serves for `logdir`."""
    port = _free_port()
    proc = subprocess.Popen([PY, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # TensorBoard starts in seconds; this only bounds a hang
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/profile/runs", timeout=30) as r:
                    body = r.read()
                    return json.loads(gzip.decompress(body) if r.headers.get("Content-Encoding") == "gzip" else body)
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_steps_per_call_matches_one_step_per_call(corpus, tmp_path):
    """Scanning several steps per jitted call (cut at eval/checkpoint steps) follows the same trajectory."""
    from jaxlm.training.loop import train

    train(tiny(corpus, tmp_path / "one", **{"train.steps": 12, "train.eval_every": 6}))
    train(tiny(corpus, tmp_path / "many", **{"train.steps": 12, "train.eval_every": 6, "train.steps_per_call": 4}))
    one, many = losses(tmp_path / "one"), losses(tmp_path / "many")
    assert sorted(many) == list(range(1, 13))
    np.testing.assert_allclose([many[s] for s in range(1, 13)], [one[s] for s in range(1, 13)], atol=1e-5)


@pytest.mark.extended
def test_sigterm_saves_a_checkpoint_and_resume_continues(corpus, tmp_path):
    """The default suite's SIGTERM-to-training test: tests/system/test_faults_signals.py
    (test_sigterm_to_the_runner_lets_its_training_run_save_and_resume, the runner passing it on)."""
    import signal

    run = tmp_path / "run"
    long = {"train.steps": 100000, "optim.cosine_steps": 100000, "checkpoint.every": 100000, "train.eval_every": 100000}
    args = [PY, "-m", "jaxlm.train"] + sum((["--set", o] for o in tiny_overrides(corpus, run, **long)), [])
    proc = subprocess.Popen(args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and (not (run / "metrics.jsonl").is_file() or len(losses(run)) < 3):
        time.sleep(0.5)  # no time limit: on a busy machine the first steps can take minutes
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    steps = [int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()]
    assert len(steps) == 1 and steps[0] >= 3 and "SIGTERM" in out + err
    from jaxlm.core.config import CheckpointConfig
    from jaxlm.training.checkpoint import Checkpointer

    assert Checkpointer(run, CheckpointConfig()).latest_step() == steps[0]
