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

Modules: `format` (numbers, tables), `seeds` (settings over seeds, "within noise") and `noise`
(intervals and tests), `compare` (per-run comparisons), `bench` (bench rows), `findings` (the
published findings and their checks), `sections` (the one-plan sections a plan's [report] table switches on:
`parallel`, `peft` and quantization, `tokenizer`, `divergence`, and `backend`, what a CPU run can show of
bfloat16 and remat), `plots` and `charts`, `output` (the report's folder, matplotlib, PNGs), `build` (a plan's
report). `run_page` writes one training run's page (`python -m deliverables.report RUN_DIR`). The written
report's figures and claims read these reports and the curriculum's answers, so they live above both, in
`deliverables.written`. The command is `__main__`; this package exports nothing.
"""
