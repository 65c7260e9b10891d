"""Benchmarks, all behind `python -m jaxlm.bench WHAT` (model, data, decode, ops, matmul, parallel; docs/benchmarks.md).

The model-step sweep (speed, FLOPs, MFU, memory; other frameworks' rows beside them from plugged-in sides):
- measure: `BenchCase`, `Options`, `run_sweep`, `run_group`, `run_one` (what a row is, how rows are timed);
  `batch_fits` (through jaxlm.analysis.memory.search_largest)
- timing: the one timing loop (`time_calls`), the settling between interleaved calls, the machine's load
- sides: the measuring sides: the library's own and the plugins found through entry points
- steps: the library's side: the steps training builds, compiled apart (the reference's side is a plugin
  of parity)
- output: the console table, JSON and CSV of the rows
- breakdown: attention vs feed-forward vs output head, timed standalone
- op_profile: the `ops` command: a step's time op by op, from a profile of the compiled step
- matmul: the `matmul` command: the step's projection matmuls one by one, in GFLOP/s
- memory_profile: `--memory-profile` (pprof device-memory profiles, live buffers)
- sweep: the `model` command; commands: the command line of them all
The other commands: data (tokenizer and loader), decode (tokens/s with and without the
KV cache), ops (op-by-op profile), matmul (GFLOP/s of each projection matmul), parallel (the
train step on a device mesh, layouts). Figures of the rows are drawn by the lab (`deliverables.report`).

Importing this package loads no framework (the command sets XLA_PYTHON_CLIENT_PREALLOCATE first so that
two frameworks can share one GPU).
"""
