"""The errors a user can fix: each one's message names the culprit (a key, a file, a value).

Every command catches `UserError` at its boundary and prints it on one line;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """An expected failure caused by the input; `exit_code` 2 = bad input, 1 = runtime failure."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the key."""


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
