"""`python -m deliverables.report`: a plan's report, one training run's page, or a bench JSON file's figures."""

import sys
from pathlib import Path

from deliverables.report import run_page
from deliverables.report.build import write_report
from deliverables.report.charts import bench_figures
from deliverables.report.output import report_dir
from experiments.results import load_bench
from jaxlm import cli
from jaxlm.core import stop
from jaxlm.core.errors import DataError, UsageError


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(command="deliverables.report", formatter_class=cli.HelpFormatter,
                           description="A plan's report, one training run's page, or the figures of a "
                           "`jaxlm.bench model --json` file (docs/experiments.md, docs/report.md)")
    p.add_argument("plan_dir", nargs="?", help="runs/PLAN, its committed records (docs/results/PLAN/records), "
                   "a training run (metrics.jsonl + config.toml) or a bench JSON file")
    p.add_argument("--out", help="output directory (default: PLAN_DIR/report)")
    p.add_argument("--records", action="store_true", help="also copy the runs' records to OUT/records")
    p.add_argument("--compile", action="store_true", help="compile each CPU-measured step for an H100 (the "
                   "'gpu-compile' extra) unless docs/results/compiled/h100-80gb.json has it")
    run_page.add_args(p)
    args = p.parse_args(argv)
    if args.plan_dir is None:
        raise UsageError("python -m deliverables.report: give PLAN_DIR, a run directory or a bench JSON file")
    source = Path(args.plan_dir)
    bench = source.suffix == ".json"
    out = Path(args.out) if args.out else source.with_suffix("") if bench else source / "report"
    # An interrupt (Ctrl-C, SIGTERM) leaves figures without the report.md written last: the line says so.
    left = "not every figure was written" if bench else "report.md was not written (its figures may be partial)"
    with stop.noting(lambda: f"{out}: {left}; run the same command again"):
        if bench and not source.is_file():
            raise DataError(f"{source}: no such file; give a `python -m jaxlm.bench model --json` file")
        if bench:
            names = bench_figures(load_bench(source)[0], report_dir(out))
            print("\n".join(str(out / n) for n in names) or f"{source}: no figure: no line of its rows has two points")
            return 0
        if run_page.is_run_dir(source):
            path = run_page.write_run_report(source, out, args)
        else:
            path = write_report(source, out, args.records, args.compile)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
