"""Write a plan's Markdown report from its runs' records (and, with --records, copy those records)."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

from deliverables.report import seeds
from deliverables.report.bench import bench_rows, bench_scaling_sentences, bench_sentences, bench_table, max_batch_table
from deliverables.report.charts import bench_figures
from deliverables.report.compare import status_sentences, train_table
from deliverables.report.findings import findings_rows, findings_table
from deliverables.report.noise import Family, judged
from deliverables.report.output import images, report_dir
from deliverables.report.plots import plot_curves, plot_vs_axis
from deliverables.report.sections import Plan, backend, plan_sections
from deliverables.report.sections.divergence import untrained_loss
from deliverables.report.sections.peft import quantize_rows
from experiments.results import RESULT, load_results
from jaxlm.core.errors import DataError
from jaxlm.core.files import atomic_write, read_json, write_json

INTERVAL_NOTE = ("Values are the mean over seeds ± the half-width of its 95 % interval (t-distribution with n - 1 "
                 "degrees of freedom: 4.30 standard errors with 3 seeds, 2.78 with 5); differences are tested with "
                 "Welch's t-test, paired differences (the same seed) with a one-sample t-test.")


# Training text that stands in for a corpus this machine does not have: one sentence, said wherever its numbers appear.
STAND_INS = {
    "wikitext-2/test.txt": "WikiText stand-in: WikiText-2's test split (241k words) is the training text in place of "
                           "WikiText-103's 103M-word train split (a download), and validation is WikiText-2's valid "
                           "split, whose articles are WikiText-103's validation articles.",
}


def stand_ins(runs: list[dict]) -> list[str]:
    """The STAND_INS sentences of the sources the runs trained on."""
    sources = {src for r in runs for src in (((r.get("config") or {}).get("data") or {}).get("source") or [])}
    return [sentence for src, sentence in STAND_INS.items() if src in sources]


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
              f"commit {', '.join(c[:10] for c in commits)}{_provenance(runs)}. Every number and sentence below is "
              "computed from the runs' records (result.json, metrics.jsonl, bench JSON) by "
              "`python -m deliverables.report`.", ""]
    lines += [f"**{s}**" for s in stand_ins(runs)] + ([""] if stand_ins(runs) else [])
    loads = [v for r in runs for k, v in (r.get("host") or {}).items()
             if k.startswith("load_avg") and isinstance(v, (int, float))]
    if loads:
        cpus = max((r.get("host") or {}).get("cpus") or 0 for r in runs)
        busy = ("other work shared the machine, so times and throughputs are indicative only." if max(loads) > cpus
                else "the machine was otherwise idle.")
        lines += [f"Host load (1-minute average) at run start/end ranged from {min(loads):.1f} to {max(loads):.1f} "
                  f"on {cpus} CPUs: {busy}", ""]
    machines = sorted({_machine(r["host"]) for r in runs if (r.get("host") or {}).get("cpu_model")})
    if machines:
        lines += [f"Times were measured on {'; '.join(machines)}.", ""]
    return lines


def _machine(host: dict) -> str:
    """The CPU a record ran on, as its host block names it (the family and model where recorded)."""
    family = f", {host['cpu_family_model']}" if host.get("cpu_family_model") else ""
    vector = f"; {', '.join(host['vector_extensions'])}" if host.get("vector_extensions") else ""
    return f"{host['cpu_model']} ({host.get('cpus', '?')} CPUs{family}{vector})"


def _eval_tokens_note(runs: list[dict]) -> str:
    """' Every evaluation scored the same 65,536 validation tokens ...' when the records say how many."""
    counts = {int(n) for r in runs if isinstance(n := (r.get("metrics") or {}).get("eval_tokens"), (int, float))}
    if not counts:
        return ""
    if len(counts) == 1:
        return (f" Every evaluation scored the same {counts.pop():,} validation tokens (data.eval_tokens: the start of "
                "val.bin in windows of the run's context, whatever its batch size).")
    return (f" Evaluations scored {', '.join(f'{n:,}' for n in sorted(counts))} validation tokens "
            "(data.eval_tokens differs).")


def _provenance(runs: list[dict]) -> str:
    """' (every record from a committed tree)', or how many came from uncommitted changes and drafts."""
    gits = [r.get("git") or {} for r in runs]
    dirty, drafts = sum(bool(g.get("dirty")) for g in gits), sum(bool(g.get("draft")) for g in gits)
    if not dirty:
        return " (every record from a committed tree)"
    return (f" ({dirty} of {len(runs)} records from a tree with uncommitted changes"
            + (f", {drafts} marked draft)" if drafts else ")"))


def training_section(train_runs: list[dict], cfg: dict, out: Path, runs_table: str, noise: Family) -> list[str]:
    """The settings' table (`runs_table`, judged in `noise`), every run's table and the plots."""
    lines = ["## Runs", "", runs_table, ""]
    lines += [f"Intervals and *beyond noise* as under *Measured* (one Holm family of {noise.size} comparison"
              f"{'s' * (noise.size != 1)}: the whole report).", ""] if noise.size else []
    lines += ["<details><summary>Every run</summary>", "", train_table(train_runs), "", "</details>", ""]
    lines += ["Total time is the whole process (start-up, compilation, evaluation); step time and tokens/s are "
              "medians of the logged steps after the first." + _eval_tokens_note(train_runs), ""]
    pngs = (plot_curves(train_runs, out, tuple(cfg.get("curves", ("step", "time"))))
            if any(r.get("metrics") for r in train_runs) else [])
    if cfg.get("x"):
        y = cfg.get("y", ["eval_loss", "eval_acc"])
        pngs.append(plot_vs_axis(train_runs, cfg["x"], y, bool(cfg.get("logx")), out))
    return lines + images(pngs)


def bench_section(runs: list[dict], brows: list[dict], out: Path) -> list[str]:
    lines = ["## Benchmarks", "", bench_table(brows), ""]
    mb = max_batch_table(runs)
    if mb:
        lines += ["Largest batch that fits (jaxlm.bench model --find-max-batch):", "", mb, ""]
    try:
        pngs = bench_figures(brows, out)
    except ImportError as e:  # the plots extra
        return lines + [f"(bench plots unavailable ({e}))", ""]
    except Exception as e:  # a plotting failure must not lose the tables
        return lines + [f"(bench plots failed: {type(e).__name__}: {e})", ""]
    return lines + images(pngs)


def measured_parts(plan: Plan, brows: list[dict], noise: Family):
    """(sentences, the one-plan sections' lines, the settings' table), judged in one Holm family."""
    section_findings, section_lines = plan_sections(replace(plan, noise=noise))
    cfg, out = plan.cfg, status_sentences(plan.runs)
    bases = seeds.baseline_of(plan.settings, cfg.get("baseline", {}))
    table = seeds.settings_table(plan.settings, bases, noise)
    out += seeds.seed_sentences(plan.settings, bases, noise)
    if cfg.get("equal_tokens") and cfg.get("x"):
        out += seeds.equal_token_sentences(plan.settings, cfg["x"], noise)
    out += bench_sentences(brows, cfg.get("bench_baseline", {}), noise) + bench_scaling_sentences(brows)
    for r in plan.runs:
        for f in r.get("bench_max_batch") or []:
            limit = ((r.get("spec") or {}).get("args") or {}).get("memory_limit_gb")
            within = f"within an estimated {limit:g} GB" if limit else "before running out of device memory"
            out.append(f"Largest batch {within} ({r['name']}, {f['setting']}, context {f['context']}): "
                       f"{f['max_batch']}.")
    return backend.annotate(out, backend.is_cpu(plan.runs)) + section_findings, section_lines, table


def write_report(plan_dir: Path, out: Path, records: bool = False, compile: bool = False) -> Path:
    """The report in OUT/report.md (with its plots and findings.json), the runs' records in OUT/records with
    `records`; `compile` compiles for an H100 the CPU-measured steps whose figures are not in the cache yet."""
    plan_dir, out = Path(plan_dir), Path(out)
    runs = load_results(plan_dir)
    if not runs:
        raise DataError(f"{plan_dir}: no result.json under it; run the plan first (python -m experiments.run PLAN)")
    report_dir(out)
    meta = read_json(plan_dir / "plan.json", default={}) or {}
    cfg, name = meta.get("report", {}), meta.get("name", plan_dir.name)
    train_runs = [r for r in runs if r.get("kind") != "bench"]
    brows = bench_rows(runs)

    lines = header(meta, runs, plan_dir)
    settings = seeds.group_settings(train_runs)
    # What the findings' checks need beyond the settings: bench rows, ln V, the quantisation rows.
    ctx = {"bench_rows": brows, "untrained_loss": untrained_loss([r for r in train_runs if r.get("config")]),
           "quantize_rows": quantize_rows(train_runs)}
    plan = Plan(runs, settings, cfg, ctx, out, Family())
    # One Holm family for the whole report: a comparison in the findings table and under Measured gets one verdict.
    (rows, (measured, section_lines, runs_table)), noise = judged(lambda noise: (
        findings_rows(name, settings, {**ctx, "noise": noise}), measured_parts(plan, brows, noise)))
    if rows:
        lines += ["## Findings vs the curriculum", "", findings_table(rows), "",
                  "Seed reports: student reports on this curriculum (TinyStories / WikiText-103, GPU, thousands of "
                  "steps), or the paper the row names where they do not cover the topic. *Not resolved at this size*: "
                  "the difference is within seed-to-seed noise here, or this run cannot measure it. "
                  + INTERVAL_NOTE + " " + noise.note(), ""]
        judged_by = {"interval": "95 % t", "correction": "Holm", "comparisons": noise.size}
        write_json(out / "findings.json", {"plan": name, "size": meta.get("size"), "findings": rows,
                                           "stand_ins": stand_ins(runs), "noise": judged_by})
    lines += ["## Measured", ""] + [f"- {s}" for s in measured]
    if noise.size:
        lines += ["", INTERVAL_NOTE + " " + noise.note()]
    lines += [""] + section_lines + backend.section(runs, brows, compile)
    if train_runs:
        lines += training_section(train_runs, cfg, out, runs_table, noise)
    if brows:
        lines += bench_section(runs, brows, out)
    lines += ["## Reproduce", "", "```bash", f"python -m experiments.run {name} --size {meta.get('size', 'cpu')}",
              f"python -m deliverables.report runs/{name} --out docs/results/{name} --records",
              f"python -m deliverables.report docs/results/{name}/records --out DIR   # from the committed records",
              "```", ""]
    if records:
        export_records(plan_dir, meta, runs, out / "records")
    return atomic_write(out / "report.md", "\n".join(lines))


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


def export_records(plan_dir: Path, meta: dict, runs: list[dict], dest: Path) -> None:
    """Copy plan.json and each run's result.json, metrics.jsonl and bench.json to DEST/RUN/, machine paths removed."""
    if dest.resolve() == plan_dir.resolve():
        return
    prefixes = [(sys.executable, "python"), (str(Path.cwd().resolve()) + "/", "")]
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if meta:
        write_json(dest / "plan.json", _portable(meta, prefixes))
    for r in runs:
        src = Path(r["_dir"])
        (dest / src.name).mkdir()
        write_json(dest / src.name / RESULT, _portable(r, prefixes))
        for extra in ("metrics.jsonl", "quantize.json", "tokenizer.json"):  # (the last two: a command run's rows)
            if (src / extra).is_file():
                shutil.copyfile(src / extra, dest / src.name / extra)
        bench = read_json(src / "bench.json", default=None)
        if bench is not None:
            write_json(dest / src.name / "bench.json", _portable(bench, prefixes))
