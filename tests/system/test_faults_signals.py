"""Signals and the error boundary: a signal during start-up stops before the first step, handlers come back,
Ctrl-C is one true line, an unexpected exception is one line with a traceback file, an interrupt exits 130."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jaxlm import cli
from tests.system.fault_helpers import PY, env, last_train_step, sets
from tests.train_helpers import tiny_overrides

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
        assert cli.run(command.main, sets(tiny_overrides(corpus, run))) == 130
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
        assert last.startswith(("interrupted: SIGINT before the first step", "interrupted: SIGINT again")), why
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
