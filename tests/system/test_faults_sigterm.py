"""SIGTERM to any command takes the path Ctrl-C takes (issue 46, items 8 and 9): one `interrupted: SIGTERM` line,
exit 143 (128 + 15), no traceback and no lock file left; a half-written output is removed (an import, an export, a
merge) or named (a report's folder without its report.md). After kill -9 an unfinished import is named as such by
the commands that read it, and running the import again replaces it. The signal comes from inside the command at
a chosen moment (`tests/train_helpers.py signal-at`, a real SIGTERM to the process), so no test waits on time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from jaxlm.core.config import load_config
from tests.system.fault_helpers import COMMANDS, HELPERS, PY, env, one_error, rows, run_rows
from tests.train_helpers import make_corpus, needs, tiny_overrides

pytestmark = pytest.mark.xdist_group("faults_sigterm")  # one worker trains the runs they share
CKPT = "jaxlm.training.checkpoint"
# name: (command and its arguments, where the signal lands, the output that must not stay, a note the line adds)
WRITERS = {
    "generate": (["jaxlm.generate", "--run", "{run}", "--prompt", "x"], f"{CKPT}:restore_for_inference", None, ""),
    "quantize": (["jaxlm.quantize", "{run}", "--bits", "8"], f"{CKPT}:restore_for_inference", None, ""),
    "lora merge": (["jaxlm.lora", "merge", "{lora}", "--out", "{out}"], f"{CKPT}:restore_for_inference", "{out}",
                   "the unfinished directory was removed"),
    "hf import": (["jaxlm.hf", "import", "{hf}", "--out", "{out}"], f"{CKPT}:Checkpointer.save", "{out}",
                  "the unfinished directory was removed"),
    "hf export": (["jaxlm.hf", "export", "{run}", "--out", "{out}"], "jaxlm.hf.weights:write_tensors", "{out}",
                  "the unfinished directory was removed"),
    "report": (["deliverables.report", "{run}", "--out", "{out}"], "deliverables.report.run_page:sample", None,
               "report.md was not written"),
}
NEEDS_HF = ("hf import", "hf export")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A trained run and a LoRA run of the tiny model."""
    from jaxlm.training.loop import train

    d = tmp_path_factory.mktemp("sigterm")
    corpus = make_corpus(d / "corpus")
    short = {"train.steps": 2, "checkpoint.every": 2, "log.tensorboard": "false"}
    train(load_config(None, tiny_overrides(corpus, d / "run", **short)))
    train(load_config(None, tiny_overrides(corpus, d / "lora", **short, **{"lora.rank": 2})))
    return {"dir": d, "run": d / "run", "lora": d / "lora", "corpus": corpus}


@pytest.fixture(scope="module")
def hf(made) -> Path:
    """The trained run exported as a Hugging Face checkpoint: a source to import."""
    from jaxlm.hf.convert import export_run

    export_run(str(made["run"]), made["dir"] / "hf")
    return made["dir"] / "hf"


def _signalled(signame: str, point: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([PY, HELPERS, "signal-at", signame, point, *argv], env=env(), capture_output=True,
                          text=True, timeout=600)


def _locks(*dirs: Path) -> list[str]:
    return [str(p) for d in dirs for p in d.glob(".*.lock")]


@pytest.mark.parametrize("name", [pytest.param(n, marks=needs("hf")) if n in NEEDS_HF else n for n in WRITERS])
def test_sigterm_is_one_line_exit_143_and_leaves_nothing_half_done(name, made, request, tmp_path):
    """They died by the signal (-15): no line, a lock file left beside the run or --out, a half-written --out that
    the next run refused, a report folder of figures without report.md and no word about it."""
    argv, point, gone, note = WRITERS[name]
    where = {"run": made["run"], "lora": made["lora"], "out": tmp_path / "out"}
    if name in NEEDS_HF:
        where["hf"] = request.getfixturevalue("hf")
    r = _signalled("SIGTERM", point, [a.format(**where) for a in argv])
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    why = f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}"
    assert r.returncode == 143 and last.startswith("interrupted: SIGTERM") and note in last, why
    assert "Traceback" not in r.stderr and not _locks(made["dir"], tmp_path), why
    if gone:
        assert not Path(gone.format(**where)).exists(), why
    if name == "report":
        assert not (tmp_path / "out" / "report.md").exists() and str(tmp_path / "out") in last, why


@pytest.mark.parametrize("commands", [pytest.param(("jaxlm.generate", "deliverables.report"), id="two"),
                                      pytest.param(tuple(COMMANDS), id="every", marks=pytest.mark.extended)])
def test_sigterm_while_any_command_reads_its_arguments(commands):
    """Every command, signalled as it parses its command line: the same one line and exit 143."""
    bad = {}
    for module in commands:
        r = _signalled("SIGTERM", "argparse:ArgumentParser.parse_known_args", [module, *COMMANDS[module]])
        lines = r.stderr.strip().splitlines()
        if r.returncode != 143 or lines[-1:] != ["interrupted: SIGTERM, stopped"] or "Traceback" in r.stderr:
            bad[module] = (r.returncode, r.stderr[-1000:])
    assert not bad, bad


@needs("hf")
def test_an_import_killed_by_kill_9_is_named_and_replaced_by_the_next(made, hf, tmp_path):
    """generate called the unfinished import "holds no checkpoint yet; train it first", and the import run again
    refused its --out ("exists and is not empty")."""
    out = tmp_path / "imported"
    killed = _signalled("SIGKILL", f"{CKPT}:Checkpointer.save", ["jaxlm.hf", "import", str(hf), "--out", str(out)])
    assert killed.returncode == -9 and (out / "INCOMPLETE").is_file(), killed.stderr[-2000:]
    generate = ("jaxlm.generate", ["--run", out, "--prompt", "x", "--max-new-tokens", "2"])
    before, again, after = run_rows([generate, ("jaxlm.hf", ["import", hf, "--out", out]), generate], tmp_path / "rows")
    command = f"python -m jaxlm.hf import {hf} --out {out}"
    assert one_error(before, 2, str(out), f"left unfinished by `{command}`", "run that command again") is None, \
        before["stderr"]
    assert again["code"] == 0 and f"replacing what an interrupted `{command}`" in again["stderr"], again["stderr"]
    assert after["code"] == 0 and not (out / "INCOMPLETE").exists(), after["stderr"][-2000:]
    assert not _locks(tmp_path)


def test_a_rerun_after_kill_9_during_the_first_save_logs_step_0_once(made, tmp_path):
    """Issue 46, item 20: the step-0 `params` row appeared twice in metrics.jsonl."""
    run = tmp_path / "run"
    argv = ["jaxlm.train", *sum((["--set", o] for o in tiny_overrides(made["corpus"], run, **{
        "train.steps": 4, "checkpoint.every": 2, "log.tensorboard": "false"})), [])]
    killed = _signalled("SIGKILL", f"{CKPT}:Checkpointer.save", argv)
    assert killed.returncode == -9 and len(rows(run, "params")) == 1, killed.stderr[-2000:]
    (again,) = run_rows([(argv[0], argv[1:])], tmp_path / "rows")
    assert again["code"] == 0, again["stderr"][-2000:]
    assert len(rows(run, "params")) == 1 and [r["step"] for r in rows(run, "train")] == [1, 2, 3, 4]


def test_a_new_checkpoint_directory_is_not_listed_in_the_background(tmp_path, monkeypatch):
    """An import signalled before its save removed --out while orbax's clean-up of a killed save's leftovers still
    listed out/checkpoints in a thread that only a save waits for: a FileNotFoundError traceback after the one line
    (about 1 run in 8 under load). A new directory has no leftovers to clean; an existing one still does."""
    from orbax.checkpoint._src.path import temporary_paths

    from jaxlm.core.config import CheckpointConfig
    from jaxlm.training.checkpoint import Checkpointer

    listed = []
    real = temporary_paths.cleanup_temporary_paths

    def recorded(directory, **kw):  # called as the manager is made; the coroutine it returns runs in a thread
        listed.append(Path(directory).name)
        return real(directory, **kw)

    monkeypatch.setattr(temporary_paths, "cleanup_temporary_paths", recorded)
    for _ in range(2):  # a new directory, then the same one again
        ckpt = Checkpointer(tmp_path / "run", CheckpointConfig())
        ckpt.close()
    assert listed == ["checkpoints"], listed
