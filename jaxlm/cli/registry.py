"""Every command in one registry: what `python -m MODULE` runs, in one line, and what it needs installed.

`python -m jaxlm` prints it. The library's commands are `LIBRARY`; a package beside jaxlm registers its own
through the entry point group `jaxlm.cli.registry` (pyproject.toml:
`[project.entry-points."jaxlm.cli.registry"]`), each entry naming a sequence of `Command`s; a package that does
not import here (not installed, no checkout on the path) lists none. Each command's parser takes its prog and its
"Needs ..." line from its entry (`cli.ArgumentParser(command=MODULE)`).

Entry points are read from the installed distributions' metadata, or, when jaxlm runs from a checkout (a
pyproject.toml of project "jaxlm" beside the package), from the checkout's pyproject.toml: an editable install's
metadata is as old as its last `pip install -e`, and a checkout on PYTHONPATH has none of its own.
"""

from __future__ import annotations

import functools
import textwrap
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

GROUP = "jaxlm.cli.registry"
CORE = "the core install"


@dataclass(frozen=True)
class Command:
    """One command: `python -m {module}`."""

    module: str
    help: str  # one line: what it does
    needs: str = CORE  # what must be installed: the core install, an extra ("the 'hf' extra"), a GPU
    subcommands: bool = False  # its first argument names a subcommand, each with its own --help

    @property
    def name(self) -> str:
        """What `python -m jaxlm` calls it: the library's commands without the `jaxlm.` prefix."""
        return self.module.removeprefix("jaxlm.")


LIBRARY = (
    Command("jaxlm.train", "train a Transformer LM from a config, or continue its run"),
    Command("jaxlm.generate", "sample text from a trained run"),
    Command("jaxlm.data", "download corpora, train a BPE tokenizer, prepare token files", subcommands=True),
    Command("jaxlm.memory", "a step's memory per device and the largest batch that fits, estimated or compiled",
            needs=f"{CORE} (--target: the 'gpu-compile' extra)"),
    Command("jaxlm.bench", "time the model, data, decoding, ops, matmuls and mesh layouts", subcommands=True,
            needs=f"{CORE} (each WHAT's --help names what it needs)"),
    Command("jaxlm.lora", "fold a LoRA or QLoRA run's adapters into its weights", subcommands=True),
    Command("jaxlm.quantize", "quantise runs' weights after training (int8, int4, NF4) and evaluate them"),
    Command("jaxlm.hf", "Hugging Face Llama-family checkpoints in and out", needs="the 'hf' extra",
            subcommands=True),
)


CHECKOUT = Path(__file__).resolve().parents[2] / "pyproject.toml"  # there when jaxlm runs from a checkout


def entry_points(group: str, pyproject: Path = CHECKOUT) -> list[metadata.EntryPoint]:
    """The entry points of `group`: those of `pyproject` when it is jaxlm's (a checkout), else the installed
    distributions' (module docstring)."""
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "jaxlm":
            table = project.get("entry-points", {}).get(group, {})
            return [metadata.EntryPoint(name, value, group) for name, value in table.items()]
    return list(metadata.entry_points(group=group))


def registered(points: list[metadata.EntryPoint]) -> list[Command]:
    """The commands the entry points name; none from a package that does not import here."""
    found = []
    for ep in points:
        try:
            found += ep.load()
        except ModuleNotFoundError as e:
            if e.name != ep.module.partition(".")[0]:  # the package is there, one of its imports is not
                raise
    return found


@functools.cache
def commands() -> tuple[Command, ...]:
    """The library's commands, then those of every package that registers some and imports here."""
    return (*LIBRARY, *registered(entry_points(GROUP)))


def find(module: str) -> Command | None:
    """The registered command `python -m module` (the library's looked up without reading any entry point)."""
    return next((c for c in LIBRARY if c.module == module), None) or next(
        (c for c in commands() if c.module == module), None)


def listing(width: int = 118) -> str:
    """What `python -m jaxlm` prints: every registered command, what it does and, beyond the core install, what it
    needs, wrapped at `width` columns."""
    every = commands()
    indent = max(len(c.module) for c in every) + len("  python -m ")
    lines = ["jaxlm's commands (`python -m MODULE --help` lists one's options):"]
    for i, c in enumerate(every):
        if i == len(LIBRARY):
            lines += ["", "registered beside jaxlm:"]
        text = c.help + ("" if c.needs == CORE else f"; needs {c.needs}")
        for j, line in enumerate(textwrap.wrap(text, max(width - indent, 40), break_on_hyphens=False)):
            lines.append(f"{'  python -m ' + c.module if j == 0 else '':<{indent}}  {line}")
    return "\n".join(lines)
