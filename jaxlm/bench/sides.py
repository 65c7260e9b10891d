"""The measuring sides of the benchmarks: the library's own ("jax") and those other packages plug in.

A side times one framework's steps beside jaxlm's. Plugins are found through the entry point group
`jaxlm.bench.sides` (pyproject.toml: `[project.entry-points."jaxlm.bench.sides"]`): each entry names a
`Plugin` that says which module measures, which pip extra that module needs, its own options of the
`model` command and any commands of its own. The plugin's measuring module is imported only when its
rows are asked for, so jaxlm imports no other framework; the comparison side of parity (the PyTorch
reference) is such a plugin. A side that cannot be imported stops the command in one line naming the
extra to install and the option that asked for it.

What a side module offers (each command uses what it needs; `jaxlm.bench.steps` is the library's):
- `device_kind() -> str` ("cpu" on the host CPU)
- `prepare(setting, cfg, compute, batch, context, opts, row) -> Prepared | None` (`model`; see
  `jaxlm.bench.measure.run_group`), and optionally `release_memory()` after an out-of-memory row
- `matmul_call(product, a, b) -> call` (`matmul`), `decode_runner(...)` (`decode`),
  `op_profile(...)` (`ops`), `memory_snapshot(...)` (`model --memory-profile`)
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Mapping

from jaxlm.core.errors import MissingExtra, UsageError
from jaxlm.core.plugins import entry_points

GROUP = "jaxlm.bench.sides"
OWN = "jax"  # the library's own side; every other side is a reference it is compared with
OWN_MODULE = "jaxlm.bench.steps"
BOTH = "both"  # --framework both: the library's side and every plugged-in side


@dataclass(frozen=True)
class Plugin:
    """What an entry point of GROUP names: a side measured by `module` (imported only when used)."""

    module: str
    summary: str  # what it measures, for --help
    extra: str | None = None  # the pip extra `module` needs
    add_args: Callable | None = None  # (argparse group) -> None: its options of the `model` command
    commands: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # name -> (module, one line of help)


LOADED: dict[str, ModuleType] = {}  # side name -> its measuring module, once imported


@functools.cache
def plugins() -> dict[str, Plugin]:
    """Every installed plugin by side name (reading the entry points imports only the modules that declare them;
    from a checkout, its pyproject.toml's: `jaxlm.core.plugins.entry_points`)."""
    return {ep.name: ep.load() for ep in entry_points(GROUP) if ep.name != OWN}


def names() -> list[str]:
    return [OWN, *plugins()]


def chosen(framework: str) -> list[str]:
    """The sides `--framework` asks for: one side, or `both` (the library's and every plugged-in one)."""
    return names() if framework == BOTH else [framework]


def load(name: str, asked: str = "") -> ModuleType:
    """The measuring module of side `name`; a side that is not installed, or whose extra is not, stops in one
    line naming `asked` (what the user passed, e.g. "--framework both")."""
    if name in LOADED:
        return LOADED[name]
    asked = asked or f"--framework {name}"
    if name == OWN:
        module = OWN_MODULE
    elif name in plugins():
        module = plugins()[name].module
    else:
        raise UsageError(f"{asked}: no measuring side {name!r} is installed (installed: {', '.join(names())})")
    try:
        LOADED[name] = importlib.import_module(module)
    except ModuleNotFoundError as e:
        extra = plugins()[name].extra if name in plugins() else None
        if extra is None or (e.name or "").split(".")[0] == module.split(".")[0]:
            raise
        raise MissingExtra(f"{asked}: the {name} side needs the '{extra}' extra ({e.name} is not installed): "
                           f"pip install -e '.[{extra}]'") from None
    return LOADED[name]


def load_chosen(framework: str) -> dict[str, ModuleType]:
    """{side name: module} for `--framework FRAMEWORK`; stops in one line as `load` says."""
    return {name: load(name, f"--framework {framework}") for name in chosen(framework)}


def add_framework_arg(p, what: str = "measure") -> None:
    """`--framework`: the library's side, a plugged-in one (its help names the extra it needs), or both."""
    others = [f"{n}: {p.summary}" + (f" (the '{p.extra}' extra)" if p.extra else "") for n, p in plugins().items()]
    p.add_argument("--framework", default=OWN, choices=[*names(), BOTH],
                   help=f"which side(s) to {what}: {OWN}: this library; " + "; ".join([*others, f"{BOTH}: every one"]))


def add_plugin_args(p) -> None:
    """Each plugin's own options of the `model` command, in a group named after it."""
    for name, plugin in plugins().items():
        if plugin.add_args is not None:
            extra = f"; the '{plugin.extra}' extra" if plugin.extra else ""
            plugin.add_args(p.add_argument_group(f"the {name} side ({plugin.summary}{extra})"))


def commands() -> dict[str, tuple[str, str]]:
    """The commands plugins add to `python -m jaxlm.bench`: name -> (module, one line of help)."""
    return {name: cmd for plugin in plugins().values() for name, cmd in plugin.commands.items()}
