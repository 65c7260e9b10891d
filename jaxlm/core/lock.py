"""One writer per directory: a lock file beside it, held with `flock` and naming its holder.

    with DirLock("runs/x", "train.out_dir = 'runs/x'"):
        ...  # runs/.x.lock holds {"host", "pid", "command", "since"}
    with DirLock("runs/x", "runs/x", shared=True):
        ...  # a reader: refused while a writer holds it, beside other readers

The file is always PARENT/.NAME.lock, whatever the permissions, so every process finds the
same one; it sits beside the directory, not in it, so taking the lock creates nothing a
failed start has to clean up (only missing parent directories, removed again on release when
still empty), and a directory built elsewhere and renamed into place (`jaxlm.data prepare`) is
covered too. A writer that cannot create it is refused in one line saying how to make it.

A second writer gets one `DirectoryInUse` line naming the directory and the holder's pid, host and
program (or that readers hold it); a lock file that cannot be made is refused with its real cause
(a read-only file system, no permission). The kernel drops a `flock` when its process dies, so the file of
a killed holder (kill -9, a crash) still names it but is not locked: the next writer takes
it over with a warning when it names this host. A file naming another host is refused: a
`flock` is not always seen across hosts (some network file systems keep it local), so that
holder may be alive; deleting the file is the override. A reader (`shared=True`: quantize,
lora merge) does not write its name into the file, and needs none where none can be created
(a read-only run: no process with its rights can write it either).

`new_directory` is how a command writes a new directory in one go (an import, an export, a merge): locked,
marked INCOMPLETE until it is done, removed when it fails or is interrupted. A kill -9 leaves the mark, which
readers report (`unfinished`) and which the same command run again replaces.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shlex
import shutil
import socket
import sys
from pathlib import Path
from typing import Iterator

from jaxlm.core import stop
from jaxlm.core.errors import DirectoryInUse, UsageError
from jaxlm.core.files import writable_dir_problem

INCOMPLETE = "INCOMPLETE"  # in a directory `new_directory` is writing: the command writing it


def lock_path(directory: str | os.PathLike) -> Path:
    """PARENT/.NAME.lock for PARENT/NAME (symbolic links resolved, so every spelling shares one file)."""
    d = Path(directory).resolve()
    return d.parent / f".{d.name}.lock"


def _program() -> str:
    """`python -m jaxlm.train` (the module run as __main__), else `python SCRIPT` or `python -c`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return f"python -m {spec.name.removesuffix('.__main__')}"
    return f"python {Path(sys.argv[0]).name if sys.argv and sys.argv[0] else '-c'}"


def _holder(directory: Path) -> dict:
    """What the lock file says of its holder: who, where, since when, and its whole command (for a reader of the
    file; a refusal quotes the program and the directory, which a long command line would push out of view)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "program": _program(), "directory": str(directory),
            "command": " ".join(sys.argv)[:2000], "since": datetime.datetime.now().isoformat(timespec="seconds")}


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} since {holder.get('since', '?')} "
            f"({holder.get('program') or 'an unknown program'})")


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 1 << 16).decode("utf-8", "replace")
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"command": text.strip()[:100]} if text.strip() else {}
    return holder if isinstance(holder, dict) else {}


class DirLock:
    """A lock on `directory` for this process, exclusive (a writer) or `shared` (a reader); `culprit` starts
    the refusal line (a key or a flag)."""

    def __init__(self, directory: str | os.PathLike, culprit: str, shared: bool = False):
        self.path, self.culprit, self.shared = lock_path(directory), culprit, shared
        self.directory = Path(directory).resolve()
        if Path(directory).resolve().parent == Path(directory).resolve():
            raise UsageError(f"{culprit}: {directory} is the file system's root; choose a directory inside it")
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
            if fd is None:  # a reader where the file cannot be made: nothing with this process's rights writes here
                return self
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                self._refuse(fd)
            if self._same_file(fd):
                self._fd = fd
            else:  # the previous holder removed the file between our open and our flock: take the new one
                os.close(fd)
        if not self.shared:
            self._take_over(_read(self._fd))
        return self

    def _open(self) -> int | None:
        errors = []
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):  # flock needs no write access
            try:
                return os.open(self.path, flags, 0o644)
            except OSError as e:
                errors.append(e)
        if self.shared and not self.path.exists():
            return None
        self._remove_created()  # the cause: why it could not be made (read-only, no permission), not ENOENT after it
        error = next((e for e in errors if e.errno != errno.ENOENT), errors[0])
        raise UsageError(f"{self.culprit}: cannot create the lock file {self.path} ({error.strerror or error}); it "
                         f"sits beside the directory so that every process finds it: make {self.path.parent} "
                         "writable, or create the file once, writable by every user of the directory") from None

    def _refuse(self, fd: int) -> None:
        holder, readers = _read(fd), False
        if not self.shared:  # only readers (shared holders) let a shared request through
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                readers = True
            except BlockingIOError:
                pass
        os.close(fd)
        self._remove_created()
        who = "another process reading it (jaxlm.quantize, jaxlm.lora merge)" if readers else _describe(holder)
        raise DirectoryInUse(f"{self.culprit}: {self.directory} is in use by {who}, which holds {self.path}; wait for "
                             "it to finish or stop it, or choose another directory") from None

    def _take_over(self, stale: dict) -> None:
        """Write this holder into the file: a stale one of this host is named in a warning; one of another
        host is refused (its process may be alive there), unless the user deletes the file."""
        if stale.get("host") not in (None, socket.gethostname()):
            os.close(self._fd)  # the file stays: it is the other host's
            self._fd = None
            self._remove_created()
            raise DirectoryInUse(f"{self.culprit}: {self.path} names {_describe(stale)}, which this host cannot "
                                 f"check (a lock is not always seen across hosts); if that process is gone, delete "
                                 f"{self.path} and run again")
        if stale:
            print(f"warning: {self.path}: took over the lock of {_describe(stale)}, which no longer holds it "
                  "(stopped without releasing it)", file=sys.stderr)
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, (json.dumps(_holder(self.directory)) + "\n").encode(), 0)
        except OSError:  # a file opened read-only (made writable by no one here): locked, though not named
            pass

    def _same_file(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Remove the file while holding it exclusively (so no one takes a file about to vanish), then unlock;
        a reader removes it only when no other process holds it."""
        if self._fd is None:
            self._remove_created()
            return
        try:
            if self.shared:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.path.unlink(missing_ok=True)
        except OSError:  # another reader holds it, or the directory cannot be written: the file stays
            pass
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


def unfinished(directory: str | os.PathLike) -> str | None:
    """The command that left `directory` unfinished (killed while `new_directory` wrote it), or None."""
    try:
        return (Path(directory) / INCOMPLETE).read_text(errors="replace").strip() or "an earlier command"
    except OSError:  # no mark (or no directory): not an unfinished one
        return None


def _command() -> str:
    """This process's command line as the user typed it (`python -m jaxlm.hf import ...`)."""
    argv = sys.orig_argv[1:] if stop.started_as_command() else sys.argv
    return shlex.join(["python", *argv])


@contextlib.contextmanager
def new_directory(out: Path, culprit: str) -> Iterator[Path]:
    """`out` (new, empty, or left unfinished by an interrupted command) written by this process alone: locked,
    marked INCOMPLETE until the block ends, removed when the block fails or is interrupted (the interrupt's line
    says so). `culprit` (the flag) starts every refusal."""
    problem = writable_dir_problem(out)
    if problem:
        raise UsageError(f"{culprit}: {problem}; choose a new directory")
    with DirLock(out, culprit):
        left = unfinished(out)
        if left is None and out.is_dir() and any(out.iterdir()):
            raise UsageError(f"{culprit}: exists and is not empty; choose a new directory")
        if left is not None:
            print(f"warning: {culprit}: replacing what an interrupted `{left}` left unfinished there", file=sys.stderr)
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / INCOMPLETE).write_text(_command() + "\n")
        with stop.noting(lambda: f"{culprit}: the unfinished directory was removed; run the same command again"):
            try:
                yield out
            except BaseException:
                shutil.rmtree(out, ignore_errors=True)
                raise
        (out / INCOMPLETE).unlink()
