"""Experiment plans: a TOML file of [plan], [defaults], [sizes.SIZE], [[runs]] and [report] tables (the format:
docs/experiments.md), expanded into concrete `RunSpec`s.

Precedence, lowest first: `[defaults]`, `[sizes.SIZE]`, the run entry, the entry's own `sizes.SIZE` table, then the
grid point; tables merge key by key (`set` and `args` included), lists and scalars replace. Grid axes: a dotted key
(`optim.lr`) is a `--set` override, a plain key (`batch`) a bench/command argument, and an axis whose values are
tables (`{ label = "bf16", set = {...} }`) applies a bundle of fields per point. Errors raise `PlanError` naming the
plan file and the offending key.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import itertools
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.spec import SPEC_KEYS, PlanError, RunSpec, check_keys, normalise, to_spec
from jaxlm.core.errors import ConfigError
from jaxlm.core.typedconfig import flatten_tree, merge_trees, read_toml

TOP_KEYS = {"plan", "defaults", "sizes", "runs", "report"}
PLAN_KEYS = {"name", "description", "default_size", "include", "seeds"}
SEED_KEY = "train.seed"  # the config field a plan's `seeds` sets on each train run
SEED_AXIS = "seed"  # the axis that labels a run's seed; the report averages over it
# `seeded = false` keeps a train run out of the plan's seeds (one run, e.g. the pre-training that
# every seeded fine-tune starts from).
ENTRY_KEYS = SPEC_KEYS | {"name", "grid", "sizes", "only_sizes", "seeded"}
AXIS_TABLE_KEYS = (SPEC_KEYS - {"axes"}) | {"label"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$")


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
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# --------------------------------------------------------------------------- parsing


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
            if isinstance(v, dict):
                check_keys(v, AXIS_TABLE_KEYS, f"{w}[{i}]")
                if "label" not in v:
                    raise PlanError(f"{w}[{i}]: a table value needs a 'label'")
                fields = normalise({k: x for k, x in v.items() if k != "label"}, f"{w}[{i}]")
                options.append((axis, v["label"], fields))
            else:  # a dotted axis is a config override, a plain one an argument
                options.append((axis, v, {"set" if "." in axis else "args": {axis: v}}))
        axes.append(options)
    return [list(point) for point in itertools.product(*axes)]


def _expand_name(template: str, labels: dict[str, Any], where: str) -> str:
    def sub(m: re.Match) -> str:
        key = m.group(1)
        if key not in labels:
            raise PlanError(f"{where}.name: '{{{key}}}' is not a grid axis; axes: {', '.join(labels) or 'none'}")
        return format_value(labels[key])

    name = re.sub(r"\{([^{}]+)\}", sub, template)
    if not NAME_RE.match(name):
        raise PlanError(f"{where}.name: {name!r} is not a usable directory name (letters, digits, . _ = + -)")
    return name


PLANS_DIR = Path(__file__).parent / "plans"


def plan_names() -> list[str]:
    """The shipped plans (files in experiments/plans/ not starting with "_", which are includes)."""
    return sorted(q.stem for q in PLANS_DIR.glob("*.toml") if not q.name.startswith("_"))


def resolve_plan_path(plan: str | Path) -> Path:
    """A path to a TOML file, or a plan name looked up in experiments/plans/."""
    p = Path(plan)
    if p.is_file():
        return p
    named = PLANS_DIR / f"{plan}.toml"
    if named.is_file():
        return named
    raise PlanError(f"plan not found: {plan} (not a file; known plans: {', '.join(plan_names())})")


def _read_toml(path: Path) -> dict:
    try:
        return read_toml(path)
    except ConfigError as e:  # named as the plan's error, like every other problem of the file
        raise PlanError(str(e)) from None


def _read_with_includes(path: Path) -> dict:
    """The plan's tables merged over those of the files in `[plan] include` (paths relative to the plan)."""
    data = _read_toml(path)
    includes = data.get("plan", {}).get("include", []) if isinstance(data.get("plan"), dict) else []
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise PlanError(f"{path}: [plan].include: expected a list of file names")
    base: dict = {}
    for name in includes:
        inc = path.parent / name
        if not inc.is_file():
            raise PlanError(f"{path}: [plan].include: {inc} not found")
        inc_data = _read_toml(inc)
        if "runs" in inc_data or "plan" in inc_data:
            raise PlanError(f"{inc} (included by {path}): an include holds [defaults], [sizes] or [report] only")
        base = merge_trees(base, _normalise_sets(inc_data))
    return merge_trees(base, _normalise_sets(data))


def _normalise_sets(data: dict) -> dict:
    """Flatten the `set` tables of [defaults] and [sizes.*] so that includes merge key by key."""
    def flat(t: Any) -> Any:
        return {**t, "set": flatten_tree(t["set"])} if isinstance(t, dict) and isinstance(t.get("set"), dict) else t

    out = {**data, "defaults": flat(data["defaults"])} if "defaults" in data else dict(data)
    if isinstance(out.get("sizes"), dict):
        out["sizes"] = {k: flat(v) for k, v in out["sizes"].items()}
    return out


def _expand_entry(entry: Any, base: dict, size: str, sizes: tuple[str, ...], where: str) -> list[RunSpec]:
    """One [[runs]] entry at one size: no run (not in `only_sizes`), one run, or one per grid point."""
    check_keys(entry, ENTRY_KEYS, where)
    if "name" not in entry or not isinstance(entry["name"], str):
        raise PlanError(f"{where}: every run needs a 'name' (a template like 'lr{{optim.lr}}' for a grid)")
    only = entry.get("only_sizes")
    if only is not None:
        if not isinstance(only, list) or any(s not in sizes for s in only):
            raise PlanError(f"{where}.only_sizes: expected a list drawn from {', '.join(sizes)}, got {only!r}")
        if size not in only:
            return []
    if not isinstance(entry.get("seeded", True), bool):
        raise PlanError(f"{where}.seeded: expected true or false, got {entry['seeded']!r}")
    own_sizes = entry.get("sizes", {})
    check_keys(own_sizes, set(sizes), f"{where}.sizes")
    fields = normalise({k: v for k, v in entry.items() if k in SPEC_KEYS}, where)
    grid = entry.get("grid")
    if size in own_sizes:
        own = check_keys(own_sizes[size], SPEC_KEYS | {"grid"}, f"{where}.sizes.{size}")
        if "grid" in own:
            grid = merge_trees(grid or {}, own["grid"])
        fields = merge_trees(fields, normalise({k: v for k, v in own.items() if k != "grid"}, f"{where}.sizes.{size}"))
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


def load_plan(plan: str | Path, size: str | None = None) -> Plan:
    """Parse a plan file and expand it for one size (default: the plan's `default_size`, else the first size)."""
    path = resolve_plan_path(plan)
    data = _read_with_includes(path)
    check_keys(data, TOP_KEYS, str(path))
    meta = check_keys(data.get("plan", {}), PLAN_KEYS, f"{path}: [plan]")
    defaults = normalise(check_keys(data.get("defaults", {}), SPEC_KEYS, f"{path}: [defaults]"), f"{path}: [defaults]")

    sizes_table = data.get("sizes", {})
    if not isinstance(sizes_table, dict):
        raise PlanError(f"{path}: [sizes]: expected tables such as [sizes.cpu]")
    sizes = tuple(sizes_table) or ("default",)
    size = size or meta.get("default_size") or sizes[0]
    if size not in sizes:
        raise PlanError(f"{path}: size '{size}' is not defined; sizes: {', '.join(sizes)}")
    size_fields = {}
    if size in sizes_table:
        w = f"{path}: [sizes.{size}]"
        size_fields = normalise(check_keys(sizes_table[size], SPEC_KEYS, w), w)

    entries = data.get("runs")
    if not isinstance(entries, list) or not entries:
        raise PlanError(f"{path}: no [[runs]] entries")
    report = data.get("report", {})
    if not isinstance(report, dict):
        raise PlanError(f"{path}: [report]: expected a table")

    base = merge_trees(defaults, size_fields)
    runs: list[RunSpec] = []
    unseeded: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{path}: runs[{i}]" + (f" ({entry['name']})" if isinstance(entry, dict) and "name" in entry else "")
        expanded = _expand_entry(entry, base, size, sizes, where)
        runs += expanded
        if entry.get("seeded") is False:
            unseeded |= {r.name for r in expanded}

    seeds = _seeds(meta.get("seeds"), f"{path}: [plan].seeds")
    for r in runs if not seeds else []:
        if any("{seed}" in a for a in r.argv):
            raise PlanError(f"{path}: run '{r.name}': its argv names {{seed}} but the plan has no [plan].seeds")
    runs = with_seeds(runs, seeds, unseeded)
    dups = [n for n, c in Counter(r.name for r in runs).items() if c > 1]
    if dups:
        raise PlanError(f"{path}: run names are not unique: {', '.join(dups)} "
                        "(put every grid axis in the name template)")
    return Plan(name=meta.get("name", path.stem), path=path, size=size, sizes=sizes,
                description=meta.get("description", ""), runs=tuple(runs), report=report)


def _seeds(seeds: Any, where: str) -> list[int] | None:
    if seeds is None:
        return None
    if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in seeds)):
        raise PlanError(f"{where}: expected a non-empty list of distinct integers >= 0, got {seeds!r}")
    return seeds


def with_seeds(runs: list[RunSpec], seeds: list[int] | None, unseeded: set[str] = frozenset()) -> list[RunSpec]:
    """Each train run once per seed: named NAME-sSEED, with `train.seed` set and a `seed` axis. Seed-major, so a plan
    cut short still compares every setting. A command whose argv names `{seed}` runs once per seed too, after that
    seed's training runs; other runs (benchmarks, commands, `unseeded` train runs) run once, in the first pass."""
    if not seeds:
        return runs
    out = []
    for i, seed in enumerate(seeds):
        for r in runs:
            seeded = {"name": f"{r.name}-s{seed}", "axes": {**r.axes, SEED_AXIS: seed}}
            if r.kind == "train" and r.name not in unseeded:
                out.append(dataclasses.replace(r, set={**r.set, SEED_KEY: seed}, **seeded))
            elif r.kind == "command" and any("{seed}" in a for a in r.argv):
                out.append(dataclasses.replace(r, argv=[a.replace("{seed}", str(seed)) for a in r.argv], **seeded))
            elif i == 0:
                out.append(r)
    return out


