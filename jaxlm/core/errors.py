"""The errors a user can fix: each one's message names the culprit (a key, a file, a value).

Every command runs under `jaxlm.cli.run`, which prints a `UserError` on one line
(``error: <culprit>: <what went wrong>; <what to do>``) and exits with its
`exit_code`; anything else is a bug and gets a short line plus a traceback file
(`write_traceback`: RUN/error.log when the command has a run directory).
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import traceback
from pathlib import Path

TRACEBACK_FILE = "error.log"  # in the run directory, when the command has one


class UserError(Exception):
    """An expected failure; `exit_code` 2 = bad input (fix the command), 1 = runtime failure."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the key."""


class UsageError(UserError):
    """A command-line flag is unknown, missing or has an invalid value; the message names the flag."""


class DataError(UserError):
    """A data file, corpus or tokenizer file is missing or malformed; the message names the file."""


class CorpusMissing(DataError):
    """A named corpus is not in the data root; `name` is the corpus, for callers that only preview (a dry run)."""

    def __init__(self, message: str, name: str):
        super().__init__(message)
        self.name = name


class CheckpointError(UserError):
    """A run or checkpoint directory is missing, incompatible or cannot be restored."""


class TrainingDiverged(UserError):
    """The loss or the parameter norm became NaN or infinite."""

    exit_code = 1


class MissingExtra(UserError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""

    exit_code = 1


class InternalError(UserError):
    """An unexpected exception, already logged with its traceback; the message says where."""

    exit_code = 1


class DirectoryInUse(UserError):
    """Another process holds the directory's lock (jaxlm.core.lock); the message names it."""


class OutOfMemory(UserError):
    """An allocation failed (host or device); the message names the limits set on the process."""

    exit_code = 1


class WriteFailed(UserError):
    """A file could not be written (disk full, quota, permission); the message names the file and the cause."""

    exit_code = 1


def write_traceback(run_dir: str | Path | None = None) -> Path | None:
    """Append the exception being handled to RUN/error.log (else a new temp file); its path, or None."""
    text = (f"--- {datetime.datetime.now().isoformat(timespec='seconds')} pid {os.getpid()}: "
            f"{' '.join(sys.argv)}\n{traceback.format_exc()}\n")
    if run_dir is not None:
        try:  # a run directory that cannot be (a symbolic link loop, a name too long) gets none
            with open(Path(run_dir) / TRACEBACK_FILE, "a") as f:
                f.write(text)
            return Path(run_dir) / TRACEBACK_FILE
        except OSError:
            pass
    try:
        fd, name = tempfile.mkstemp(prefix="jaxlm-", suffix="-traceback.log")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return Path(name)
    except OSError:
        return None
