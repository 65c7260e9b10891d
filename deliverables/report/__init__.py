"""A plan's report (`build`), one training run's page (`run_page`), the command (`__main__`): docs/experiments.md
and docs/report.md. A plan's `[report]` table picks what to show: `title`, `question`, `baseline`, `x` (`logx`, `y`),
`curves`, `equal_tokens`, `bench_baseline`."""
