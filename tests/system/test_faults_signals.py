"""Signals, pipes and the error boundary: a closed stdout ends every command quietly; Ctrl-C during start-up is one
line and exit 130 (never a crash, a traceback or a run that goes on); a signal during training's start-up stops
before the first step and the previous handlers come back; a Ctrl-C in training is one true line; SIGTERM to
`experiments.run` stops the run in progress the same way and records it as interrupted; a second Ctrl-C names an
orbax temporary directory on disk; an unexpected exception is one line with a traceback file."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from jaxlm import cli
from jaxlm.core import stop
from tests.system.fault_helpers import COMMANDS, PY, last_train_step, sets
from tests.train_helpers import ROOT, env, make_corpus, tiny_overrides

# --------------------------------------------------------------------------- | head

HELP = {m: COMMANDS[m] for m in ("jaxlm.train", "deliverables.report", "jaxlm.data")}
EVERY = COMMANDS


def _into_a_closed_pipe(module: str, args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """`python -m module args | head -0`: the reader is gone before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([PY, "-m", module, *args], stdout=write, stderr=subprocess.PIPE, text=True,
                              env=env(TMPDIR=str(tmp)), timeout=300)
    finally:
        os.close(write)


@pytest.mark.parametrize("commands", [pytest.param(HELP, id="three"),
                                      pytest.param(COMMANDS, id="every", marks=pytest.mark.extended)])
def test_a_closed_pipe_ends_every_command_quietly(commands, tmp_path):
    """As `yes | head`: exit 141 (128 + SIGPIPE), nothing on stderr, no traceback file."""
    got = {m: _into_a_closed_pipe(m, args, tmp_path) for m, args in commands.items()}
    bad = {m: (r.returncode, r.stderr[-500:]) for m, r in got.items() if r.returncode != 141 or r.stderr}
    assert not bad, bad
    assert not list(tmp_path.glob("jaxlm-*")), list(tmp_path.iterdir())


# --------------------------------------------------------------------------- Ctrl-C during start-up


def test_a_ctrl_c_before_main_is_held_and_one_in_a_gc_callback_is_sent_again(monkeypatch):
    """The handler a command gets from its first import of jaxlm: held until `jaxlm.cli.run` starts main (JAX's
    plugin loader swallowed it, a KeyboardInterrupt at import printed a traceback), sent again when it lands in a
    garbage-collector or weak-reference callback (printed and dropped there: the command went on), else a
    KeyboardInterrupt."""
    import gc

    monkeypatch.setattr(stop, "_state", {"armed": False, "pending": None})
    stop._deferred_interrupt(signal.SIGINT, sys._getframe())
    assert stop.arm() == "SIGINT"
    sent = []
    monkeypatch.setattr(stop.threading, "Timer", lambda delay, fn, args: SimpleNamespace(
        start=lambda: sent.append((delay, args)), daemon=False))

    def callback(phase, info):
        stop._deferred_interrupt(signal.SIGINT, sys._getframe())

    gc.callbacks.append(callback)
    try:
        callback("start", {})
    finally:
        gc.callbacks.remove(callback)
    assert sent == [(stop.RETRY_S, (os.getpid(), signal.SIGINT))]
    in_weakref = {}  # a frame of the standard library's weakref.py (a WeakValueDictionary's `remove` callback)
    exec(compile("def remove(): deferred(2, sys._getframe())", f"{os.path.dirname(os.__file__)}/weakref.py", "exec"),
         {"deferred": stop._deferred_interrupt, "sys": sys}, in_weakref)
    in_weakref["remove"]()
    assert sent == [(stop.RETRY_S, (os.getpid(), signal.SIGINT))] * 2
    with pytest.raises(KeyboardInterrupt):
        stop._deferred_interrupt(signal.SIGINT, sys._getframe())


def test_a_signal_within_jax_code_is_sent_again_until_it_lands_in_the_command(monkeypatch):
    """While JAX traces (its C++ calling back into Python) the interrupt is not raised but sent again: raised there
    it unwinds through C++ (generate died of SIGSEGV); back in the command's own code it is raised."""
    import jax

    monkeypatch.setattr(stop, "_state", {"armed": True, "pending": None})
    sent = []
    monkeypatch.setattr(stop.threading, "Timer", lambda delay, fn, args: SimpleNamespace(
        start=lambda: sent.append((delay, args)), daemon=False))

    def traced(x):
        stop._deferred_interrupt(signal.SIGTERM, sys._getframe())  # as if SIGTERM came in mid-trace
        return x + 1

    assert int(jax.jit(traced)(1)) == 2
    assert sent == [(stop.RETRY_S, (os.getpid(), signal.SIGTERM))]
    with pytest.raises(stop.Interrupted):
        stop._deferred_interrupt(signal.SIGTERM, sys._getframe())


def _interrupt_at(args: list[str], delay: float, sig: signal.Signals = signal.SIGINT) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([PY, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in env().items() if k != "JAX_PLATFORMS"})  # as a user starts it
    time.sleep(delay)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from jaxlm.core.config import load_config
    from jaxlm.training.loop import train

    d = tmp_path_factory.mktemp("signals")
    run = d / "run"
    train(load_config(None, tiny_overrides(make_corpus(d / "corpus"), run, **{
        "train.steps": 2, "checkpoint.every": 2, "log.tensorboard": "false"})))
    return run


@pytest.mark.parametrize("tries", [pytest.param((2, 1), id="three"),
                                   pytest.param((6, 3), id="nine", marks=pytest.mark.extended)])
def test_ctrl_c_at_random_moments_of_start_up_is_one_line(tries, small_run, tmp_path):
    """generate (it crashed in 5 of 10 tries at 3-4 s) and deliverables.report, interrupted by Ctrl-C or SIGTERM
    (it died of the signal) at random moments: exit 130 or 143 with one `interrupted:` line naming the signal, or
    0 when the work was done first; never a signal's death, a traceback or a KeyboardInterrupt printed."""
    seed = random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    commands = [["jaxlm.generate", "--run", str(small_run), "--prompt", "x", "--max-new-tokens", "100"]] * tries[0] + [
        ["deliverables.report", str(small_run), "--out", str(tmp_path / "report")]] * tries[1]
    for args in commands:
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        r = _interrupt_at(args, rng.uniform(0.3, 6.0), sig)
        why = f"seed {seed}: {sig.name} to {args[0]}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert r.returncode in (0, 128 + sig) and "Traceback" not in r.stderr, why
        assert "KeyboardInterrupt" not in r.stderr and "Interrupted" not in r.stderr, why
        if r.returncode:
            assert r.stderr.strip().splitlines()[-1].startswith(f"interrupted: {sig.name}"), why


# --------------------------------------------------------------------------- signals during training


def test_a_signal_during_start_up_stops_before_the_first_step(corpus, tmp_path, capsys):
    """The signal is a flag (never a KeyboardInterrupt inside JAX): checked before the first step, one
    line, exit 130, nothing created and the lock released."""
    from jaxlm.cli import train as command

    run = tmp_path / "run"

    class SignalledDuringStartUp(stop.StopFlag):
        """SIGINT arrives during the last start-up stage (after the lock, the preflight and the compile)."""

        def check(self, stage):
            self.checks = getattr(self, "checks", 0) + 1
            self.signal = "SIGINT" if self.checks == 3 else None
            super().check(stage)

    real = stop.StopFlag
    command.StopFlag = SignalledDuringStartUp
    try:
        assert cli.run(command.main, sets(tiny_overrides(corpus, run))) == 130
    finally:
        command.StopFlag = real
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "interrupted: SIGINT before the first step: stopped; nothing was trained or saved", err
    assert not run.exists() and not (tmp_path / ".run.lock").exists()


def test_after_a_signal_the_previous_handlers_are_back():
    """In-process (a notebook, a test runner) a handled SIGTERM leaves Ctrl-C and SIGTERM as they were; only a
    command that exits ignores them (jaxlm.cli.run)."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with stop.StopFlag() as flag:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs in the main thread at the next bytecode
    assert flag.signal == "SIGTERM"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_after_the_command_ended_leaves_its_exit_code():
    """A Ctrl-C or SIGTERM while the interpreter exits after the command returned: the command's exit code, not a
    KeyboardInterrupt (or, late in the exit where Python restores SIGINT's default action, death by SIGINT)."""
    script = ("import os, signal, sys; from jaxlm import cli; sys.argv = ['cmd']; code = cli.run(lambda argv: 3); "
              "os.kill(os.getpid(), signal.SIGINT); os.kill(os.getpid(), signal.SIGTERM); sys.exit(code)")
    r = subprocess.run([PY, "-c", script], env=env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert (r.returncode, r.stderr) == (3, ""), r.stderr[-2000:]


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
    args = [PY, "-m", "jaxlm.train", *sets(tiny_overrides(corpus, run, **long))]
    proc = subprocess.Popen(args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if presses == 1:
        time.sleep(rng.uniform(1.0, 6.0))
    else:
        while proc.poll() is None and last_train_step(run) < 3:  # no time limit: start-up can take a minute
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
        assert last.startswith(("interrupted: SIGINT during start-up, before the command began; nothing was done",
                                "interrupted: SIGINT before the first step", "interrupted: SIGINT again")), why
        assert "stopped at step" not in out, why
        step = last.split("checkpoint ")[1].split(" ")[0] if "SIGINT again" in last and "checkpoint " in last else ""
        if step.isdigit():  # the claim is the truth
            assert (run / "checkpoints" / step).is_dir() == ("was saved" in last), why
    assert presses == 1 or proc.returncode == 130 or "stopped at step" in out, why
    assert not (tmp_path / ".run.lock").exists(), why

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


# --------------------------------------------------------------------------- SIGTERM to experiments.run

CHILD = textwrap.dedent("""
    import os, sys, time
    run_dir = sys.argv[1]
    os.makedirs(run_dir, exist_ok=True)
    open(os.path.join(run_dir, "..", "child.pid"), "w").write(str(os.getpid()))
    if os.path.exists(os.path.join(run_dir, "..", "BLOCK")):
        time.sleep(3600)
    """)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_sigterm_to_the_runner_stops_its_run_and_records_it(tmp_path):
    """It used to exit 143 with no line, leaving its child running as an orphan and no record."""
    (tmp_path / "child.py").write_text(CHILD)
    plan = tmp_path / "termplan.toml"
    plan.write_text(f'[defaults]\nkind = "command"\nargv = ["{{python}}", "{tmp_path / "child.py"}", "{{run_dir}}"]\n'
                    '[[runs]]\nname = "one"\n')
    runs = tmp_path / "runs" / "termplan"
    runs.mkdir(parents=True)
    (runs / "BLOCK").touch()
    cmd = [PY, "-m", "experiments.run", str(plan), "--runs-dir", str(tmp_path / "runs"), "--draft"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (runs / "child.pid").exists() and proc.poll() is None:
        time.sleep(0.1)
    child = int((runs / "child.pid").read_text())
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, out + err
    assert err.strip().splitlines()[-1].startswith("interrupted: SIGTERM"), err
    assert not _alive(child)
    assert json.loads((runs / "one" / "result.json").read_text())["status"] == "interrupted"
    (runs / "BLOCK").unlink()
    again = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    result = json.loads((runs / "one" / "result.json").read_text())
    assert result["status"] == "ok" and result["resumed"] is True


@pytest.mark.slow
def test_sigterm_to_the_runner_lets_its_training_run_save_and_resume(tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    (tmp_path / "tiny.toml").write_text("")
    keys = tiny_overrides(corpus, "unused", **{"train.steps": 400, "checkpoint.every": 400, "train.eval_every": 400,
                                               "optim.cosine_steps": 400, "log.every": 1})
    sets_ = "\n".join(f'"{k}" = {v}' for k, v in (o.split("=", 1) for o in keys) if k != "train.out_dir")
    plan = tmp_path / "trainplan.toml"
    plan.write_text(f'[defaults]\nkind = "train"\nconfig = "{tmp_path / "tiny.toml"}"\n[defaults.set]\n{sets_}\n'
                    '[[runs]]\nname = "t"\n')
    runs = tmp_path / "runs" / "trainplan"
    cmd = [PY, "-m", "experiments.run", str(plan), "--runs-dir", str(tmp_path / "runs"), "--draft"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = runs / "t" / "metrics.jsonl"
    while proc.poll() is None and not (metrics.exists() and metrics.read_text().count('"train"') >= 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, out + err
    result = json.loads((runs / "t" / "result.json").read_text())
    saved = sorted(int(p.name) for p in (runs / "t" / "checkpoints").iterdir() if p.name.isdigit())
    assert result["status"] == "interrupted" and result["returncode"] == 0 and saved, result
    assert "stopped at step" in (runs / "t" / "output.log").read_text()
    again = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resumed from {runs / 't' / 'checkpoints'}/{saved[-1]}" in (runs / "t" / "output.log").read_text()


# --------------------------------------------------------------------------- a second Ctrl-C


def test_a_second_ctrl_c_names_a_save_left_on_disk(tmp_path):
    """The save in flight is marked before orbax starts writing, and a temporary directory on disk is named: the
    note said "no checkpoint was being saved" while 12.orbax-checkpoint-tmp was there."""
    from jaxlm.core.config import CheckpointConfig
    from jaxlm.training.checkpoint import Checkpointer

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "12.orbax-checkpoint-tmp-1764200000").mkdir()
    note = Checkpointer.abort_note(SimpleNamespace(saving=None, dir=tmp_path / "checkpoints"))
    assert "was not completed" in note and "12.orbax-checkpoint-tmp-1764200000" in note, note

    ckpt = Checkpointer(tmp_path / "run", CheckpointConfig())
    seen = []
    ckpt.manager.save = lambda step, **kw: seen.append(ckpt.saving)
    try:
        ckpt.save(SimpleNamespace(as_dict=lambda: {}), {"step": 12})
    finally:
        ckpt.saving = None
        ckpt.close()
    assert seen == [12]
