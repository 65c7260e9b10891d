"""`python -m parity.bench WHAT`: jaxlm's benchmarks with the PyTorch reference beside them.

`model --framework torch|both` adds torchref rows (torch.compile or eager) to `python -m
jaxlm.bench model`'s JAX rows, measured in the same process; `nanogpt` is nanoGPT's CPU recipe
as a plain torchref loop. Every other WHAT is jaxlm's own. The torch side lives here so
that jaxlm never imports torch.
"""

from __future__ import annotations

import sys

from jaxlm import cli
from jaxlm.bench import core
from jaxlm.cli import bench

core.SIDES["torch"] = "parity.bench_torch"
COMMANDS = {**bench.COMMANDS,
            "model": ("jaxlm.bench.sweep", "time, FLOPs, MFU and memory of model steps; torchref side by side"),
            "nanogpt": ("parity.nanogpt", "the nanoGPT CPU recipe as a plain torchref training loop")}


def main(argv=None) -> int:
    return bench.main(argv, COMMANDS, prog="python -m parity.bench")


if __name__ == "__main__":
    sys.exit(cli.run(main))
