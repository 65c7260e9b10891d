"""The GPU campaign, `python -m deliverables.gpu`: every GPU figure the curriculum asks for in one call, each timed
one beside the roofline's prediction; `python3 -m deliverables.gpu.offline` runs it on an offline GPU machine as it is.

Modules: `campaign` (the plan under a time budget, the runner, the command), `steps` (the measuring steps and
their H100 time estimates), `profile` (the profiler-trace step and its op-level summary), `predict` (the
predictions beside the measurements, per kernel group against a trace), `sections` (each step's Markdown section
of report.md); `offline` (the offline machine's one command), `carry` (the wheels and corpus it carries), `check` (its
correctness smoke), `merge` (its results into docs/results/gpu/).
"""
