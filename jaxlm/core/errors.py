"""The errors a user can fix: each one's message names the culprit (a key, a file, a value).

Every command runs under `jaxlm.cli.run`, which prints a `UserError` on one line
(``error: <culprit>: <what went wrong>; <what to do>``) and exits with its
`exit_code`; anything else is a bug and gets a short line plus a traceback file.
"""

from __future__ import annotations


class UserError(Exception):
    """An expected failure; `exit_code` 2 = bad input (fix the command), 1 = runtime failure."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the key."""


class UsageError(UserError):
    """A command-line flag is unknown, missing or has an invalid value; the message names the flag."""


class DataError(UserError):
    """A data file, corpus or tokenizer file is missing or malformed; the message names the file."""


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
