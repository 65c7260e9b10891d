"""One run of a plan (`RunSpec`), the fields a plan may give it, and their checks.

The plan format (experiments/plan.py) builds every run from these fields; the runner
(experiments/run.py), the commands (experiments/commands.py) and the estimates read them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from jaxlm.core.errors import ConfigError
from jaxlm.core.typedconfig import flatten_tree


class PlanError(ConfigError):
    """A plan file is malformed; the message names the file and the key."""


KINDS = ("train", "bench", "command")
# What each kind needs, and which requirement names the runner knows (see device.REQUIREMENTS).
REQUIREMENT_NAMES = ("gpu",)

# Fields of a run entry. `grid`, `sizes`, `only_sizes` and `name` are structural; the rest describe the run.
SPEC_KEYS = {
    "kind",  # train | bench | command
    "config",  # train: base config TOML
    "set",  # train / bench: dotted config overrides (`--set section.key=value`)
    "args",  # bench / command: CLI arguments {flag: value}
    "argv",  # command: the program and its arguments; {run_dir} and {python} are substituted, {seed} runs it per seed
    "requires",  # "gpu": skipped (with the reason recorded) where no GPU is present
    "reason",  # why the requirement exists, shown when skipped
    "tokens",  # train: token budget; sets train.steps = round(tokens / (batch_size * context_length))
    "timeout",  # seconds before the run is stopped and recorded as failed
    "env",  # extra environment variables
    "axes",  # explicit {axis: value} labels for the report (grid runs get them automatically)
    "note",  # free text carried into result.json
}


@dataclass(frozen=True)
class RunSpec:
    """One concrete run: what to execute and how the report should label it."""

    name: str
    kind: str
    config: str | None = None
    set: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    requires: str | None = None
    reason: str | None = None
    tokens: int | None = None
    timeout: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    axes: dict[str, Any] = field(default_factory=dict)
    note: str | None = None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @property
    def hash(self) -> str:
        """Identifies what the run computes: a changed spec means old results are stale."""
        keep = {k: v for k, v in self.to_dict().items() if k not in ("note", "timeout", "reason")}
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def check_keys(table: Any, allowed: set[str], where: str) -> dict:
    """`table` itself, once it is a table whose keys are all `allowed`; else a PlanError naming `where`."""
    if not isinstance(table, dict):
        raise PlanError(f"{where}: expected a table, got {table!r}")
    if unknown := [k for k in table if k not in allowed]:
        raise PlanError(f"{where}: unknown key '{unknown[0]}'; valid keys: {', '.join(sorted(allowed))}")
    return table


def normalise(entry: dict, where: str) -> dict:
    """Flatten `set` and check the types of the fields that have one."""
    out = dict(entry)
    if "set" in out:
        if not isinstance(out["set"], dict):
            raise PlanError(f"{where}.set: expected a table of overrides, got {out['set']!r}")
        out["set"] = flatten_tree(out["set"])
    for key in ("args", "env", "axes"):
        if key in out and not isinstance(out[key], dict):
            raise PlanError(f"{where}.{key}: expected a table, got {out[key]!r}")
    if "kind" in out and out["kind"] not in KINDS:
        raise PlanError(f"{where}.kind: {out['kind']!r} is not one of {', '.join(KINDS)}")
    if "requires" in out and out["requires"] not in REQUIREMENT_NAMES:
        raise PlanError(f"{where}.requires: {out['requires']!r} is not one of {', '.join(REQUIREMENT_NAMES)}")
    if "argv" in out and not (isinstance(out["argv"], list) and all(isinstance(a, str) for a in out["argv"])):
        raise PlanError(f"{where}.argv: expected a list of strings")
    for key in ("tokens", "timeout"):
        if key in out and (isinstance(out[key], bool) or not isinstance(out[key], (int, float)) or out[key] <= 0):
            raise PlanError(f"{where}.{key}: expected a positive number, got {out[key]!r}")
    return out


def to_spec(name: str, fields: dict, where: str) -> RunSpec:
    """The run of merged `fields`, once the fields its kind needs are there."""
    kind = fields.get("kind")
    if kind is None:
        raise PlanError(f"{where}: no 'kind' (set it in [defaults] or the run)")
    if kind == "train" and not fields.get("config"):
        raise PlanError(f"{where}: a train run needs 'config' (a base config TOML)")
    if kind == "train" and fields.get("args"):
        raise PlanError(f"{where}.args: a train run takes dotted 'set' overrides, not args {sorted(fields['args'])}")
    if kind == "command" and not fields.get("argv"):
        raise PlanError(f"{where}: a command run needs 'argv'")
    if fields.get("tokens") and kind != "train":
        raise PlanError(f"{where}.tokens: a token budget only applies to train runs")
    return RunSpec(name=name, kind=kind, config=fields.get("config"), set=dict(fields.get("set", {})),
                   args=dict(fields.get("args", {})), argv=list(fields.get("argv", [])),
                   requires=fields.get("requires"), reason=fields.get("reason"),
                   tokens=int(fields["tokens"]) if fields.get("tokens") else None, timeout=fields.get("timeout"),
                   env={k: str(v) for k, v in fields.get("env", {}).items()}, axes=dict(fields.get("axes", {})),
                   note=fields.get("note"))
