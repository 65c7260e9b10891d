"""Write a plan's Markdown report from its runs' records (and, with --records, copy those records)."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

from experiments.plan import format_value
from experiments.report import backend
from experiments.report.bench import (
    bench_rows,
    bench_scaling_sentences,
    bench_sentences,
    bench_table,
    max_batch_table,
)
from experiments.report.compare import (
    comparison_sentences,
    status_sentences,
    sweep_sentences,
    train_table,
)
from experiments.report.findings import findings_rows, findings_table
from experiments.report.output import report_dir, shrink_png
from experiments.report.parallel import parallel
from experiments.report.peft import peft, quantization, quantize_rows
from experiments.report.plots import plot_bench, plot_curves, plot_vs_axis
from experiments.report.seeds import (
    NOISE_SE,
    baseline_of,
    equal_token_sentences,
    group_settings,
    is_seeded,
    seed_sentences,
    settings_table,
)
from experiments.results import RESULT, load_results
from jaxlm.core.errors import DataError
from jaxlm.core.files import read_json, write_json

SPREAD_NOTE = (f"Values are the mean ± the sample standard deviation over seeds; a difference is *beyond noise* when the "
               f"difference of the means exceeds {NOISE_SE:g} standard errors (from the two settings' seed spreads, Welch's form; "
               f"about 1.6 standard deviations with 3 seeds each), otherwise *within noise*.")


def header(meta: dict, runs: list[dict], plan_dir: Path) -> list[str]:
    cfg = meta.get("report", {})
    name = meta.get("name", plan_dir.name)
    devices = sorted({r.get("device", "?") for r in runs if r.get("status") != "skipped"} or {"?"})
    commits = sorted({(r.get("git") or {}).get("commit") or "?" for r in runs})
    lines = [f"# {cfg.get('title', name)}", ""]
    if cfg.get("question"):
        lines += [f"**Question.** {cfg['question']}", ""]
    if meta.get("description"):
        lines += [meta["description"], ""]
    lines += [f"Plan `experiments/plans/{name}.toml`, size `{meta.get('size', '?')}`, device {', '.join(devices)}, "
              f"commit {', '.join(c[:10] for c in commits)}. Every number and sentence below is computed from the runs' "
              "records (result.json, metrics.jsonl, bench JSON) by `python -m experiments.report`.", ""]
    loads = [v for r in runs for k, v in (r.get("host") or {}).items() if k.startswith("load_avg") and isinstance(v, (int, float))]
    if loads:
        cpus = max((r.get("host") or {}).get("cpus") or 0 for r in runs)
        busy = "other work shared the machine, so times and throughputs are indicative only." if max(loads) > cpus else "the machine was otherwise idle."
        lines += [f"Host load (1-minute average) at run start/end ranged from {min(loads):.1f} to {max(loads):.1f} on {cpus} CPUs: {busy}", ""]
    return lines


def context(runs: list[dict], brows: list[dict]) -> dict:
    """What the findings' checks need beyond the settings: bench rows and the untrained model's loss (ln V)."""
    vocab = next(((r.get("config") or {}).get("model", {}).get("vocab_size") for r in runs if r.get("config")), None)
    return {"bench_rows": brows, "untrained_loss": math.log(vocab) if vocab else math.inf, "quantize_rows": quantize_rows(runs)}


def training_section(train_runs: list[dict], cfg: dict, out: Path) -> list[str]:
    baseline = cfg.get("baseline", {})
    lines = ["## Runs", ""]
    if is_seeded(train_runs):
        settings = group_settings(train_runs)
        lines += [settings_table(settings, baseline_of(settings, baseline)), "", SPREAD_NOTE, ""]
        lines += ["<details><summary>Every run</summary>", "", train_table(train_runs, {}), "", "</details>", ""]
    else:
        lines += [train_table(train_runs, baseline), ""]
        if baseline:
            lines += [f"Δ columns: change against the baseline ({', '.join(f'{k} = {format_value(v)}' for k, v in baseline.items())}) "
                      "with the same other settings.", ""]
    lines += ["Total time is the whole process (start-up, compilation, evaluation); step time and tokens/s are medians of "
              "the logged steps after the first.", ""]
    curves = plot_curves(train_runs, out, tuple(cfg.get("curves", ("step", "time")))) if any(r.get("metrics") for r in train_runs) else []
    for p in curves:
        lines += [f"![{p}]({p})", ""]
    if cfg.get("x"):
        p = plot_vs_axis(train_runs, cfg["x"], cfg.get("y", ["eval_loss", "eval_acc"]), bool(cfg.get("logx")), out)
        if p:
            lines += [f"![{p}]({p})", ""]
    return lines


def bench_section(runs: list[dict], brows: list[dict], out: Path) -> list[str]:
    lines = ["## Benchmarks", "", bench_table(brows), ""]
    mb = max_batch_table(runs)
    if mb:
        lines += ["Largest batch that fits (jaxlm.bench model --find-max-batch):", "", mb, ""]
    pngs, note = plot_bench(brows, out)
    if note:
        lines += [f"({note})", ""]
    for p in pngs:
        lines += [f"![{p}]({p})", ""]
    return lines


def sentences_for(runs: list[dict], train_runs: list[dict], brows: list[dict], cfg: dict) -> list[str]:
    out = status_sentences(runs)
    if is_seeded(train_runs):
        settings = group_settings(train_runs)
        out += seed_sentences(settings, baseline_of(settings, cfg.get("baseline", {})), cfg.get("x"))
        if cfg.get("equal_tokens") and cfg.get("x"):
            out += equal_token_sentences(settings, cfg["x"])
    else:
        out += comparison_sentences(train_runs, cfg.get("baseline", {})) + sweep_sentences(train_runs, cfg.get("x"))
    out += bench_sentences(brows, cfg.get("bench_baseline", {})) + bench_scaling_sentences(brows)
    for r in runs:
        for f in r.get("bench_max_batch") or []:
            limit = ((r.get("spec") or {}).get("args") or {}).get("memory_limit_gb")
            within = f"within an estimated {limit:g} GB" if limit else "before running out of device memory"
            out.append(f"Largest batch {within} ({r['name']}, {f['setting']}, context {f['context']}): {f['max_batch']}.")
    return out


def study_extras(cfg: dict, runs: list[dict], out: Path) -> tuple[list[str], list[str]]:
    """(findings, lines) of the studies with their own tables: [report] peft / quantization / parallel = true."""
    findings, lines = [], []
    for key, fn in (("peft", peft), ("quantization", quantization), ("parallel", lambda rs: parallel(rs, out))):
        if cfg.get(key):
            f, l = fn(runs)
            findings += f
            lines += l
    return findings, lines


def write_report(plan_dir: Path, out: Path | None = None, records: bool = False) -> Path:
    """The report in OUT/report.md (with its plots and findings.json); `records` also copies the runs' records to OUT/records."""
    plan_dir = Path(plan_dir)
    out = Path(out) if out else plan_dir / "report"
    runs = load_results(plan_dir)
    if not runs:
        raise DataError(f"{plan_dir}: no result.json under it; run the plan first (python -m experiments.run PLAN)")
    report_dir(out)
    meta = read_json(plan_dir / "plan.json", default={}) or {}
    cfg, name = meta.get("report", {}), meta.get("name", plan_dir.name)
    train_runs = [r for r in runs if r.get("kind") != "bench"]
    brows = bench_rows(runs)

    lines = header(meta, runs, plan_dir)
    rows = findings_rows(name, group_settings(train_runs), context(train_runs, brows))
    if rows:
        lines += ["## Findings vs the curriculum", "", findings_table(rows), "",
                  "Seed reports: student reports on this curriculum (TinyStories / WikiText-103, GPU, thousands of steps), or the "
                  "paper the row names where they do not cover the topic. "
                  "*Not resolved at this size*: the difference is within seed-to-seed noise here, or this run cannot measure it.", ""]
        write_json(out / "findings.json", {"plan": name, "size": meta.get("size"), "findings": rows})
    study_findings, study_lines = study_extras(cfg, runs, out)
    measured = backend.annotate(sentences_for(runs, train_runs, brows, cfg), backend.is_cpu(runs)) + study_findings
    lines += ["## Measured", ""] + [f"- {s}" for s in measured]
    lines += [""] + study_lines + backend.section(runs, brows)
    if train_runs:
        lines += training_section(train_runs, cfg, out)
    if brows:
        lines += bench_section(runs, brows, out)
    lines += ["## Reproduce", "", "```bash", f"python -m experiments.run {name} --size {meta.get('size', 'cpu')}",
              f"python -m experiments.report runs/{name} --out docs/results/{name} --records",
              f"python -m experiments.report docs/results/{name}/records --out DIR   # from the committed records", "```", ""]
    for png in out.glob("*.png"):
        shrink_png(png)
    if records:
        export_records(plan_dir, runs, out / "records")
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _portable(obj, prefixes: list[tuple[str, str]]):
    """Strings with this machine's paths rewritten (the repository root dropped, the interpreter named `python`)."""
    if isinstance(obj, str):
        for old, new in prefixes:
            obj = obj.replace(old, new)
        return obj
    if isinstance(obj, list):
        return [_portable(x, prefixes) for x in obj]
    if isinstance(obj, dict):
        return {k: _portable(v, prefixes) for k, v in obj.items() if k != "_dir"}
    return obj


def export_records(plan_dir: Path, runs: list[dict], dest: Path) -> None:
    """Copy plan.json and each run's result.json, metrics.jsonl and bench.json to DEST/RUN/, machine paths removed."""
    if dest.resolve() == plan_dir.resolve():
        return
    prefixes = [(sys.executable, "python"), (str(Path.cwd().resolve()) + "/", "")]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    meta = read_json(plan_dir / "plan.json", default=None)
    if meta:
        write_json(dest / "plan.json", _portable(meta, prefixes))
    for r in runs:
        src = Path(r["_dir"])
        (dest / src.name).mkdir()
        write_json(dest / src.name / RESULT, _portable(r, prefixes))
        if (src / "metrics.jsonl").is_file():
            shutil.copyfile(src / "metrics.jsonl", dest / src.name / "metrics.jsonl")
        if (src / "quantize.json").is_file():
            shutil.copyfile(src / "quantize.json", dest / src.name / "quantize.json")
        bench = read_json(src / "bench.json", default=None)
        if bench is not None:
            write_json(dest / src.name / "bench.json", _portable(bench, prefixes))
