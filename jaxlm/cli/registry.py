"""Every command in one registry: what `python -m MODULE` runs, in one line, and what it needs installed.

`python -m jaxlm` prints it. The library's commands are `LIBRARY`; a package beside jaxlm registers its own
through the entry point group `jaxlm.cli.registry` (jaxlm.core.plugins), each entry naming a sequence of
`Command`s; a package that does not import here (not installed, no checkout on the path) lists none. Each
command's parser takes its prog and its "Needs ..." line from its entry (`cli.ArgumentParser(command=MODULE)`).
"""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass

from jaxlm.core import plugins

GROUP = plugins.REGISTRY
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


@functools.cache
def commands() -> tuple[Command, ...]:
    """The library's commands, then those of every package that registers some and imports here."""
    return (*LIBRARY, *(c for ep in plugins.entry_points(GROUP) for c in plugins.loaded(ep) or ()))


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
