"""Benchmarks, all behind `python -m jaxlm.bench WHAT` (model, data, decode, ops, parallel, plot; docs/benchmarks.md).

The model-step sweep (speed, FLOPs, MFU, memory; torchref rows beside them through `python -m parity.bench`):
- core: `Setting`, `Options`, `run_sweep`, `run_group`, `run_one`, `batch_fits`
- output: the console table, JSON and CSV of the rows
- jax_side: one row's measurement (the torch side: parity/bench_torch.py)
- breakdown: attention vs feed-forward vs output head, timed standalone
- op_profile: the `ops` command: a step's time op by op, from a profile of the compiled step
- matmul: the `matmul` command: the step's projection matmuls one by one, in GFLOP/s
- memory_profile: `--memory-profile` (pprof device-memory profiles, live buffers)
- plots: `plot_results(rows, out_dir)`
- sweep: the `model` command
The other commands: data (tokenizer and loader), decode (tokens/s with and without the
KV cache), ops (op-by-op profile), matmul (GFLOP/s of each projection matmul), parallel (the
train step on a device mesh, layouts).

Importing this package loads neither JAX nor torch (the CLI sets
XLA_PYTHON_CLIENT_PREALLOCATE first so both can share one GPU).
"""

from jaxlm.bench.core import COLUMNS, Options, Setting, run_one, run_sweep
from jaxlm.bench.output import format_table, read_rows, write_csv, write_rows


def plot_results(rows, out_dir):
    """PNG figures from sweep rows; see jaxlm.bench.plots.plot_results."""
    from jaxlm.bench.plots import plot_results as _plot

    return _plot(rows, out_dir)


__all__ = ["COLUMNS", "Options", "Setting", "format_table", "plot_results", "read_rows", "run_one",
           "run_sweep", "write_csv", "write_rows"]
