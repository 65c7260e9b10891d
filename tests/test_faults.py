"""Fault injection: kill -9 and resume, damaged checkpoints, failed prepares, bad token files,
and a table of bad invocations across every CLI (exit code, one `error:` line naming the
culprit, no traceback)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxlm import cli
from jaxlm.core.config import load_config
from jaxlm.core.errors import CheckpointError, DataError
from tests.train_helpers import ROOT, make_corpus, tiny_overrides

# One worker runs this module, so its trained fixtures (corpus, reference run, broken inputs) are built once.
pytestmark = pytest.mark.xdist_group("faults")

PY = sys.executable
HELPERS = str(ROOT / "tests" / "train_helpers.py")
# Checkpoints every 3 steps (the newest 2 kept), dropout on (its RNG stream is state too),
# a fixed cosine length (the schedule does not depend on train.steps), a metrics row per step.
RUN = {"train.steps": 30, "checkpoint.every": 3, "optim.cosine_steps": 40, "train.eval_every": 10,
       "model.dropout": 0.1}


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


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
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
    ],
    "lora": [
        ("merge {run} --out {tmp}/merged", 2, "not a LoRA run"),
        ("merge {tmp}/missing --out {tmp}/merged2", 2, "missing"),
        ("merge {run} --out {file}", 2, "a_file"),
    ],
    "quantize": [
        ("{run} --bits 3", 2, "--bits 3"),
        ("{tmp}/missing", 2, "missing"),
        ("{run} --batches 0", 2, "--batches"),
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
    ],
    "bench": [
        ("model --batch 0 --context 16 --set model.d_model=32 --set model.num_heads=2", 2, "--batch"),
        ("model --context 0 --set model.d_model=32 --set model.num_heads=2", 2, "--context"),
        ("model --preset nope", 2, "nope"),
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
        ("gpu --budget 60", 2, "no GPU here"),
        ("gpu --smoke --out docs/results/gpu", 2, "--out docs/results/gpu"),
    ],
}
MODULES = {"train": "jaxlm.train", "data": "jaxlm.data", "generate": "jaxlm.generate", "bench": "jaxlm.bench",
           "parity": "parity.check", "experiments": None, "lora": "jaxlm.lora", "quantize": "jaxlm.quantize"}


def test_the_table_covers_every_cli_with_30_rows():
    assert sum(map(len, INVOCATIONS.values())) >= 30 and set(INVOCATIONS) == set(MODULES)


@pytest.fixture(scope="module")
def files(corpus, tmp_path_factory) -> dict[str, str]:
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
    return {k: str(v) for k, v in f.items()}


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
    no traceback. All rows of one CLI run in one process (tests/cli_harness.py)."""
    rows = INVOCATIONS[cli_name]
    commands = [_command(cli_name, args, files, i) for i, (args, _, _) in enumerate(rows)]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (tmp_path / "rows.json").write_text(json.dumps([[m, a, str(cwd)] for m, a in commands]))
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=8") if cli_name == "train" else _env()
    r = subprocess.run([PY, str(ROOT / "tests" / "cli_harness.py"), str(tmp_path / "rows.json"), str(tmp_path / "out.json")],
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
