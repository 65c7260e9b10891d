"""Fault injection: kill -9 and resume, damaged checkpoints, failed prepares, bad token files,
two writers of one run, failed saves and full disks, padded vocabularies, memory, fine-tuning on a
mesh, pipeline dropout, signals during start-up, complete runs left untouched, and a table of bad
invocations across every CLI (exit code, one `error:` line naming the culprit, no traceback)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from jaxlm import cli
from jaxlm.core.config import load_config
from jaxlm.core.errors import CheckpointError, ConfigError, DataError, DirectoryInUse
from tests.train_helpers import ROOT, hold_locks, make_corpus, tiny_overrides

# One worker runs this module, so its trained fixtures (corpus, reference run, broken inputs) are built once.
pytestmark = pytest.mark.xdist_group("faults")

PY = sys.executable
HELPERS = str(ROOT / "tests" / "train_helpers.py")
# Checkpoints every 3 steps (the newest 2 kept), dropout on (its RNG stream is state too),
# a fixed cosine length (the schedule does not depend on train.steps), a metrics row per step.
RUN = {"train.steps": 30, "checkpoint.every": 3, "optim.cosine_steps": 40, "train.eval_every": 10,
       "model.dropout": 0.1, "log.sample_tokens": 8}


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    for k in ("XLA_FLAGS", "JAXLM_DEBUG"):
        env.pop(k, None)
    return {**env, **extra}


def _sets(overrides: list[str]) -> list[str]:
    return sum((["--set", o] for o in overrides), [])


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _rows(run: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def reference(corpus, tmp_path_factory):
    """The uninterrupted 30-step run every interrupted one must reproduce."""
    from jaxlm.training.loop import train

    run = tmp_path_factory.mktemp("reference") / "run"
    train(load_config(None, tiny_overrides(corpus, run, **RUN)))
    return run


# --------------------------------------------------------------------------- kill -9


def _last_train_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    steps = [0]
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # being written
        if row.get("kind") == "train":
            steps.append(row["step"])
    return max(steps)


def _kill_and_resume(corpus, run: Path, kills: int, seed: int) -> list[int]:
    """Start the run, kill -9 it at `kills` random points (each a random step, then a random moment
    within that step's call), resume each time, and let the last process finish. Returns the steps."""
    rng = random.Random(seed)
    args = [PY, HELPERS, "slow-train", "0.05", *_sets(tiny_overrides(corpus, run, **RUN))]
    points, last = [], 0
    for target in sorted(rng.sample(range(2, RUN["train.steps"] - 2), kills)):
        target = max(target, last + 1)  # rows up to `last` may still be the killed process's
        log = run.parent / f"killed-{len(points)}.log"  # a file, not a pipe nobody reads while it runs
        with open(log, "w") as err:
            proc = subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + 600  # generous: start-up alone takes a minute on a loaded 2-core machine
        while proc.poll() is None and _last_train_step(run) < target and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.06))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=120)
        assert proc.returncode in (-signal.SIGKILL, 0), log.read_text()[-3000:]
        last = _last_train_step(run)
        points.append(last)
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return points


def _check_equal_to_reference(run: Path, reference: Path, why: str) -> None:
    from jaxlm.training.checkpoint import restore_for_inference

    for kind in ("train", "eval"):
        got, want = _rows(run, kind), _rows(reference, kind)
        assert [r["step"] for r in got] == [r["step"] for r in want], f"{why}: {kind} rows"
        key = "train/loss" if kind == "train" else "eval/loss"
        assert [r[key] for r in got] == [r[key] for r in want], f"{why}: {kind} losses differ"
    assert not list((run / "checkpoints").glob("*orbax-checkpoint-tmp*")), why
    (a, _, _), (b, _, _) = restore_for_inference(run), restore_for_inference(reference)
    import jax
    from flax import nnx

    pa, pb = jax.tree.leaves(nnx.state(a, nnx.Param)), jax.tree.leaves(nnx.state(b, nnx.Param))
    assert all(np.array_equal(x, y) for x, y in zip(pa, pb)), f"{why}: final parameters differ"


def test_kill_9_at_random_points_resumes_bit_identically(corpus, reference, tmp_path):
    seed = random.SystemRandom().randrange(1 << 30)
    points = _kill_and_resume(corpus, tmp_path / "run", kills=3, seed=seed)
    print(f"seed {seed}: killed after steps {points}")
    _check_equal_to_reference(tmp_path / "run", reference, f"seed {seed}, killed after steps {points}")


@pytest.mark.extended
def test_kill_9_many_times(corpus, reference, tmp_path):
    seed = random.SystemRandom().randrange(1 << 30)
    points = _kill_and_resume(corpus, tmp_path / "run", kills=8, seed=seed)
    print(f"seed {seed}: killed after steps {points}")
    _check_equal_to_reference(tmp_path / "run", reference, f"seed {seed}, killed after steps {points}")


# --------------------------------------------------------------------------- damaged checkpoints


def _truncate_checkpoint(step_dir: Path) -> None:
    """Cut every data file of a checkpoint in half, as a full disk or a bad copy would."""
    for f in step_dir.rglob("*"):
        if f.is_file() and f.parent.name == "d":
            os.truncate(f, f.stat().st_size // 2)


def test_truncated_latest_checkpoint_falls_back(corpus, reference, tmp_path, capfd):
    from jaxlm.training.checkpoint import restore_for_inference
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    train(load_config(None, tiny_overrides(corpus, run, **{**RUN, "train.steps": 21})))  # checkpoints 18, 21
    _truncate_checkpoint(run / "checkpoints" / "21")
    (run / "checkpoints" / "24.orbax-checkpoint-tmp-1795330000123456").mkdir()  # a save killed midway
    capfd.readouterr()
    before = _tree(run)
    restore_for_inference(run)  # generation falls back too, and changes nothing
    assert f"{run}/checkpoints/21 does not restore" in capfd.readouterr().err
    assert _tree(run) == before
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


def test_no_checkpoint_that_restores_is_one_line(corpus, files, tmp_path):
    from jaxlm.training.checkpoint import restore_for_inference
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    shutil.copytree(files["corrupt"], run)  # checkpoints 2 and 4, both truncated
    before = _tree(run)
    with pytest.raises(CheckpointError, match="no checkpoint restores .steps tried: 4, 2"):
        restore_for_inference(run)
    with pytest.raises(CheckpointError, match="no checkpoint restores"):
        train(load_config(None, tiny_overrides(corpus, run, **{"train.steps": 8})))
    assert _tree(run) == before  # nothing set aside, nothing started afresh


def test_generate_on_a_run_without_checkpoints_creates_nothing(corpus, tmp_path):
    from jaxlm.training.checkpoint import restore_for_inference

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[model]\nd_model = 32\nnum_heads = 2\n")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        restore_for_inference(run)
    assert [p.name for p in run.iterdir()] == ["config.toml"]


# --------------------------------------------------------------------------- data


def test_failed_prepare_keeps_good_data(tmp_path):
    from jaxlm.data.prepare import prepare

    good, bad, out = tmp_path / "good.txt", tmp_path / "bad.txt", tmp_path / "data"
    good.write_text("some good text\n" * 200)
    bad.write_bytes(b"valid start " * 100 + b"\xff\xfe")
    prepare([str(good)], "bytes", out, progress=False)
    before = _tree(out)
    with pytest.raises(DataError, match="bad.txt: not valid UTF-8"):
        prepare([str(good), str(bad)], "bytes", out, progress=False)  # fails after encoding good.txt
    with pytest.raises(DataError, match="bad.txt: not valid UTF-8"):
        prepare([str(good)], "bytes", out, val_inputs=[str(bad)], progress=False)  # fails after train.bin
    with pytest.raises(DataError, match="bad.txt: not valid UTF-8"):
        prepare([str(bad)], "bytes", tmp_path / "new" / "deeper", progress=False)
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "data", "good.txt"]  # no temporaries
    killed = tmp_path / ".data.prepare-999999999"  # what a kill -9 mid-prepare leaves: cleared by the next one
    killed.mkdir()
    prepare([str(good)], "bytes", out, progress=False)
    assert not killed.exists()


def test_out_of_range_token_file_is_refused_naming_it(corpus, tmp_path):
    from jaxlm.training.loop import train

    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    ids = np.fromfile(data / "train.bin", dtype=np.uint16)
    ids[1234] = 300  # model.vocab_size is 257; meta.json still records the old maximum
    ids.tofile(data / "train.bin")
    cfg = load_config(None, tiny_overrides(data, tmp_path / "run"))
    with pytest.raises(DataError, match=f"{data / 'train.bin'}: holds token id 300, but model.vocab_size = 257"):
        train(cfg)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- one writer per run


def test_a_second_writer_is_refused_and_a_dead_holders_lock_is_taken_over(corpus, tmp_path, capfd):
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(corpus, run, **{"train.steps": 2, "log.tensorboard": "false"}))
    holder = hold_locks(run)
    try:
        with pytest.raises(DirectoryInUse, match=f"train.out_dir = '{run}': in use by pid {holder.pid} on host "):
            train(cfg)
        assert not run.exists()  # refused before anything was created
    finally:
        holder.kill()
        holder.wait()
    capfd.readouterr()
    assert train(cfg)["step"] == 2  # the killed holder's lock is stale: taken over
    assert f"took over the lock of pid {holder.pid}" in capfd.readouterr().err
    assert not (tmp_path / ".run.lock").exists()  # released at the end


# --------------------------------------------------------------------------- failed saves, full disks


def _limited(max_bytes: int, module: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python -m module args` unable to write a file past max_bytes (RLIMIT_FSIZE: a full disk, for one process)."""
    return subprocess.run([PY, HELPERS, "file-size-limit", str(max_bytes), module, *args], env=_env(),
                          capture_output=True, text=True, timeout=300)


def test_a_failed_checkpoint_save_ends_in_one_line_without_hanging(corpus, tmp_path):
    """A full disk (a file size limit): exit 1 within the timeout, one line naming checkpoints/ and the cause,
    orbax's tracebacks only in RUN/error.log. d_model 512 makes one array (the 257 x 512 embedding, 526 KB) larger
    than the limit, so the first save fails however orbax groups its arrays into files (a 37k-parameter state
    can fit in files under the limit)."""
    run = tmp_path / "run"
    sets = {"train.steps": 4, "checkpoint.every": 2, "model.d_model": 512}
    r = _limited(200_000, "jaxlm.train", _sets(tiny_overrides(corpus, run, **sets)))
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(rf"{re.escape(str(run))}/checkpoints: saving checkpoint 2 failed: File too large", errors[0])
    assert "Traceback" in (run / "error.log").read_text()


def test_preflight_refuses_a_disk_without_room_for_one_checkpoint(corpus, tmp_path, monkeypatch):
    import shutil as sh

    from jaxlm.training import preflight
    from jaxlm.training.loop import train

    usage = sh.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: usage._replace(free=100_000))
    with pytest.raises(ConfigError, match=r"train.out_dir = .*: its file system has 0.1 MiB free, one checkpoint of "
                                          r"this run takes 0.4 MiB"):
        train(load_config(None, tiny_overrides(corpus, tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_a_full_disk_during_prepare_names_the_file_and_the_cause(tmp_path):
    text, out = tmp_path / "text.txt", tmp_path / "data"
    text.write_text("some text to tokenise\n" * 40_000)
    r = _limited(300_000, "jaxlm.data", ["prepare", "--input", str(text), "--tokenizer", "bytes", "--out", str(out)])
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors[0].startswith(f"error: {out}/train.bin: preparing the data failed: File too large")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]  # no half-written data, no lock left


# --------------------------------------------------------------------------- padded vocabularies


def test_a_padded_vocabulary_never_samples_past_the_tokenizer():
    """The padding ids get the only nonzero logits (the largest, almost surely, among them); neither greedy
    nor sampled decoding may draw one."""
    from flax import nnx

    from jaxlm.core.config import ModelConfig
    from jaxlm.nn.decode import Generator, SamplingParams
    from jaxlm.nn.model import TransformerLM

    model = TransformerLM(ModelConfig(vocab_size=300, context_length=32, d_model=32, num_layers=1, num_heads=2,
                                      d_ff=64), rngs=nnx.Rngs(0))
    model.lm_head.weight[...] = 10 * model.lm_head.weight[...].at[:257].set(0.0)  # (V, D): only padding rows
    prompt = [[1, 2, 3]]
    assert max(Generator(model).generate(prompt, 8, SamplingParams(0.0)).tokens[0]) >= 257  # the trap works
    gen = Generator(model, 257)  # sampling parameters are traced: one compilation per cache mode
    for sampling in (SamplingParams(0.0), SamplingParams(1.0), SamplingParams(1.0, top_k=5, top_p=0.9)):
        for use_cache in (True, False):
            out = gen.generate(prompt * 3, 8, sampling, seed=1, use_cache=use_cache)
            assert max(map(max, out.tokens)) < 257, (sampling, use_cache)


# --------------------------------------------------------------------------- memory


def test_memory_preflight_names_the_batch_and_the_largest_that_fits(corpus, tmp_path, monkeypatch):
    """With less memory than the compiled step needs: refused before any state exists, naming
    data.batch_size, the figure and a batch whose compiled step does fit."""
    import jax

    from jaxlm.analysis.flops import param_counts
    from jaxlm.core import sharding
    from jaxlm.training import loop as loop_lib
    from jaxlm.training import preflight

    cfg = load_config(None, tiny_overrides(corpus, tmp_path / "run", **{"data.batch_size": 64}))
    mesh = sharding.make_mesh(cfg=cfg.parallel)

    def needed(cfg):
        b = loop_lib.build(cfg, mesh)
        x = jax.ShapeDtypeStruct((cfg.data.batch_size, cfg.model.context_length), jax.numpy.int32,
                                 sharding=sharding.batch_sharding(mesh))
        m = b.step_fn.lower(b.abstract, x, x).compile().memory_analysis()
        return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes

    have = needed(cfg) // 3
    monkeypatch.setattr(preflight, "available_memory", lambda: (have, "this test device has"))
    with pytest.raises(ConfigError, match=r"data.batch_size = 64: the compiled train step needs .* per device .* "
                                          r"but this test device has .*; about (\d+) fits") as e:
        loop_lib.train(cfg)
    assert not (tmp_path / "run").exists()  # refused before anything was created
    fits = int(str(e.value).split("about ")[1].split(" ")[0])
    assert 1 <= fits < 64
    assert needed(load_config(None, tiny_overrides(corpus, tmp_path / "run", **{"data.batch_size": fits}))) <= have
    weights = param_counts(cfg.model)["total"] * 4 * 2  # float32 (and RoPE tables): the parameters fit, Adam does not
    monkeypatch.setattr(preflight, "available_memory", lambda: (weights, "this test device has"))
    with pytest.raises(ConfigError, match=r"model.d_model = 32, model.num_layers = 2 .*so no batch fits"):
        loop_lib.train(cfg)
    monkeypatch.setattr(preflight, "available_memory", lambda: (1000, "this test device has"))
    with pytest.raises(ConfigError, match=r"model.d_model = 32, .* parameters take 0.1 MiB before any optimizer "
                                          r"state or activation, but this test device has 0.0 MiB"):
        loop_lib.train(cfg)


# --------------------------------------------------------------------------- fine-tuning on a mesh, pipeline dropout

MESH_INIT_FROM = """
import sys, jax, numpy as np
from flax import nnx
from jaxlm.core.config import load_config
from jaxlm.core.stop import StopFlag
from jaxlm.nn import scan
from jaxlm.training.checkpoint import restore_for_inference
from jaxlm.training.loop import start
from tests.train_helpers import tiny_overrides
assert jax.device_count() == 4
base, corpus, out = sys.argv[1:4]
layouts = [["parallel.fsdp=2"], ["parallel.tensor=2"], ["parallel.pipeline=2", "compute.scan_layers=true"]]
for i, layout in enumerate(layouts):  # data x fsdp, data x tensor, data x pipeline (the layers restacked)
    cfg = load_config(None, tiny_overrides(corpus, f"{out}{i}", **{"train.init_from": repr(base)}) + layout)
    with StopFlag() as stop:
        loop = start(cfg, stop)
        model = restore_for_inference(base)[0]
        if cfg.compute.scan_layers:
            model.layers = scan.stack(list(model.layers))
        want, got = nnx.state(model, nnx.Param), loop.state.params
        g, w = jax.tree.leaves(got), jax.tree.leaves(want)
        assert len(g) == len(w) and all(np.array_equal(a, b) for a, b in zip(g, w)), layout
        assert {len(a.sharding.device_set) for a in jax.tree.leaves(got)} == {4}, layout
        loop.close()
print("ok")
"""


@pytest.mark.slow
def test_init_from_on_every_mesh_layout(files, tmp_path):
    """The weights are placed with the state's shardings on 4 devices (data x fsdp, data x tensor, data x
    pipeline), equal to the run's."""
    r = subprocess.run([PY, "-c", MESH_INIT_FROM, files["run"], files["corpus"], str(tmp_path / "out")],
                       env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=4"), capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


PIPELINE_DROPOUT = """
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from jaxlm.core import sharding
from jaxlm.core.config import ComputeConfig, ModelConfig, ParallelConfig
from jaxlm.nn import pipeline, scan
from jaxlm.nn.model import TransformerLM, _block_forward
cfg = ModelConfig(vocab_size=64, context_length=8, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.5)
model = TransformerLM(cfg, ComputeConfig(scan_layers=True), rngs=nnx.Rngs(0), microbatches=2)
B, T, D, M = 4, 8, 16, 2
x = jnp.tile(jax.random.normal(jax.random.key(1), (1, T, D)), (B, 1, 1))  # every row the same tokens
keys = jax.random.split(jax.random.key(2), cfg.num_layers)  # (L,) dropout keys
rope = model.rope(jnp.arange(T))
fn = lambda b, h, k: (_block_forward(b, h, rope, k), None)
with jax.set_mesh(sharding.make_mesh(cfg=ParallelConfig(data=1, pipeline=2, microbatches=M))):
    got = np.asarray(jax.jit(lambda x, k: pipeline.pipeline(model.layers, fn, x, k, microbatches=M))(x, keys))
assert np.abs(got[0] - got[1]).max() > 0.1, "rows 0 and 1 (micro-batches 0 and 1) got the same dropout masks"
want = np.zeros_like(got)  # one device: micro-batch m (rows m, m + M, ...) with the keys folded with m
for m in range(M):
    want[m::M] = np.asarray(scan.scan(model.layers, fn, x[m::M], jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, m))[0])
np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.slow
def test_pipeline_micro_batches_draw_their_own_dropout_masks():
    r = subprocess.run([PY, "-c", PIPELINE_DROPOUT], env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=2"),
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


# --------------------------------------------------------------------------- signals


def test_a_signal_during_start_up_stops_before_the_first_step(corpus, tmp_path, capsys):
    """The signal is a flag (never a KeyboardInterrupt inside JAX): checked before the first step, one
    line, exit 130, nothing created and the lock released."""
    from jaxlm.cli import train as command
    from jaxlm.core import stop as stop_lib

    run = tmp_path / "run"

    class SignalledDuringStartUp(stop_lib.StopFlag):
        """SIGINT arrives during the last start-up stage (after the lock, the preflight and the compile)."""

        def check(self, stage):
            self.checks = getattr(self, "checks", 0) + 1
            self.signal = "SIGINT" if self.checks == 3 else None
            super().check(stage)

    real = stop_lib.StopFlag
    command.StopFlag = SignalledDuringStartUp
    try:
        assert cli.run(command.main, _sets(tiny_overrides(corpus, run))) == 130
    finally:
        command.StopFlag = real
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "interrupted: SIGINT before the first step: stopped; nothing was trained or saved", err
    assert not run.exists() and not (tmp_path / ".run.lock").exists()


def test_after_a_signal_the_previous_handlers_are_back():
    """In-process (a notebook, a test runner) a handled SIGTERM leaves Ctrl-C and SIGTERM as they were; only a
    command that exits ignores them (jaxlm.cli.run)."""
    from jaxlm.core.stop import StopFlag

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with StopFlag() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs in the main thread at the next bytecode
    assert stop.signal == "SIGTERM"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("presses", [pytest.param(1, marks=pytest.mark.extended), 2])
def test_ctrl_c_is_one_line_and_a_true_one(presses, corpus, tmp_path):
    """Once at a random moment of start-up or training: 130 before the first step, else a saved
    checkpoint and 0. Twice during training (a save every 5 steps, so often one in flight): 130 at
    once, the line saying truly whether the checkpoint in flight was saved. Never a traceback (nor a
    crash: Ctrl-C inside JAX's callbacks was one)."""
    seed = random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    run = tmp_path / "run"
    long = {"train.steps": 100_000, "optim.cosine_steps": 100_000, "train.eval_every": 100_000, "checkpoint.every": 5}
    args = [PY, "-m", "jaxlm.train", *_sets(tiny_overrides(corpus, run, **long))]
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if presses == 1:
        time.sleep(rng.uniform(1.0, 6.0))
    else:
        while proc.poll() is None and _last_train_step(run) < 3:  # no time limit: start-up can take a minute
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.3))
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(rng.uniform(0.0, 0.3))
    out, err = proc.communicate(timeout=600)
    why = f"seed {seed}, {presses} presses: exit {proc.returncode}\n{err[-3000:]}"
    assert proc.returncode in (0, 130) and "Traceback" not in err, why
    last = err.strip().splitlines()[-1] if err.strip() else ""  # none: it came before the command started
    if proc.returncode == 0:
        assert "stopped at step" in out, why
    elif last:
        assert last.startswith(("interrupted: SIGINT before the first step", "interrupted: SIGINT again")), why
        assert "stopped at step" not in out, why
        step = last.split("checkpoint ")[1].split(" ")[0] if "SIGINT again" in last and "checkpoint " in last else ""
        if step.isdigit():  # the claim is the truth
            assert (run / "checkpoints" / step).is_dir() == ("was saved" in last), why
    assert presses == 1 or proc.returncode == 130 or "stopped at step" in out, why
    assert not (tmp_path / ".run.lock").exists(), why


# --------------------------------------------------------------------------- a complete run stays as it is


def test_rerunning_a_complete_run_changes_nothing(reference, corpus, tmp_path):
    from jaxlm.training.loop import train

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = _tree(run)
    assert train(load_config(None, tiny_overrides(corpus, run, **RUN)))["sample"] is None
    train(load_config(None, tiny_overrides(corpus, run, **{**RUN, "train.steps": 10})))  # fewer than done
    assert _tree(run) == before  # no second sample row, no new event file, config.toml as it was


# --------------------------------------------------------------------------- the error boundary


def test_unexpected_exception_is_one_line_with_a_traceback_file(tmp_path, capsys):
    def crash(argv):
        with cli.traceback_in(tmp_path):
            raise RuntimeError("boom\nsecond line")

    assert cli.run(crash, []) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: unexpected RuntimeError: boom")
    assert str(tmp_path / "error.log") in err[0] and "RuntimeError: boom" in (tmp_path / "error.log").read_text()

    def crash_anywhere(argv):
        raise KeyError("x")

    assert cli.run(crash_anywhere, []) == 1
    (line,) = capsys.readouterr().err.splitlines()
    path = Path(line.split("full traceback in ")[1].split(" ")[0])
    assert "KeyError" in path.read_text()
    path.unlink()
    with pytest.raises(KeyError):
        cli.run(crash_anywhere, ["--debug"])


def test_interrupt_exits_130_quietly(capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    assert cli.run(interrupted, []) == 130
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- bad invocations

# (module, args, exit code, culprit the error line must name). {names} are files made below.
TINY = ["--set", "model.num_layers=1"]
INVOCATIONS = {
    "train": [
        ("--set train.steps=-5", 2, "train.steps"),
        ("--set optim.lrr=1", 2, "--set optim.lrr=1"),
        ("--config {tmp}/missing.toml", 2, "missing.toml"),
        ("--config {bad_toml}", 2, "bad.toml"),
        ("--preset nope", 2, "nope"),
        ("--bogus-flag", 2, "--bogus-flag"),
        ("--resume=maybe", 2, "--resume"),
        ("--set model.num_heads=3", 2, "num_heads"),
        ("--set compute.dtype=\"float16\"", 2, "compute.dtype"),
        ("--set train.steps=abc", 2, "train.steps"),
        ("--set log.profile_steps=[5]", 2, "log.profile_steps"),
        ("--set data.dir=\"{tmp}/fresh\" --set data.source=[\"{tmp}/missing.txt\"]", 2, "missing.txt"),
        ("--set data.dir=\"{tmp}/fresh\" --set data.source=[\"{empty}\"]", 2, "empty.txt"),
        ("--set data.dir=\"{tmp}/no_data\"", 2, "data.source"),
        ("--set data.dir=\"{no_train}\"", 2, "train.bin"),
        ("--set data.dir=\"{short_val}\"", 2, "val.bin"),
        ("--set data.dir=\"{out_of_range}\"", 2, "train.bin"),
        ("--set model.vocab_size=100", 2, "model.vocab_size"),
        ("--set train.out_dir=\"{file}/run\"", 2, "train.out_dir"),
        ("--set train.out_dir=\"/proc/jaxlm-run\"", 2, "train.out_dir"),
        ("--set train.out_dir=\"\"", 2, "train.out_dir"),
        ("--set compute.attention=\"cudnn\" --set compute.dtype=\"bfloat16\"", 2, "compute.attention"),
        ("--set data.batch_size=12", 2, "data.batch_size"),  # 8 simulated devices
        ("--set parallel.distributed=true", 2, "parallel.distributed"),
        ("--set train.out_dir=\"{run}\" --set model.d_model=64", 2, "model.d_model: checkpoint 32, config 64"),
        ("--set train.out_dir=\"{run}\" --no-resume", 2, "checkpoint.resume"),
        ("--set train.out_dir=\"{corrupt}\" --set train.steps=8", 2, "no checkpoint restores"),
        ("--set train.out_dir=\"{bad_config_run}\"", 2, "config.toml"),
        ("--set train.out_dir=\"{run}\" --set data.dir=\"{bpe_data}\" --set data.tokenizer=\"{bpe}\"", 2,
         "trained with 'bytes'"),
        ("--set train.init_from=\"{tmp}/missing\"", 2, "missing"),
        ("--set train.init_from=\"{run}\" --set model.d_model=64", 2, "its model.d_model = 32, this run's is 64"),
        ("--set lora.rank=-1", 2, "lora.rank"),
        ("--set lora.targets=[\"qkv\"]", 2, "qkv"),
        ("--set qat.weight_bits=3", 2, "qat.weight_bits"),
        ("--set train.steps=100000000000000000000000", 2, "train.steps"),
        ("--set lora.rank=64", 2, "lora.rank"),
        ("--set lora.alpha=8.0", 2, "lora.alpha"),
        ("--set parallel.microbatches=2", 2, "parallel.microbatches"),
        ("--set lora.rank=4 --set lora.base=\"nf4\" --set lora.block_size=63", 2, "lora.block_size"),
        ("--set model=3", 2, "--set model=3"),
        ("--set train.init_from=\"{run}\" --set data.dir=\"{bpe_data}\" --set data.tokenizer=\"{bpe}\"", 2,
         "train.init_from"),
        ("--set train.out_dir=\"{locked}\"", 2, "in use by pid"),
        ("--set train.out_dir=\"{ckpt_file_run}\"", 2, "checkpoints"),
        ("--set train.out_dir=\"{edited}\" --set model.d_model=64", 2, "model.d_model: checkpoint 32, config 64 ("),
    ],
    "lora": [
        ("merge {run} --out {tmp}/merged", 2, "not a LoRA run"),
        ("merge {tmp}/missing --out {tmp}/merged2", 2, "missing"),
        ("merge {run} --out {file}", 2, "a_file"),
        ("merge {locked_run} --out {tmp}/merged3", 2, "in use by pid"),
    ],
    "quantize": [
        ("{run} --bits 3", 2, "--bits 3"),
        ("{tmp}/missing", 2, "missing"),
        ("{run} --tokens -1", 2, "--tokens"),
        ("{locked_run}", 2, "in use by pid"),
    ],
    "data": [
        ("", 2, "COMMAND"),
        ("prepare --input {tmp}/missing.txt --out {tmp}/o", 2, "missing.txt"),
        ("prepare --input {text} --out {file}/o", 2, "{file}"),
        ("prepare --input {tmp} --out {tmp}/o", 2, "not a file"),
        ("prepare --input {text} --tokenizer nope --out {tmp}/o", 2, "nope"),
        ("prepare --input {bad_utf8} --tokenizer bytes --out {tmp}/o", 2, "bad_utf8.txt"),
        ("prepare --input {text} --out {tmp}/o --val-fraction 1.5", 2, "--val-fraction"),
        ("prepare --input {text} --out {tmp}/o --workers 0", 2, "--workers"),
        ("train-bpe --input {text} --vocab-size 10 --out {tmp}/b", 2, "vocab_size 10"),
        ("train-bpe --input {text} --vocab-size 300 --out {file}/b", 2, "{file}"),
        ("download nope --out {tmp}/d", 2, "nope"),
        ("train-bpe --input {empty} --vocab-size 300 --out {tmp}/b2", 2, "vocab_size 300"),
        ("train-bpe --input {bad_utf8} --vocab-size 300 --out {tmp}/b3", 2, "bad_utf8.txt"),  # after a progress bar
        ("prepare --input {text} --out {locked}", 2, "in use by pid"),
    ],
    "generate": [
        ("--run {tmp}/missing --prompt x", 2, "missing"),
        ("--run {no_checkpoint} --prompt x", 2, "no_checkpoint"),
        ("--run {corrupt} --prompt x", 2, "corrupt"),
        ("--run {run} --prompt x --max-new-tokens -5", 2, "--max-new-tokens"),
        ("--run {run} --prompt x --top-p 0", 2, "--top-p"),
        ("--run {run} --prompt x --top-k -1", 2, "--top-k"),
        ("--run {run} --prompt x --temperature -1", 2, "--temperature"),
        ("--run {run} --prompt x --num-samples 0", 2, "--num-samples"),
        ("--run {run} --prompt-file {tmp}/missing.txt", 2, "missing.txt"),
        ("--run {run} --prompt x --set model.d_model=64", 2, "model.d_model"),
        ("--run {run} --prompt x --top-k abc", 2, "--top-k"),
        ("--prompt x", 2, "--run"),
    ],
    "bench": [
        ("model --batch 0 --context 16 --set model.d_model=32 --set model.num_heads=2", 2, "--batch"),
        ("model --context 0 --set model.d_model=32 --set model.num_heads=2", 2, "--context"),
        ("model --preset nope", 2, "nope"),
        ("decode --new-tokens x", 2, "--new-tokens"),
    ],
    "parity": [
        ("--steps -1", 2, "--steps"),
        ("--set model.d_modle=3", 2, "model.d_modle"),
        ("--seq 1000", 2, "--seq"),
        ("--device banana", 2, "--device"),
    ],
    "experiments": [
        ("run nope_plan", 2, "nope_plan"),
        ("run {bad_plan}", 2, "bogus"),
        ("run profiling --only zzz --dry-run", 2, "zzz"),
        ("report {tmp}/noplan", 2, "noplan"),
        ("run {lock_plan} --runs-dir {locked_runs} --draft", 2, "in use by pid"),
        ("gpu --budget 60", 2, "no GPU here"),
        ("gpu --smoke --out docs/results/gpu", 2, "--out docs/results/gpu"),
    ],
}
MODULES = {"train": "jaxlm.train", "data": "jaxlm.data", "generate": "jaxlm.generate", "bench": "jaxlm.bench",
           "parity": "parity.check", "experiments": None, "lora": "jaxlm.lora", "quantize": "jaxlm.quantize"}


def test_the_table_covers_every_cli_with_30_rows():
    assert sum(map(len, INVOCATIONS.values())) >= 30 and set(INVOCATIONS) == set(MODULES)


@pytest.fixture(scope="session")
def files(corpus, tmp_path_factory) -> Iterator[dict[str, str]]:
    """The broken inputs the table refers to, and a small trained run (checkpoints 2 and 4)."""
    from jaxlm.data.bpe import train_and_save
    from jaxlm.data.prepare import prepare
    from jaxlm.training.loop import train

    d = tmp_path_factory.mktemp("bad_inputs")
    run = d / "run"
    train(load_config(None, tiny_overrides(corpus, run, **{"train.steps": 4, "checkpoint.every": 2, "log.tensorboard": "false"})))
    f = {"tmp": d, "run": run, "corpus": corpus, "file": d / "a_file", "bad_toml": d / "bad.toml",
         "text": d / "text.txt", "bad_utf8": d / "bad_utf8.txt", "empty": d / "empty.txt", "bad_plan": d / "bad_plan.toml"}
    f["file"].write_text("not a directory")
    f["bad_toml"].write_text("[model\nd_model = ")
    f["text"].write_text("a little text to tokenise\n" * 50)
    f["bad_utf8"].write_bytes(b"\xff\xfe not utf-8")
    f["empty"].write_text("")
    f["bad_plan"].write_text('[[runs]]\nname = "x"\nbogus = 1\n')
    for name, change in {
        "no_train": lambda p: (p / "train.bin").unlink(),
        "short_val": lambda p: os.truncate(p / "val.bin", 40),
        "out_of_range": lambda p: (p / "train.bin").write_bytes(np.full(5000, 300, np.uint16).tobytes()),
    }.items():
        f[name] = d / name
        shutil.copytree(corpus, f[name])
        change(f[name])
    f["corrupt"] = d / "corrupt"
    shutil.copytree(run, f["corrupt"])
    for step in ("2", "4"):
        _truncate_checkpoint(f["corrupt"] / "checkpoints" / step)
    f["bad_config_run"] = d / "bad_config_run"
    shutil.copytree(run, f["bad_config_run"])
    (f["bad_config_run"] / "config.toml").write_text("[model\n")
    f["bpe"], f["bpe_data"] = d / "bpe", d / "bpe_data"  # same vocabulary size, other ids
    train_and_save([corpus / "corpus.txt"], 257, ["<|endoftext|>"], f["bpe"], progress=False)
    prepare([corpus / "corpus.txt"], str(f["bpe"]), f["bpe_data"], progress=False)
    f["no_checkpoint"] = d / "no_checkpoint"
    f["no_checkpoint"].mkdir()
    shutil.copy(run / "config.toml", f["no_checkpoint"])
    f["ckpt_file_run"] = d / "ckpt_file_run"  # checkpoints/ cannot be created: a file holds its name
    f["ckpt_file_run"].mkdir()
    (f["ckpt_file_run"] / "checkpoints").write_text("not a directory")
    f["edited"] = d / "edited"  # config.toml edited after the checkpoints were saved
    shutil.copytree(run, f["edited"])
    (f["edited"] / "config.toml").write_text((run / "config.toml").read_text().replace("d_model = 32", "d_model = 64"))
    f["locked"], f["locked_run"], f["locked_runs"] = d / "locked", d / "locked_run", d / "locked_runs"
    shutil.copytree(run, f["locked_run"])
    f["lock_plan"] = d / "lockplan.toml"
    f["lock_plan"].write_text('[defaults]\nkind = "command"\nargv = ["{python}", "-c", "pass"]\n[[runs]]\nname = "one"\n')
    holder = hold_locks(f["locked"], f["locked_run"], f["locked_runs"] / "lockplan")  # another live writer
    yield {k: str(v) for k, v in f.items()}
    holder.kill()
    holder.wait()


def _command(cli_name: str, args: str, files: dict, row: int) -> tuple[str, list[str]]:
    import shlex

    args = shlex.split(args.format(**files))
    if cli_name == "train":  # the tiny run's config, each row in its own out_dir unless it names one
        base = tiny_overrides(files["corpus"], f"{files['tmp']}/train-row-{row}")
        args = _sets(base) + args
    if cli_name == "experiments":
        return f"experiments.{args[0]}", args[1:]
    return MODULES[cli_name], args


@pytest.mark.parametrize("cli_name", list(INVOCATIONS))
def test_bad_invocations(cli_name, files, tmp_path):
    """Each row: its exit code, exactly one line starting with `error:` that names the culprit,
    no traceback. All rows of one CLI run in one process (tests/system/cli_harness.py)."""
    rows = INVOCATIONS[cli_name]
    commands = [_command(cli_name, args, files, i) for i, (args, _, _) in enumerate(rows)]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (tmp_path / "rows.json").write_text(json.dumps([[m, a, str(cwd)] for m, a in commands]))
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=8") if cli_name == "train" else _env()
    r = subprocess.run([PY, str(ROOT / "tests" / "system" / "cli_harness.py"), str(tmp_path / "rows.json"), str(tmp_path / "out.json")],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    failures = []
    for (module, args), (_, code, culprit), got in zip(commands, rows, json.loads((tmp_path / "out.json").read_text())):
        culprit = culprit.format(**files)
        errors = [line for line in got["stderr"].splitlines() if line.startswith("error:")]
        ok = got["code"] == code and len(errors) == 1 and culprit in errors[0] and "Traceback" not in got["stderr"]
        if not ok:
            failures.append(f"python -m {module} {' '.join(args)}\n  exit {got['code']} (want {code}), "
                            f"culprit {culprit!r}, stderr:\n  " + "\n  ".join(got["stderr"].splitlines()[-6:]))
    assert not failures, f"{len(failures)} of {len(rows)} rows:\n" + "\n".join(failures)
