"""`python -m experiments.report`: a plan's report, one training run's page, or the written report (--all)."""

import sys
from pathlib import Path

from experiments.report import run_page
from experiments.report.build import write_report
from experiments.report.written import write_all
from jaxlm import cli
from jaxlm.core.errors import UsageError


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog="python -m experiments.report", formatter_class=cli.HelpFormatter,
                           description="Markdown report (findings, tables, plots) for a plan's runs, "
                           "or the learning curves and a sample of one training run")
    p.add_argument("plan_dir", nargs="?", help="the plan's run directory (runs/PLAN), its committed records "
                   "(docs/results/PLAN/records), or one training run (metrics.jsonl + config.toml)")
    p.add_argument("--all", metavar="ROOT", help="one written report (Markdown + HTML) from every plan under ROOT (runs/ or docs/results)")
    p.add_argument("--out", help="output directory (default: PLAN_DIR/report; with --all: required)")
    p.add_argument("--pdf", action="store_true", help="with --all: also report.pdf (the 'pdf' extra: WeasyPrint, "
                   "which needs the system Pango library)")
    p.add_argument("--records", action="store_true", help="also copy the runs' records (result.json, metrics.jsonl, bench.json) to OUT/records")
    p.add_argument("--compile", action="store_true", help="compile each CPU-measured step for an 80 GB H100 (XLA's GPU "
                   "compiler, the 'gpu-compile' extra) unless docs/results/compiled/h100-80gb.json has it already")
    run_page.add_args(p)
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else None
    cli.check_option(bool(args.all) or not args.pdf, "--pdf", True, "goes with --all ROOT --out DIR")
    if args.all:
        cli.check_option(args.plan_dir is None and out is not None, "--all", args.all, "takes --out DIR and no PLAN_DIR")
        path = write_all(Path(args.all), out, args.pdf)
    elif args.plan_dir is None:
        raise UsageError("python -m experiments.report: give PLAN_DIR, a run directory, or --all ROOT --out DIR")
    elif run_page.is_run_dir(Path(args.plan_dir)):
        path = run_page.write_run_report(Path(args.plan_dir), out, args)
    else:
        path = write_report(Path(args.plan_dir), out, args.records, args.compile)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
