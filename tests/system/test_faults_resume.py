"""Resuming: kill -9 at random points resumes bit-identically; a truncated newest checkpoint falls back to the
one before; no checkpoint that restores is one line; a complete run is left as it is."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from jaxlm.core.config import load_config
from jaxlm.core.errors import CheckpointError
from tests.system.fault_helpers import HELPERS, PY, RUN, last_train_step, rows, sets, tree, truncate_checkpoint
from tests.train_helpers import env, tiny_overrides

pytestmark = pytest.mark.xdist_group("faults-reference")  # the reference run is trained once


# --------------------------------------------------------------------------- kill -9


def _kill_and_resume(corpus, run: Path, kills: int, seed: int) -> list[int]:
    """Start the run, kill -9 it at `kills` random points (each a random step, then a random moment
    within that step's call), resume each time, and let the last process finish. Returns the steps."""
    rng = random.Random(seed)
    args = [PY, HELPERS, "slow-train", "0.05", *sets(tiny_overrides(corpus, run, **RUN))]
    points, last = [], 0
    for target in sorted(rng.sample(range(2, RUN["train.steps"] - 2), kills)):
        target = max(target, last + 1)  # rows up to `last` may still be the killed process's
        log = run.parent / f"killed-{len(points)}.log"  # a file, not a pipe nobody reads while it runs
        with open(log, "w") as err:
            proc = subprocess.Popen(args, env=env(), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + 600  # generous: start-up alone takes a minute on a loaded 2-core machine
        while proc.poll() is None and last_train_step(run) < target and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.06))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
        assert proc.returncode in (-signal.SIGKILL, 0), log.read_text()[-3000:]
        last = last_train_step(run)
        points.append(last)
    done = subprocess.run(args, env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return points


def _check_equal_to_reference(run: Path, reference: Path, why: str) -> None:
    from jaxlm.training.checkpoint import restore_for_inference

    for kind in ("train", "eval"):
        got, want = rows(run, kind), rows(reference, kind)
        assert [r["step"] for r in got] == [r["step"] for r in want], f"{why}: {kind} rows"
        key = "train/loss" if kind == "train" else "eval/loss"
        assert [r[key] for r in got] == [r[key] for r in want], f"{why}: {kind} losses differ"
    assert not list((run / "checkpoints").glob("*orbax-checkpoint-tmp*")), why
    (a, _, _), (b, _, _) = restore_for_inference(run), restore_for_inference(reference)
    import jax
    from flax import nnx

    pa, pb = jax.tree.leaves(nnx.state(a, nnx.Param)), jax.tree.leaves(nnx.state(b, nnx.Param))
    assert all(np.array_equal(x, y) for x, y in zip(pa, pb)), f"{why}: final parameters differ"


def test_kill_9_at_a_random_point_resumes_bit_identically(corpus, reference, tmp_path):
    """One kill in the default suite; eight in a row: the extended test below."""
    seed = random.SystemRandom().randrange(1 << 30)
    points = _kill_and_resume(corpus, tmp_path / "run", kills=1, seed=seed)
    print(f"seed {seed}: killed after steps {points}")
    _check_equal_to_reference(tmp_path / "run", reference, f"seed {seed}, killed after steps {points}")


@pytest.mark.extended
def test_kill_9_many_times(corpus, reference, tmp_path):
    seed = random.SystemRandom().randrange(1 << 30)
    points = _kill_and_resume(corpus, tmp_path / "run", kills=8, seed=seed)
    print(f"seed {seed}: killed after steps {points}")
    _check_equal_to_reference(tmp_path / "run", reference, f"seed {seed}, killed after steps {points}")

# --------------------------------------------------------------------------- damaged checkpoints


def test_truncated_latest_checkpoint_falls_back(corpus, reference, tmp_path, capfd):
    from jaxlm.training.checkpoint import restore_for_inference
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    train(load_config(None, tiny_overrides(corpus, run, **{**RUN, "train.steps": 21})))  # checkpoints 18, 21
    truncate_checkpoint(run / "checkpoints" / "21")
    (run / "checkpoints" / "24.orbax-checkpoint-tmp-1795330000123456").mkdir()  # a save killed midway
    capfd.readouterr()
    before = tree(run)
    restore_for_inference(run)  # generation falls back too, and changes nothing
    assert f"{run}/checkpoints/21 does not restore" in capfd.readouterr().err
    assert tree(run) == before
    train(load_config(None, tiny_overrides(corpus, run, **RUN)))
    err = capfd.readouterr().err
    assert f"{run}/checkpoints/21 does not restore" in err and f"resumed from {run}/checkpoints/18" in err
    assert (run / "checkpoints" / "21.unrestorable").is_dir()  # set aside, not deleted
    _check_equal_to_reference(run, reference, "resumed from 18 after 21 was truncated")

    # TensorBoard's own reader (RustBoard, the default, preempts per series by itself)
    from tensorboard.backend.event_processing.plugin_event_accumulator import (
        EventAccumulator,
    )

    events = EventAccumulator(str(run / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    steps = [e.step for e in events.Tensors("train/loss")]
    assert steps == list(range(1, 31)), "TensorBoard shows a step twice (or misses one) after the resume"


def test_no_checkpoint_that_restores_is_one_line(corpus, reference, tmp_path):
    from jaxlm.training.checkpoint import restore_for_inference
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    for step in ("27", "30"):  # the two it keeps, both truncated
        truncate_checkpoint(run / "checkpoints" / step)
    before = tree(run)
    with pytest.raises(CheckpointError, match="no checkpoint restores .steps tried: 30, 27"):
        restore_for_inference(run)
    with pytest.raises(CheckpointError, match="no checkpoint restores"):
        train(load_config(None, tiny_overrides(corpus, run, **{**RUN, "train.steps": 40})))
    assert tree(run) == before  # nothing set aside, nothing started afresh


def test_generate_on_a_run_without_checkpoints_creates_nothing(corpus, tmp_path):
    from jaxlm.training.checkpoint import restore_for_inference

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[model]\nd_model = 32\nnum_heads = 2\n")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        restore_for_inference(run)
    assert [p.name for p in run.iterdir()] == ["config.toml"]

# --------------------------------------------------------------------------- a complete run stays as it is


def test_rerunning_a_complete_run_changes_nothing(reference, corpus, tmp_path):
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = tree(run)
    assert train(load_config(None, tiny_overrides(corpus, run, **RUN)))["sample"] is None
    train(load_config(None, tiny_overrides(corpus, run, **{**RUN, "train.steps": 10})))  # fewer than done
    assert tree(run) == before  # no second sample row, no new event file, config.toml as it was


def test_a_changed_config_is_held_to_the_newest_checkpoint_that_records_its_run(tmp_path):
    """The newest checkpoint's meta does not read (a damaged save): the one before it, which the restore falls back
    to, is the one the config must match (config.toml stood in before, for checkpoints older than the record)."""
    import json

    from jaxlm.core.typedconfig import dumps_toml, to_dict
    from jaxlm.training.preflight import check_run_dir, run_identity

    run = tmp_path / "run"
    saved = load_config(None, tiny_overrides(tmp_path / "data", run))
    (run / "checkpoints" / "3" / "meta").mkdir(parents=True)
    (run / "checkpoints" / "3" / "meta" / "metadata").write_text(json.dumps({"identity": run_identity(saved)}))
    (run / "checkpoints" / "6").mkdir()  # its meta was never written
    (run / "config.toml").write_text(dumps_toml(to_dict(saved)))
    with pytest.raises(CheckpointError, match=rf"^{run}/checkpoints/3: the saved run differs: model.d_model: "
                                              r"checkpoint 32, config 64;"):
        check_run_dir(load_config(None, tiny_overrides(tmp_path / "data", run, **{"model.d_model": 64})))
    check_run_dir(saved)  # the same config resumes
