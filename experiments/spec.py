"""One run of a plan (`RunSpec`): its fields, which are also the keys a plan may give a run, and their checks."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from jaxlm.core.errors import ConfigError
from jaxlm.core.typedconfig import flatten_tree


class PlanError(ConfigError):
    """A plan file is malformed; the message names the file and the key."""


KINDS = ("train", "bench", "command")
REQUIREMENT_NAMES = ("gpu",)  # a run that `requires` one is skipped, its reason recorded, on a device without it


@dataclass(frozen=True)
class RunSpec:
    """One concrete run: what to execute and how the report should label it."""

    name: str
    kind: str  # train | bench | command
    config: str | None = None  # train: base config TOML
    set: dict[str, Any] = field(default_factory=dict)  # train / bench: dotted `--set section.key=value` overrides
    args: dict[str, Any] = field(default_factory=dict)  # bench / command: CLI arguments {flag: value}
    argv: list[str] = field(default_factory=list)  # command: {run_dir} and {python} substituted, {seed} per seed
    requires: str | None = None  # one of REQUIREMENT_NAMES
    reason: str | None = None  # why the requirement exists, shown when skipped
    tokens: int | None = None  # train: token budget, turned into train.steps
    timeout: float | None = None  # seconds before the run is stopped and recorded as failed
    env: dict[str, str] = field(default_factory=dict)  # extra environment variables
    axes: dict[str, Any] = field(default_factory=dict)  # {axis: value} labels for the report (grid runs get them)
    note: str | None = None  # free text carried into result.json

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def hash(self) -> str:
        """Identifies what the run computes: a changed spec means old results are stale."""
        keep = {k: v for k, v in self.to_dict().items() if k not in ("note", "timeout", "reason")}
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


# The keys of a run entry that describe the run (`grid`, `sizes`, `only_sizes`, `seeded`, `name` are structural).
SPEC_KEYS = {f.name for f in dataclasses.fields(RunSpec)} - {"name"}


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
    for key, allowed in (("kind", KINDS), ("requires", REQUIREMENT_NAMES)):
        if key in out and out[key] not in allowed:
            raise PlanError(f"{where}.{key}: {out[key]!r} is not one of {', '.join(allowed)}")
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
    given = {k: fields[k] for k in SPEC_KEYS if k in fields}
    if "tokens" in given:
        given["tokens"] = int(given["tokens"])
    given["env"] = {k: str(v) for k, v in given.get("env", {}).items()}
    return RunSpec(name=name, **given)
