"""The PyTorch reference as a side of `python -m jaxlm.bench` (entry point `torch` of the group
`jaxlm.bench.sides`, declared in pyproject.toml; `jaxlm.bench.sides` reads it).

`--framework torch|both` adds torchref rows measured by `parity.bench_torch` (torch.compile or eager, in
the same process as jaxlm's), and the `nanogpt` command runs nanoGPT's CPU recipe as a plain torchref
loop (`parity.nanogpt`). This module imports no torch: jaxlm reads it to list the side, its options and
its command, and imports the measuring module only when torch rows are asked for.
"""

from jaxlm.bench.sides import Plugin


def add_args(group) -> None:
    """The torch side's options of `python -m jaxlm.bench model` (read back from `Options.side_args`)."""
    group.add_argument("--no-compile", action="store_true", help="run torchref eagerly (no torch.compile)")
    group.add_argument("--torch-optimizer", default="torch", choices=["torch", "torchref"],
                       help="torch.optim.AdamW (foreach/fused) or torchref's own AdamW on torch train steps")


torch = Plugin(
    module="parity.bench_torch", summary="torchref, the PyTorch reference (parity)", extra="torch", add_args=add_args,
    commands={"nanogpt": ("parity.nanogpt", "nanoGPT's CPU recipe as a plain torchref training loop, alone or beside "
                          "jaxlm's train step (the 'torch' extra)")},
)
