"""One writer per directory: a lock file beside it, held with `flock` and naming its holder.

    with DirLock("runs/x", "train.out_dir = 'runs/x'"):
        ...  # runs/.x.lock holds {"host", "pid", "command", "since"}

A second process asking for the same directory gets one `DirectoryInUse` line naming the
holder's pid, host and command. The kernel drops a `flock` when its process dies, so
the file of a killed holder (kill -9, a crash) still names it but is not locked: the
next writer takes it over with a warning. The file sits beside the directory, not in
it, so taking the lock creates nothing a failed start has to clean up (only missing
parent directories, removed again on release when still empty), and a directory
built elsewhere and renamed into place (`jaxlm.data prepare`) is covered too. Where
the parent cannot be written but the directory exists and can, the file is DIR/.lock.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from jaxlm.core.errors import DirectoryInUse, UsageError


def lock_path(directory: str | os.PathLike) -> Path:
    """PARENT/.NAME.lock for PARENT/NAME (symbolic links resolved, so every spelling shares one file);
    NAME/.lock when only the directory itself can be written."""
    d = Path(directory).resolve()
    beside = d.parent / f".{d.name}.lock"
    if d.is_dir() and d.parent.is_dir() and not os.access(d.parent, os.W_OK) and os.access(d, os.W_OK):
        return d / ".lock"
    return beside


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "command": " ".join(sys.argv)[:300],
            "since": datetime.datetime.now().isoformat(timespec="seconds")}


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('since', '?')} "
            f"({holder.get('command') or 'unknown command'})")


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 1 << 16).decode("utf-8", "replace")
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"command": text.strip()[:100]} if text.strip() else {}
    return holder if isinstance(holder, dict) else {}


class DirLock:
    """An exclusive lock on `directory` for this process; `culprit` starts the refusal line (a key or a flag)."""

    def __init__(self, directory: str | os.PathLike, culprit: str):
        self.path, self.culprit = lock_path(directory), culprit
        self._fd: int | None = None
        self._created: list[Path] = []

    def acquire(self) -> "DirLock":
        self._created = [p for p in reversed(self.path.parents) if not p.exists()]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"{self.culprit}: cannot create {self.path.parent} ({e.strerror or e})") from None
        while self._fd is None:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                self._remove_created()
                raise DirectoryInUse(f"{self.culprit}: in use by {_describe(holder)}, which holds {self.path}; wait "
                                     "for it to finish or stop it, or choose another directory") from None
            if self._same_file(fd):
                self._fd = fd
            else:  # the previous holder removed the file between our open and our flock: take the new one
                os.close(fd)
        stale = _read(self._fd)
        if stale:
            print(f"warning: {self.path}: took over the lock of {_describe(stale)}, which no longer holds it "
                  "(stopped without releasing it)", file=sys.stderr)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(_holder()) + "\n").encode(), 0)
        return self

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self._remove_created()
            raise UsageError(f"{self.culprit}: cannot create the lock file {self.path} ({e.strerror or e})") from None

    def _same_file(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the file (while still holding it, so no one takes a file about to vanish), then unlock."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None
            self._remove_created()

    def _remove_created(self) -> None:
        for d in reversed(self._created):  # innermost first, each only when still empty
            try:
                d.rmdir()
            except OSError:
                break
        self._created = []

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
