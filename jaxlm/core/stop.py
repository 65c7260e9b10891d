"""SIGTERM and Ctrl-C: one path for every command, a flag for the training loop, and nothing lost before main starts.

Every command gets `defer_interrupts` from its first import of jaxlm on (`python -m jaxlm.train`, or a module of
a package registered beside jaxlm: jaxlm.core.plugins): SIGTERM takes the path Ctrl-C takes. A signal
before the command's `main` starts (while JAX and its plugins load, where JAX's plugin loader swallowed Ctrl-C
and SIGTERM killed the process outright) is held until `jaxlm.cli.run` starts `main`, which then stops at once
with one line. Once `main` runs, either signal is an `Interrupted` (a KeyboardInterrupt naming the signal),
except that one landing in a garbage-collector callback (JAX has one) or a finaliser, where Python would print
and drop it, or while JAX traces or Orbax reads or writes a checkpoint (their C++ calling back into Python), is
sent again 50 ms later, until it lands where it can be raised. It unwinds the command like any exception, so locks are
released and a half-written output is removed (or marked: `jaxlm.core.lock.new_directory`); `jaxlm.cli.run` prints one
`interrupted:` line and exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM) without the
interpreter's exit, which crashed (exit 139) after JAX was stopped mid-call. `noting` adds what a command
left behind to that line.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread is; inside a callback from JAX's C++
(tracing, compiling, loading a plugin) it is swallowed (the run goes on) or crashes the process (exit 139).
Under `StopFlag` (the training loop) the first SIGTERM / SIGINT only sets `signal`: start-up stages call
`check`, which stops with one line before any work is done, and the training loop saves a checkpoint and
stops. A second SIGINT stops at once: each `on_abort` callback says what was left (and releases what it
holds), one line is printed and the process exits 130.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from typing import Callable, Iterator

from jaxlm.core import plugins

RETRY_S = 0.05
_state = {"armed": False, "pending": None}  # the command's main is running; a signal held before it ran


def started_as_command() -> bool:
    """This process is `python -m` of a module of jaxlm or of a package registered beside it (not a library import,
    a notebook, pytest)."""
    argv = list(getattr(sys, "orig_argv", []))
    i = argv.index("-m") if "-m" in argv else -1
    top = argv[i + 1].partition(".")[0] if 0 <= i < len(argv) - 1 else None
    return top == "jaxlm" or top is not None and top in plugins.packages()


# Packages whose C++ runs Python callbacks while it reads or writes a checkpoint: an exception raised in one unwinds
# through C++ not built for it.
NATIVE_IO = frozenset({"orbax", "tensorstore"})
WEAKREF_FILES = ("/weakref.py", "/_weakrefset.py")  # the weak-reference callbacks Python calls as an object dies


def _tracing() -> bool:
    """JAX is tracing a function (its C++ calling back into Python: an exception raised there crashed generate,
    exit -11). jax._src.core is private: without it, no trace is assumed."""
    core = sys.modules.get("jax._src.core")
    clean = getattr(core, "trace_state_clean", None)
    return clean is not None and not clean()


def _not_here(frame) -> bool:
    """The frame runs where an interrupt must not be raised: while JAX traces, within a checkpoint's I/O
    (NATIVE_IO), or inside a garbage-collector callback (JAX registers one), a weak-reference callback or a
    finaliser, where Python prints an exception and goes on ("Exception ignored in ...")."""
    if _tracing():
        return True
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__" or frame.f_code.co_filename.endswith(
                WEAKREF_FILES):
            return True
        if str(frame.f_globals.get("__name__", "")).partition(".")[0] in NATIVE_IO:
            return True
        frame = frame.f_back
    return False


def _deferred_interrupt(signum, frame) -> None:
    if not _state["armed"]:
        _state["pending"] = _state["pending"] or signal.Signals(signum).name
    elif _not_here(frame):
        retry = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
        retry.daemon = True
        retry.start()
    else:
        raise Interrupted("", signal.Signals(signum).name)


def defer_interrupts() -> None:
    """In a command's process, Ctrl-C and SIGTERM held until its main starts, then raised as `Interrupted` outside
    JAX's code (module docstring); a signal with another handler than Python's default (a notebook's Ctrl-C, a
    SIGTERM ignored by the parent) is left as it is."""
    if not (started_as_command() and threading.current_thread() is threading.main_thread()):
        return
    for s, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(s) == default:
            signal.signal(s, _deferred_interrupt)


def arm(armed: bool = True) -> str | None:
    """The command's main starts (later interrupts raise, outside JAX's code) or has ended (`armed` False: one
    arriving now is held, not raised into the interpreter's exit); returns a signal held before."""
    _state["armed"] = armed
    return _state["pending"]


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal (`signame`, SIGINT or SIGTERM); the message, when there is one, says what was
    and was not done."""

    def __init__(self, message: str = "", signame: str = "SIGINT"):
        super().__init__(message)
        self.signame = signame


def signal_name(e: BaseException) -> str:
    """The signal behind an interrupt: an Interrupted names it, a bare KeyboardInterrupt is Ctrl-C."""
    return getattr(e, "signame", "SIGINT")


def exit_code(e: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process the signal ended: 130 (SIGINT), 143 (SIGTERM)."""
    return 128 + signal.Signals[signal_name(e)]


@contextlib.contextmanager
def noting(note: Callable[[], str]) -> Iterator[None]:
    """An interrupt inside the block leaves with `note()` (what the command left behind, how to redo it) added
    to its one line."""
    try:
        yield
    except KeyboardInterrupt as e:
        said = str(e) or f"{signal_name(e)}, stopped"
        raise Interrupted(f"{said}; {note()}", signal_name(e)) from None


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
            raise Interrupted(f"{self.signal} before {stage}: stopped; nothing was trained or saved", self.signal)

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
