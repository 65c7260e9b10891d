"""Experiment plans (the format: docs/experiments.md): a run's fields (`RunSpec`) and a TOML plan file expanded into
them for one size."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jaxlm.core.errors import ConfigError
from jaxlm.core.typedconfig import flatten_tree, merge_trees, read_toml


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


SPEC_KEYS = {f.name for f in dataclasses.fields(RunSpec)} - {"name"}  # a run entry's keys that describe the run
TOP_KEYS = {"plan", "defaults", "sizes", "runs", "report"}
PLAN_KEYS = {"name", "description", "include", "seeds"}
SEED_AXIS = "seed"  # the axis that labels a run's seed (its train.seed); the report averages over it
# `seeded = false` keeps a train run out of the plan's seeds (e.g. the pre-training every seeded fine-tune starts from)
ENTRY_KEYS = SPEC_KEYS | {"name", "grid", "sizes", "only_sizes", "seeded"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$")
PLANS_DIR = Path(__file__).parent / "plans"


@dataclass(frozen=True)
class Plan:
    name: str
    path: Path
    size: str
    sizes: tuple[str, ...]
    description: str
    runs: tuple[RunSpec, ...]
    report: dict[str, Any]

    def select(self, patterns: list[str] | None) -> list[RunSpec]:
        """Runs whose name equals or glob-matches one of `patterns` (all runs when none are given)."""
        if not patterns:
            return list(self.runs)
        chosen = [r for r in self.runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]
        if not chosen:
            raise PlanError(f"{self.path}: --only {' '.join(patterns)} matches no run; "
                            f"runs: {', '.join(r.name for r in self.runs)}")
        return chosen


def format_value(v: Any) -> str:
    """How an axis value appears in a run name: 0.001 -> '0.001', 1e-05 -> '1e-05', True -> 'true'."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def plan_names() -> list[str]:
    """The shipped plans (files in experiments/plans/ not starting with "_", which are includes)."""
    return sorted(q.stem for q in PLANS_DIR.glob("*.toml") if not q.name.startswith("_"))


def check_keys(table: Any, allowed: set[str], where: str) -> dict:
    """`table` itself, once it is a table whose keys are all `allowed`; else a PlanError naming `where`."""
    if not isinstance(table, dict):
        raise PlanError(f"{where}: expected a table, got {table!r}")
    if unknown := [k for k in table if k not in allowed]:
        raise PlanError(f"{where}: unknown key '{unknown[0]}'; valid keys: {', '.join(sorted(allowed))}")
    return table


def _fields(table: Any, where: str, allowed: set[str] = SPEC_KEYS) -> dict:
    """The table's run fields, keys checked against `allowed`, types checked and `set` flattened."""
    out = dict(check_keys(table, allowed, where))
    if "set" in out:
        if not isinstance(out["set"], dict):
            raise PlanError(f"{where}.set: expected a table of overrides, got {out['set']!r}")
        out["set"] = flatten_tree(out["set"])
    for key in ("args", "env", "axes"):
        if key in out and not isinstance(out[key], dict):
            raise PlanError(f"{where}.{key}: expected a table, got {out[key]!r}")
    for key, choices in (("kind", KINDS), ("requires", REQUIREMENT_NAMES)):
        if key in out and out[key] not in choices:
            raise PlanError(f"{where}.{key}: {out[key]!r} is not one of {', '.join(choices)}")
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
    given = {**fields, "env": {k: str(v) for k, v in fields.get("env", {}).items()}}
    if "tokens" in given:
        given["tokens"] = int(given["tokens"])
    return RunSpec(name=name, **given)


def _grid_points(grid: Any, where: str) -> list[list[tuple[str, Any, dict]]]:
    """The product of the grid's axes: each point is [(axis, label, fields to merge), ...]."""
    if not isinstance(grid, dict) or not grid:
        raise PlanError(f"{where}.grid: expected a non-empty table of axis = [values]")
    axes = []
    for axis, values in grid.items():
        w = f"{where}.grid.{axis}"
        if not isinstance(values, list) or not values:
            raise PlanError(f"{w}: expected a non-empty list of values")
        options = []
        for i, v in enumerate(values):
            if not isinstance(v, dict):  # a dotted axis is a config override, a plain one an argument
                options.append((axis, v, {"set" if "." in axis else "args": {axis: v}}))
                continue
            fields = _fields(v, f"{w}[{i}]", (SPEC_KEYS - {"axes"}) | {"label"})
            if "label" not in v:
                raise PlanError(f"{w}[{i}]: a table value needs a 'label'")
            options.append((axis, fields.pop("label"), fields))
        axes.append(options)
    return [list(point) for point in itertools.product(*axes)]


def _expand_name(template: str, labels: dict[str, Any], where: str) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1) not in labels:
            raise PlanError(f"{where}.name: '{m.group(0)}' is not a grid axis; axes: {', '.join(labels) or 'none'}")
        return format_value(labels[m.group(1)])

    name = re.sub(r"\{([^{}]+)\}", sub, template)
    if not NAME_RE.match(name):
        raise PlanError(f"{where}.name: {name!r} is not a usable directory name (letters, digits, . _ = + -)")
    return name


def _read_toml(path: Path) -> dict:
    """The file's tables, with the `set` of [defaults] and [sizes.*] flattened so that includes merge key by key."""
    try:
        data = read_toml(path)
    except ConfigError as e:  # named as the plan's error, like every other problem of the file
        raise PlanError(str(e)) from None
    def flat(t: Any) -> Any:
        return {**t, "set": flatten_tree(t["set"])} if isinstance(t, dict) and isinstance(t.get("set"), dict) else t

    if "defaults" in data:
        data["defaults"] = flat(data["defaults"])
    if isinstance(data.get("sizes"), dict):
        data["sizes"] = {k: flat(v) for k, v in data["sizes"].items()}
    return data


def _read_with_includes(path: Path) -> dict:
    """The plan's tables merged over those of the files in `[plan] include` (paths relative to the plan)."""
    data = _read_toml(path)
    includes = data.get("plan", {}).get("include", []) if isinstance(data.get("plan"), dict) else []
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise PlanError(f"{path}: [plan].include: expected a list of file names")
    base: dict = {}
    for inc in (path.parent / name for name in includes):
        if not inc.is_file():
            raise PlanError(f"{path}: [plan].include: {inc} not found")
        inc_data = _read_toml(inc)
        if "runs" in inc_data or "plan" in inc_data:
            raise PlanError(f"{inc} (included by {path}): an include holds [defaults], [sizes] or [report] only")
        base = merge_trees(base, inc_data)
    return merge_trees(base, data)


def _expand_entry(entry: Any, base: dict, size: str, sizes: tuple[str, ...], where: str) -> list[RunSpec]:
    """One [[runs]] entry at one size: no run (not in `only_sizes`), one run, or one per grid point. Its fields
    merge over `base`, then its `sizes.SIZE` table's, then the grid point's (tables key by key, others replace)."""
    fields = {k: v for k, v in _fields(entry, where, ENTRY_KEYS).items() if k in SPEC_KEYS}
    if "name" not in entry or not isinstance(entry["name"], str):
        raise PlanError(f"{where}: every run needs a 'name' (a template like 'lr{{optim.lr}}' for a grid)")
    only = entry.get("only_sizes")
    if only is not None and (not isinstance(only, list) or any(s not in sizes for s in only)):
        raise PlanError(f"{where}.only_sizes: expected a list drawn from {', '.join(sizes)}, got {only!r}")
    if only is not None and size not in only:
        return []
    if not isinstance(entry.get("seeded", True), bool):
        raise PlanError(f"{where}.seeded: expected true or false, got {entry['seeded']!r}")
    own_sizes = check_keys(entry.get("sizes", {}), set(sizes), f"{where}.sizes")
    grid = entry.get("grid")
    if size in own_sizes:
        own = _fields(own_sizes[size], f"{where}.sizes.{size}", SPEC_KEYS | {"grid"})
        grid = merge_trees(grid or {}, own.pop("grid")) if "grid" in own else grid
        fields = merge_trees(fields, own)
    fields = merge_trees(base, fields)
    if grid is None:
        return [to_spec(_expand_name(entry["name"], {}, where), fields, where)]
    runs = []
    for point in _grid_points(grid, where):
        labels = {axis: label for axis, label, _ in point}
        point_fields = functools.reduce(merge_trees, [f for *_, f in point] + [{"axes": labels}], fields)
        name = _expand_name(entry["name"], labels, where)
        runs.append(to_spec(name, point_fields, f"{where} -> {name}"))
    return runs


def load_plan(plan: str | Path, size: str | None = None, platform: str = "cpu") -> Plan:
    """Parse a plan file (or a plan name in experiments/plans/) and expand it for one size (default: `gpu` on a GPU
    `platform` when the plan has it, else its first size)."""
    path = Path(plan) if Path(plan).is_file() else PLANS_DIR / f"{plan}.toml"
    if not path.is_file():
        raise PlanError(f"plan not found: {plan} (not a file; known plans: {', '.join(plan_names())})")
    data = check_keys(_read_with_includes(path), TOP_KEYS, str(path))
    meta = check_keys(data.get("plan", {}), PLAN_KEYS, f"{path}: [plan]")
    defaults = _fields(data.get("defaults", {}), f"{path}: [defaults]")
    sizes_table = data.get("sizes", {})
    if not isinstance(sizes_table, dict):
        raise PlanError(f"{path}: [sizes]: expected tables such as [sizes.cpu]")
    sizes = tuple(sizes_table) or ("default",)
    size = size or ("gpu" if platform == "gpu" and "gpu" in sizes else sizes[0])
    if size not in sizes:
        raise PlanError(f"{path}: size '{size}' is not defined; sizes: {', '.join(sizes)}")
    base = merge_trees(defaults, _fields(sizes_table.get(size, {}), f"{path}: [sizes.{size}]"))
    entries, report = data.get("runs"), data.get("report", {})
    if not isinstance(entries, list) or not entries:
        raise PlanError(f"{path}: no [[runs]] entries")
    if not isinstance(report, dict):
        raise PlanError(f"{path}: [report]: expected a table")

    runs: list[RunSpec] = []
    unseeded: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{path}: runs[{i}]" + (f" ({entry['name']})" if isinstance(entry, dict) and "name" in entry else "")
        expanded = _expand_entry(entry, base, size, sizes, where)
        runs += expanded
        if entry.get("seeded") is False:
            unseeded |= {r.name for r in expanded}
    runs = with_seeds(runs, meta.get("seeds"), unseeded, path)
    if dups := [n for n, c in Counter(r.name for r in runs).items() if c > 1]:
        raise PlanError(f"{path}: run names are not unique: {', '.join(dups)} "
                        "(put every grid axis in the name template)")
    return Plan(name=meta.get("name", path.stem), path=path, size=size, sizes=sizes,
                description=meta.get("description", ""), runs=tuple(runs), report=report)


def with_seeds(runs: list[RunSpec], seeds: Any, unseeded: set[str], path: Path) -> list[RunSpec]:
    """Each train run once per seed: named NAME-sSEED, with `train.seed` set and a `seed` axis. Seed-major, so a plan
    cut short still compares every setting. A command whose argv names `{seed}` runs once per seed too, after that
    seed's training runs; other runs (benchmarks, commands, `unseeded` train runs) run once, in the first pass."""
    if seeds is not None and (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
                              or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in seeds)):
        raise PlanError(f"{path}: [plan].seeds: expected a non-empty list of distinct integers >= 0, got {seeds!r}")
    per_seed = lambda r: any("{seed}" in a for a in r.argv)
    if not seeds:
        if named := next((r for r in runs if per_seed(r)), None):
            raise PlanError(f"{path}: run '{named.name}': its argv names {{seed}} but the plan has no [plan].seeds")
        return runs
    out = []
    for i, seed in enumerate(seeds):
        for r in runs:
            seeded = {"name": f"{r.name}-s{seed}", "axes": {**r.axes, SEED_AXIS: seed}}
            if r.kind == "train" and r.name not in unseeded:
                out.append(dataclasses.replace(r, set={**r.set, "train.seed": seed}, **seeded))
            elif r.kind == "command" and per_seed(r):
                out.append(dataclasses.replace(r, argv=[a.replace("{seed}", str(seed)) for a in r.argv], **seeded))
            elif i == 0:
                out.append(r)
    return out
