"""Writing files so that a reader never sees half of one, reading JSON back, and
checking a directory can be written before any work starts.

`atomic_path` yields a temporary name beside the target and renames it into
place only when the block finishes; on an exception the temporary file is
removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Write to the yielded path; it replaces `path` when the block succeeds, and is removed when it fails."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    with atomic_path(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Atomically, indented, NaN written as NaN (read back by `read_json`)."""
    return atomic_write(path, json.dumps(data, indent=1, default=str, allow_nan=True) + "\n")


_REQUIRED = object()


def read_json(path: str | os.PathLike, default: Any = _REQUIRED) -> Any:
    """The parsed file; `default` (when given) if the file is missing or not valid JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        if default is _REQUIRED:
            raise
        return default


def path_problem(path: str | os.PathLike) -> str | None:
    """Why nothing can ever be at `path` (it runs through a symbolic-link loop, or a name in it or the whole of it
    is longer than the file system allows), or None. Resolving such a path raises RuntimeError or OSError."""
    path, too_long = Path(path).absolute(), errno.ENAMETOOLONG
    longest = max((len(os.fsencode(part)) for part in path.parts), default=0)
    try:
        if longest > os.pathconf("/", "PC_NAME_MAX"):
            return f"a name in it is {longest:,} bytes long, more than a file system allows ({os.strerror(too_long)})"
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"it runs through a symbolic link loop ({e.strerror})"
        if e.errno == too_long:
            return f"it is {len(os.fsencode(str(path))):,} bytes long, more than the system allows ({e.strerror})"
    return None


def write_cause(e: BaseException) -> str:
    """Why a write failed, in words: an OSError's, else an errno in the message (TensorStore's os_error_code,
    the safetensors library's "(os error 28)"), else the first line."""
    for err in (e, e.__cause__, e.__context__):
        if isinstance(err, OSError) and err.strerror:
            return f"{err.strerror} ({err.filename or type(err).__name__})"
    code = re.search(r"os_error_code='?(\d+)|os error (\d+)", str(e))
    if code:
        errno = code.group(1) or code.group(2)
        return f"{os.strerror(int(errno))} (errno {errno})"
    line = next((part.strip() for part in str(e).splitlines() if part.strip()), "")
    return f"{type(e).__name__}: {line.split('. See ')[0][:160]}"


def writable_dir_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be used (created, then written) as a directory, or None when it can.

    Creates nothing: the nearest existing ancestor must be a writable directory,
    which a short-lived anonymous file proves (permission bits alone say nothing to root).
    """
    if problem := path_problem(path):
        return problem
    path = Path(path).absolute()
    probe = path
    try:
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        if not probe.is_dir():
            return f"{probe} is a file, not a directory"
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        return f"{probe} is not writable ({e.strerror or e})"
    return None


def writable_file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be written as a file (atomically, beside its old version), or None when it can;
    creates nothing (checked before long work whose result goes there)."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory"
    if not path.parent.is_dir():
        return f"{path.parent} is not a directory" if path.parent.exists() else f"{path.parent} does not exist"
    return writable_dir_problem(path.parent)


def write_between_markers(path: str | os.PathLike, text: str, begin: str, end: str) -> Path:
    """Replace what lies between the lines `begin` and `end` in `path` with `text` (or append the block)."""
    path = Path(path)
    block = f"{begin}\n{text}\n{end}"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = (old.rstrip() + "\n\n" if old else "") + block + "\n"
    return atomic_write(path, new)
