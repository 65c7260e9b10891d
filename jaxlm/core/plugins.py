"""The packages beside jaxlm that register with it, found through entry points, so that jaxlm names none of them.

A package registers through the entry point group `REGISTRY`, one entry per package naming its registry's command
list (`package.registry:COMMANDS`); the registry module may also declare `EXTRAS` (a module its commands import ->
the pyproject extra that installs it). jaxlm reads from the packages found: their commands (`python -m jaxlm`,
jaxlm.cli.registry), their names (a `python -m` of one of their modules is a command: jaxlm.core.stop) and their
extras (a missing one named in one line: jaxlm.core.extras).

Entry points are read from the installed distributions' metadata, or, when jaxlm runs from a checkout (a
pyproject.toml of project "jaxlm" beside the package), from the checkout's pyproject.toml: its
`[project.entry-points]` (an editable install's metadata is as old as its last `pip install -e`, and a checkout
on PYTHONPATH has none of its own) and its `[tool.jaxlm.entry-points]`, the packages that run from the checkout
with `python -m` and are not installed (what a wheel carries names nothing it does not ship).
"""

from __future__ import annotations

import functools
import importlib
import tomllib
from importlib import metadata
from pathlib import Path
from types import ModuleType

REGISTRY = "jaxlm.cli.registry"
CHECKOUT = Path(__file__).resolve().parents[2] / "pyproject.toml"  # there when jaxlm runs from a checkout


def entry_points(group: str, pyproject: Path = CHECKOUT) -> list[metadata.EntryPoint]:
    """The entry points of `group`: those of `pyproject` when it is jaxlm's (a checkout), installed and
    checkout-only, else the installed distributions' (module docstring)."""
    if pyproject.is_file():
        data = tomllib.loads(pyproject.read_text())
        if data.get("project", {}).get("name") == "jaxlm":
            tables = (data["project"].get("entry-points", {}), data.get("tool", {}).get("jaxlm", {}).get(
                "entry-points", {}))
            return [metadata.EntryPoint(name, value, group) for t in tables for name, value in t.get(group, {}).items()]
    return list(metadata.entry_points(group=group))


def loaded(ep: metadata.EntryPoint):
    """What `ep` names, or None when its package does not import here (not installed, no checkout on the path); a
    package that is there but one of whose imports is missing raises."""
    try:
        return ep.load()
    except ModuleNotFoundError as e:
        if e.name != ep.module.partition(".")[0]:
            raise
        return None


@functools.cache
def packages() -> frozenset[str]:
    """The top-level packages that register with jaxlm (nothing imported)."""
    return frozenset(ep.module.partition(".")[0] for ep in entry_points(REGISTRY))


def registries() -> list[ModuleType]:
    """The registry modules of the packages that register with jaxlm and import here; one that fails to import
    (a Python without jaxlm's dependencies) is left out."""
    found = []
    for ep in entry_points(REGISTRY):
        try:
            found.append(importlib.import_module(ep.module))
        except ImportError:
            continue
    return found
