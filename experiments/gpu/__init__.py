"""The GPU campaign, `python -m experiments.gpu`: every GPU figure the curriculum asks for in one call.

Modules: `campaign` (the plan under a time budget, the runner, the command), `steps` (the measuring
steps and their H100 time estimates), `profile` (the profiler-trace step and its op-level summary),
`sections` (each step's Markdown section of report.md).
"""
