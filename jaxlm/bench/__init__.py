"""Benchmark jaxlm (and torchref beside it): speed, FLOPs, MFU, memory, plots.

`python -m jaxlm.bench --help` for the command line; docs/benchmarks.md for the
columns and conventions. The modules:

- core: `Setting`, `Options`, `run_sweep`, `run_one`, `find_max_batch`, table/JSON/CSV output
- jax_side / torch_side: one row's measurement in each framework
- breakdown: attention vs feed-forward vs output head, timed standalone
- memory: `--memory-profile` (pprof device-memory profiles, live buffers, torch snapshot)
- plots: `plot_results(rows, out_dir)`

Importing this package loads neither JAX nor torch (the CLI sets
XLA_PYTHON_CLIENT_PREALLOCATE first so both can share one GPU).
"""

from jaxlm.bench.core import COLUMNS, Options, Setting, find_max_batch, format_table, read_rows, run_one, run_sweep, write_csv, write_rows


def plot_results(rows, out_dir):
    """PNG figures from sweep rows; see jaxlm.bench.plots.plot_results."""
    from jaxlm.bench.plots import plot_results as _plot

    return _plot(rows, out_dir)


__all__ = ["COLUMNS", "Options", "Setting", "find_max_batch", "format_table", "plot_results", "read_rows", "run_one",
           "run_sweep", "write_csv", "write_rows"]
