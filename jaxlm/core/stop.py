"""SIGTERM and Ctrl-C as a flag a long command checks at safe points.

Python turns SIGINT into a KeyboardInterrupt wherever the main thread is; inside a
callback from JAX's C++ (tracing, compiling, loading a plugin) it is swallowed (the
run goes on) or crashes the process. Under `StopFlag` the first SIGTERM / SIGINT only
sets `signal`: start-up stages call `check`, which stops with one line before any
work is done, and the training loop saves a checkpoint and stops. A second SIGINT
stops at once: each `on_abort` callback says what was left (and releases what it
holds), one line is printed and the process exits 130.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

_caught = False  # a StopFlag of this process caught a signal (jaxlm.cli.run reads it as the process exits)


def caught_signal() -> bool:
    return _caught


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal, at a safe point; the message says what was and was not done."""


class StopFlag:
    """Installs the handlers on enter (main thread only) and restores the previous ones on exit."""

    def __init__(self):
        self.signal: str | None = None
        self.on_abort: list[Callable[[], str]] = []
        self._old = {}

    def _handler(self, signum, frame):
        global _caught
        if self.signal is not None and signum == signal.SIGINT:
            self.abort()
        _caught = True
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
