"""SIGTERM and Ctrl-C as a flag a long command checks at safe points, and Ctrl-C held until a command starts.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread is; inside a
callback from JAX's C++ (tracing, compiling, loading a plugin) it is swallowed (the
run goes on) or crashes the process (a segmentation fault, exit 139). Under `StopFlag`
the first SIGTERM / SIGINT only sets `signal`: start-up stages call `check`, which stops
with one line before any work is done, and the training loop saves a checkpoint and
stops. A second SIGINT stops at once: each `on_abort` callback says what was left (and
releases what it holds), one line is printed and the process exits 130.

Every other command gets `defer_interrupts` from its first import of jaxlm on (`python -m
jaxlm.train`, `experiments.run`, `parity.check`, ...): a Ctrl-C before the command's `main` starts (while
JAX and its plugins load, where JAX's plugin loader swallowed it) is held until
`jaxlm.cli.run` starts `main`, which then stops at once with one line (exit 130). Once
`main` runs, Ctrl-C is Python's KeyboardInterrupt, except that one landing in a
garbage-collector callback (JAX has one) or a finaliser, where Python would print and drop
it, is sent again 50 ms later; `jaxlm.cli.run` then leaves without the interpreter's exit,
which crashed (exit 139) after JAX was stopped mid-call.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from typing import Callable

COMMAND_PACKAGES = ("jaxlm", "experiments", "deliverables", "parity")  # `python -m` of a module of these: a command
RETRY_S = 0.05
_state = {"armed": False, "pending": None}  # the command's main is running; a signal held before it ran


def started_as_command() -> bool:
    """This process is `python -m` of one of this project's modules (not a library import, a notebook, pytest)."""
    argv = list(getattr(sys, "orig_argv", []))
    i = argv.index("-m") if "-m" in argv else -1
    return 0 <= i < len(argv) - 1 and argv[i + 1].partition(".")[0] in COMMAND_PACKAGES


def _unraisable(frame) -> bool:
    """The frame runs inside a garbage-collector callback (JAX registers one) or a finaliser, where Python prints
    an exception and goes on ("Exception ignored in ...")."""
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _deferred_interrupt(signum, frame) -> None:
    if not _state["armed"]:
        _state["pending"] = signal.Signals(signum).name
    elif _unraisable(frame):
        retry = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
        retry.daemon = True
        retry.start()
    else:
        raise KeyboardInterrupt


def defer_interrupts() -> None:
    """In a command's process, Ctrl-C held until its main starts and kept out of JAX's code (module docstring);
    where SIGINT has another handler than Python's own (a notebook's), nothing changes."""
    if (started_as_command() and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _deferred_interrupt)


def arm(armed: bool = True) -> str | None:
    """The command's main starts (later interrupts raise, outside JAX's code) or has ended (`armed` False: one
    arriving now is held, not raised into the interpreter's exit); returns a signal held before."""
    _state["armed"] = armed
    return _state["pending"]


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal, at a safe point; the message says what was and was not done."""


class StopFlag:
    """Installs the handlers on enter (main thread only) and restores the previous ones on exit."""

    def __init__(self):
        self.signal: str | None = None
        self.on_abort: list[Callable[[], str]] = []
        self._old = {}

    def _handler(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            self.abort()
        self.signal = self.signal or signal.Signals(signum).name

    def check(self, stage: str) -> None:
        """Stop (Interrupted) when a signal came in, before `stage` starts."""
        if self.signal is not None:
            raise Interrupted(f"{self.signal} before {stage}: stopped; nothing was trained or saved")

    def abort(self) -> None:
        notes = []
        for note in self.on_abort:
            try:
                notes.append(note())
            except Exception as e:  # a failing note must not keep the process alive
                notes.append(f"({type(e).__name__}: {e})")
        print("interrupted: SIGINT again, stopped at once" + "".join(f"; {n}" for n in notes if n), file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)

    def __enter__(self) -> "StopFlag":
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        """Restores the previous handlers (a process that goes on, a notebook, keeps its Ctrl-C; a command
        that stops ignores further signals while it exits: jaxlm.cli.run)."""
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}
