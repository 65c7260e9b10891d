"""Write a plan's Markdown report: `python -m deliverables.report runs/PLAN [--out DIR] [--records]`.

Everything in the report is computed from the runs' result.json, metrics.jsonl and
bench JSON: per-setting tables (mean and spread over seeds), sentences generated from
those numbers, learning curves, metric-versus-axis plots, the benchmark rows' figures for
bench runs, and a table of the curriculum's published findings against what the runs
measured. How a plan is presented comes from its `[report]` table (saved in plan.json):

- `question = "..."`: the question the study answers, printed first;
- `baseline = { axis = "label" }`: compare every setting with the one that has this
  label on `axis` and the same value on every other axis;
- `x = "axis"` (with `logx`): plot `y` (default eval_loss, eval_acc) against that axis;
- `bench_baseline = { field = value }`: the same comparison between bench rows.

`--records` also copies the small per-run records the report reads (result.json,
metrics.jsonl, bench.json) into OUT/records, so the report can be rebuilt from a clone:
`python -m deliverables.report docs/results/PLAN/records --out docs/results/PLAN`.

`build` writes a plan's report from the other modules (each says what it holds), `run_page` one training run's
page. The written report's figures and claims read these reports and the answers, so they live above both, in
`deliverables.written`. The command is `__main__`; this package exports nothing.
"""
