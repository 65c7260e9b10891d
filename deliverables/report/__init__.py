"""Write a plan's Markdown report: `python -m deliverables.report runs/PLAN [--out DIR] [--records]`.

Every table, sentence and plot is computed from the runs' result.json, metrics.jsonl and bench JSON; the plan's
`[report]` table (saved in plan.json) says how to present them: `question`, `baseline = { axis = "label" }`,
`x = "axis"` (with `logx`, `y`), `bench_baseline = { field = value }`. `--records` copies the records the report
reads into OUT/records, so it can be rebuilt from a clone. `build` writes a plan's report, `run_page` one training
run's page; the command is `__main__`.
"""
