"""Every benchmark behind one command: `python -m jaxlm.bench WHAT [options]`; WHAT is listed in COMMANDS,
and plugged-in sides add their own (`jaxlm.bench.sides`). Importing it loads no framework."""

from __future__ import annotations

import importlib
import os
import sys

# Before JAX is imported anywhere: allocate GPU memory on demand so that another side can share the
# device and memory_stats() peaks reflect what the step used, not a 75 % preallocation.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from jaxlm import cli  # noqa: E402
from jaxlm.bench import sides  # noqa: E402
from jaxlm.core.errors import UsageError  # noqa: E402

COMMANDS = {  # name: (module with add_args(parser) and main(args), one line of help: what it needs to run)
    "model": ("jaxlm.bench.sweep", "time, FLOPs, MFU and memory of model steps (core install; --framework SIDE: that "
              "side's extra; --target: the 'gpu-compile' extra)"),
    "data": ("jaxlm.bench.data", "BPE training, GPT-2 encoding through prepare, loader batches/s (core install)"),
    "decode": ("jaxlm.bench.decode", "generation tokens/s with and without the KV cache (core install; --framework "
               "SIDE: that side's extra)"),
    "ops": ("jaxlm.bench.op_profile", "where a step's time goes, op by op, from a profile of the compiled step (core "
            "install; --framework SIDE: that side's extra)"),
    "matmul": ("jaxlm.bench.matmul", "the step's projection matmuls one by one (forward, input and weight gradient), "
               "GFLOP/s (core install; --framework SIDE: that side's extra)"),
    "parallel": ("jaxlm.bench.layouts", "the train step on a device mesh: per-device memory, collectives, step time "
                 "(core install)"),
}
DESCRIPTION = """Every benchmark behind one command (docs/benchmarks.md); `python -m jaxlm.bench WHAT --help`
lists WHAT's options and the extra it needs. The commands that build a model take the common config flags
(--config, --preset, --set); those with --framework measure the sides plugged in beside jaxlm's own."""


def main(argv=None) -> int:
    """Only the chosen command's module is imported (and with it only the frameworks it needs)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = cli.ArgumentParser(command="jaxlm.bench", description=DESCRIPTION,
                                formatter_class=cli.HelpFormatter)
    subparsers = parser.add_subparsers(dest="what", required=True, metavar="WHAT")
    known = {**COMMANDS, **sides.commands()}
    if argv and not argv[0].startswith("-") and argv[0] not in known:
        raise UsageError(f"python -m jaxlm.bench {argv[0]}: not a command here ({', '.join(known)}); a plugged-in "
                         "side's commands are registered when the project is installed (pip install -e '.[EXTRA]', "
                         "again after an update), and the sides installed here are: "
                         f"{', '.join(sides.plugins()) or 'none'}")
    chosen = None
    for name, (module, help) in known.items():
        sub = subparsers.add_parser(name, help=help, description=help, formatter_class=cli.HelpFormatter)
        if argv and argv[0] == name:
            chosen = importlib.import_module(module)
            chosen.add_args(sub)
    args = parser.parse_args(argv)  # exits on --help
    return chosen.main(args)
