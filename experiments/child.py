"""A plan run's child process: wait for it (with its peak memory), pass a stop on to it, kill it.

The child runs in its own session, so a terminal's Ctrl-C reaches only the runner, which passes it (and a SIGTERM)
on with `stop` and waits for the child, however long a training run's last checkpoint takes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import suppress


def wait(proc: subprocess.Popen, timeout: float | None) -> tuple[int, int | None]:
    """Wait for the child like Popen.wait, also returning its peak resident memory (bytes, from wait4)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.01
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss * 1024  # Linux reports KiB
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to the child's process group (it was started in its own session), unless it is gone."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM to the child (a training run saves a checkpoint and stops) and wait for it, however long its save
    takes; a second signal to the runner kills it at once. Returns its exit code."""
    try:
        _signal(proc, signal.SIGTERM)
        return proc.wait()
    except KeyboardInterrupt:
        print("second signal: killing the run without waiting for its checkpoint", file=sys.stderr, flush=True)
        _signal(proc, signal.SIGKILL)
        return proc.wait()


def kill(proc: subprocess.Popen) -> None:
    """Stop the child's whole process group: SIGTERM, then SIGKILL after 20 s."""
    _signal(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()
