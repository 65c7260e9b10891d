"""The written report from every plan's results: `python -m experiments.report --all ROOT --out DIR [--pdf]`.

ROOT holds a directory per plan (`runs/` as experiments.run leaves it, or `docs/results/` with the
records committed beside each plan's report). Writes two documents, each as Markdown and as one
self-contained HTML page (python-markdown, PNGs inlined):

- report.md / report.html (and report.pdf with `--pdf`, through WeasyPrint): the 3-4 page report,
  `short`'s template with the computed numbers filled in, holding the three required plots;
- appendix.md / appendix.html: everything else, in the order CS395T asks for: experimental setup,
  profiling results, background on each optimisation (the pages of docs/techniques, included), the
  trade-off analysis, a section per extra, the studies, findings against the curriculum, limitations.

Each plan's part is its own report (experiments.report) regenerated from its records, so every number
is computed from the runs; a plan without records is named as missing.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

from experiments.plan import plan_names
from experiments.report import short
from experiments.report.build import stand_ins as build_stand_ins
from experiments.report.build import write_report
from experiments.report.output import report_dir
from experiments.results import load_results
from jaxlm.core.errors import DataError
from jaxlm.core.extras import require
from jaxlm.core.files import read_json

TECHNIQUES_DIR = Path(__file__).resolve().parents[2] / "docs" / "techniques"
TECHNIQUES = ("mixed-precision", "remat", "flash-attention", "sliding-window", "loss-chunking", "scanned-layers",
              "data-parallel", "fsdp", "tensor-parallel", "pipeline-parallel", "lora", "quantization", "kv-cache")
PROFILING, TRADEOFFS = ("profiling",), ("optimizations",)
EXTRAS = {"Parallelism": ("parallel", "fsdp", "tensor", "pipeline"), "LoRA and QLoRA": ("lora", "peft"),
          "Quantisation-aware training": ("qat", "quant")}  # a plan whose name contains one of these words


def extra_of(plan: str) -> str | None:
    return next((title for title, words in EXTRAS.items() if any(w in plan.lower() for w in words)), None)


# --------------------------------------------------------------------------- finding the plans


def plan_dir(root: Path, plan: str) -> Path | None:
    """The directory holding the plan's run directories (each with a result.json), or None."""
    base = root / plan
    if not base.is_dir():
        return None
    if any(base.glob("*/result.json")):
        return base
    found = sorted({p.parent.parent for p in base.rglob("result.json")})
    return found[0] if found else None


def all_plans(root: Path) -> list[str]:
    known = set(plan_names()) | {p.name for p in root.iterdir() if p.is_dir() and plan_dir(root, p.name)}
    return sorted(known)


def demote(text: str, levels: int = 2, images: str = "") -> list[str]:
    """Markdown lines with headings pushed down `levels` (outside code fences) and image paths prefixed."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            line = "#" * levels + line
        elif not fenced and images:
            line = re.sub(r"!\[([^]]*)\]\((?!https?:|/)([^)]+)\)", rf"![\1]({images}\2)", line)
        out.append(line)
    return out


def plan_part(root: Path, plan: str, out: Path, levels: int = 2) -> tuple[list[str], list[dict]]:
    """(the plan's regenerated report with its headings demoted, its runs), or a part naming it missing."""
    where = plan_dir(root, plan)
    if where is None:
        old = root / plan / "report.md"
        kept = (f" Its earlier report, [{plan}/report.md]({os.path.relpath(old.resolve(), out.resolve())}), was written "
                "from runs whose records are not kept, so none of its numbers are used here." if old.is_file() else "")
        return [f"### {plan}", "", f"**Missing**: no result.json under `{root / plan}`; "
                f"run `python -m experiments.run {plan}`.{kept}", ""], []
    (out / "plans" / plan / "findings.json").unlink(missing_ok=True)  # a stale one would outlive a changed plan
    path = write_report(where, out / "plans" / plan)
    lines = demote(path.read_text(), levels, f"plans/{plan}/")
    return [f"{lines[0]} (`{plan}`)", *lines[1:], ""], load_results(where)


# --------------------------------------------------------------------------- sections


def setup_section(runs: list[dict]) -> list[str]:
    from jaxlm.analysis.flops import param_counts
    from jaxlm.core.config import ModelConfig
    from jaxlm.core.typedconfig import from_dict

    data, models, hosts, versions = {}, {}, set(), {}
    for r in runs:
        d = corpus(r)
        if d:
            key = (", ".join(d.get("sources") or ["?"]), d.get("tokenizer"))
            data.setdefault(key, (d.get("tokens") or {}, set()))[1].add(r.get("plan", "?"))
        m = (r.get("config") or {}).get("model")
        if m:
            cfg = from_dict(ModelConfig, m)
            key = (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.d_ff, cfg.vocab_size, cfg.context_length)
            models.setdefault(key, (param_counts(cfg)["total"], set()))[1].add(r.get("plan", "?"))
        hosts.add((r.get("device", "?"), r.get("device_count", 1), (r.get("host") or {}).get("cpus")))
        for k, v in (r.get("versions") or {}).items():
            versions.setdefault(k, set()).add(v)
    out = ["## 1. Experimental setup", "", "### Datasets", ""]
    out += table(["corpus", "tokenizer", "train tokens", "validation tokens", "plans"],
                 [[s, str(t), count(tok.get("train")), count(tok.get("val")), ", ".join(sorted(p))]
                  for (s, t), (tok, p) in sorted(data.items())]) if data else ["No run records its corpus (missing).", ""]
    out += [f"{s}" for s in build_stand_ins(runs)] + ([""] if build_stand_ins(runs) else [])
    out += ["### Model configurations", ""]
    out += table(["d_model", "layers", "heads", "d_ff", "vocab", "context", "parameters", "plans"],
                 [[*map(str, k), f"{n:,}", ", ".join(sorted(p))] for k, (n, p) in sorted(models.items())]) \
        if models else ["No training run recorded its model (missing).", ""]
    out += ["### Hardware and software", ""]
    out += [f"- {kind} x{count}" + (f", host with {cpus} CPUs" if cpus else "") for kind, count, cpus in sorted(hosts, key=str)]
    out += [f"- {k} {', '.join(sorted(v))}" for k, v in sorted(versions.items())] or ["- software versions: not recorded (missing)"]
    return out + [""]


def count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else "not recorded"


def corpus(run: dict) -> dict | None:
    """What the run trained on: its record's `data`, else the data directory's meta.json if it is here,
    else the configured sources without token counts."""
    if isinstance(run.get("data"), dict):
        return run["data"]
    cfg = (run.get("config") or {}).get("data") or {}
    meta = read_json(Path(cfg["dir"]) / "meta.json", default=None) if cfg.get("dir") else None
    if isinstance(meta, dict):
        return {"tokenizer": meta.get("tokenizer"), "tokens": meta.get("tokens"),
                "sources": [Path(x.get("path", "?")).parent.name + "/" + Path(x.get("path", "?")).name
                            for x in (meta.get("sources") or {}).get("train", []) if isinstance(x, dict)]}
    return {"tokenizer": cfg.get("tokenizer"), "sources": list(cfg.get("source") or [])} if cfg else None


def relink(lines: list[str], src: Path, out: Path) -> list[str]:
    """Relative Markdown links of a page in `src` rewritten to work from `out`."""
    def fix(m):
        target = m.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return m.group(0)
        return f"[{m.group(1)}]({os.path.relpath(src / target, out.resolve())})"

    return [re.sub(r"(?<!!)\[([^]]*)\]\(([^)]+)\)", fix, line) for line in lines]


def techniques_section(out: Path) -> list[str]:
    lines = ["## 3. Background: the optimisations", ""]
    for name in TECHNIQUES:
        page = TECHNIQUES_DIR / f"{name}.md"
        if page.is_file():
            lines += relink(demote(page.read_text(), 2), TECHNIQUES_DIR, out) + [""]
        else:
            lines += [f"### {name}", "", f"(missing: no docs/techniques/{name}.md)", ""]
    return lines


def findings_section(out: Path, plans: list[str]) -> list[str]:
    """One table of every plan's findings vs the curriculum (each plan report's findings.json), with the tally."""
    rows, stand_ins = [], {}
    for plan in plans:
        found = read_json(out / "plans" / plan / "findings.json", default=None) or {}
        rows += [{"plan": plan, **r} for r in found.get("findings") or [] if isinstance(r, dict)]
        for sentence in found.get("stand_ins") or []:
            stand_ins.setdefault(sentence, set()).add(plan)
    lines = ["## 7. Findings against the curriculum", ""]
    if not rows:
        return lines + ["No plan report here checks a published finding (missing).", ""]
    tally: dict[str, int] = {}
    for r in rows:
        tally[r.get("verdict", "?")] = tally.get(r.get("verdict", "?"), 0) + 1
    lines += [f"{len(rows)} published findings checked: " + ", ".join(f"{n} {v}" for v, n in sorted(tally.items())) + ".", ""]
    lines += [f"{sentence} (plans {', '.join(f'`{p}`' for p in sorted(used))})" for sentence, used in stand_ins.items()]
    lines += [""] if stand_ins else []
    return lines + table(["plan", "finding", "seed reports", "jaxlm measured", "verdict"],
                         [[f"`{r['plan']}`", *(str(r.get(k, "–")) for k in ("claim", "seen", "measured", "verdict"))] for r in rows])


def limitations_section(runs: list[dict], missing: list[str]) -> list[str]:
    gpu = sorted({r.get("device", "?") for r in runs if r.get("platform") == "gpu"})
    skipped = [r for r in runs if r.get("status") == "skipped"]
    out = ["## 8. Limitations", "",
           "- The XLA CPU backend is faithful for results (losses, samples) but not for performance: it drops remat's "
           "recomputation, computes bfloat16 through float32, has no fused (cuDNN) attention and its memory figures "
           "do not show what remat or bfloat16 save on a GPU. CPU throughputs are of a small shared machine.",
           f"- GPU results: {'from ' + ', '.join(gpu) if gpu else '**pending**: no run under this root ran on a GPU'}."]
    if skipped:
        out.append(f"- {len(skipped)} run(s) were skipped on this device: "
                   + "; ".join(f"`{r['name']}` ({r.get('reason') or 'no reason'})" for r in skipped) + ".")
    if missing:
        out.append("- Plans without results here (missing): " + ", ".join(f"`{p}`" for p in missing) + ".")
    return out + [""]


def learning_curve(out: Path) -> list[str]:
    """A single run's page (`python -m experiments.report RUN --out DIR/learning_curve`) when DIR holds one."""
    page = out / "learning_curve" / "report.md"
    if not page.is_file():
        return ["The learning-curve page of a single run is not in this directory: `python -m experiments.report RUN_DIR "
                f"--out {out}/learning_curve` adds it.", ""]
    lines = demote(page.read_text(), 2, "learning_curve/")
    return [lines[0].replace("### Training run", "### Learning curve and sample: training run", 1), *lines[1:], ""]


def gpu_section(runs: list[dict], root: Path, out: Path) -> list[str]:
    """GPU runs among the plans, and the GPU campaign's report (ROOT/gpu/report.md) included when it exists."""
    campaign = root / "gpu" / "report.md"
    if campaign.is_file():
        images = os.path.relpath(campaign.parent.resolve(), out.resolve()) + "/"
        return ["### GPU results", ""] + demote(campaign.read_text(), 3, images) + [""]
    gpu = [r for r in runs if r.get("platform") == "gpu" and r.get("status") == "ok"]
    if not gpu:
        return ["### GPU results", "", "**Pending**: no run under this root ran on a GPU. On a GPU machine, "
                "`python -m experiments.run profiling --size gpu` and `python -m experiments.run optimizations --size gpu` "
                "add them (the plans pick their GPU sizes there by default).", ""]
    kinds = sorted({f"{r.get('device')} x{r.get('device_count', 1)}" for r in gpu})
    plans = sorted({r.get("plan", "?") for r in gpu})
    return ["### GPU results", "", f"{len(gpu)} completed runs on {', '.join(kinds)}, in the plans "
            + ", ".join(f"`{p}`" for p in plans) + "; their numbers are in those plans' sections.", ""]


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


# --------------------------------------------------------------------------- the document


def build(root: Path, out: Path) -> tuple[list[str], list[dict], list[str], list[str]]:
    """(the appendix's lines, every run, every plan, the plans without records)."""
    plans = all_plans(root)
    parts, runs, missing = {}, {}, []
    for plan in plans:
        parts[plan], runs[plan] = plan_part(root, plan, out)
        if not runs[plan]:
            missing.append(plan)
    every = [r for rs in runs.values() for r in rs]
    lines = ["# Appendix: every plan's report, the background pages and the run tables", "",
             f"The appendix of the [report](report.md). Generated by `python -m experiments.report --all {root}` from "
             f"{len(every)} run records of {len(plans) - len(missing)} of {len(plans)} plans; every number is computed "
             "from them.", ""]
    lines += setup_section(every)
    lines += (["## 2. Profiling results", "", "The three required plots are in the [report](report.md).", ""]
              + gpu_section(every, root, out) + part(parts, runs, PROFILING))
    lines += techniques_section(out)
    lines += ["## 4. Trade-off analysis", ""] + part(parts, runs, TRADEOFFS)
    lines += ["## 5. Extras", ""]
    for title, words in EXTRAS.items():
        found = [p for p in plans if extra_of(p) == title and runs.get(p)]
        lines += [f"### {title}", ""] + (part(parts, runs, found) if found else
                                        [f"**Missing**: no plan whose name contains {' or '.join(f'`{w}`' for w in words)} "
                                         f"has results under `{root}`.", ""])
    lines += ["## 6. Training studies", ""] + learning_curve(out) + part(parts, runs, [p for p in plans if p not in (*PROFILING, *TRADEOFFS, "gpu")
                                                                 and not extra_of(p)])
    lines += findings_section(out, [p for p in plans if runs.get(p)]) + limitations_section(every, missing)
    return lines, every, plans, missing


def part(parts: dict, runs: dict, names) -> list[str]:
    return [line for name in names for line in parts.get(name, [f"### {name}", "", "**Missing**.", ""])]


STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.45}"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}"
         "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}"
         "@page{size:A4;margin:1.2cm}"  # print: A4 in 9 pt, so the report's 3 plots and 2,500 words fit 4 pages
         "@media print{body{font-size:9pt;line-height:1.25;margin:0;max-width:none}table{font-size:7.5pt}"
         "img{max-height:5.5cm}h1{font-size:14pt}h2{font-size:12pt}h3{font-size:10.5pt}}")


def to_html(markdown_text: str, base: Path, title: str = "jaxlm report") -> str:
    """A self-contained page: python-markdown's HTML with every local PNG inlined as base64, and links to the
    report's other Markdown pages in this folder pointed at their HTML."""
    markdown = require("markdown")

    def inline(m):
        path = base / m.group(1)
        if not path.is_file():
            return m.group(0)
        return f'src="data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}"'

    markdown_text = markdown_text.replace("<details>", '<details markdown="1">')  # tables inside render too
    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code", "toc", "md_in_html"])
    body = re.sub(r'src="([^"]+\.png)"', inline, body)
    body = re.sub(r'href="(report|appendix)\.md(#[^"]*)?"', r'href="\1.html\2"', body)
    return f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title><style>{STYLE}</style></head><body>{body}</body></html>"


def write_pdf(html: str, path: Path) -> int:
    """The page printed to PDF by WeasyPrint (the `pdf` extra; it needs the system Pango library); its page count."""
    weasyprint = require("weasyprint")
    document = weasyprint.HTML(string=html, base_url=str(path.parent)).render()
    document.write_pdf(path)
    return len(document.pages)


def write_all(root: Path, out: Path, pdf: bool = False) -> Path:
    """report.md/.html (+ .pdf) and appendix.md/.html in OUT; without `pdf` a report.pdf left there is removed (stale)."""
    root, out = Path(root), Path(out)
    if not root.is_dir():
        raise DataError(f"--all {root}: no such directory; give runs/ or docs/results")
    report_dir(out)
    lines, every, plans, missing = build(root, out)
    appendix = "\n".join(lines)
    (out / "appendix.md").write_text(appendix)
    (out / "appendix.html").write_text(to_html(appendix, out, "jaxlm report: appendix"))
    text = short.build(root, out, every, plans, missing, corpus)
    (out / "report.md").write_text(text)
    html = to_html(text, out)
    (out / "report.html").write_text(html)
    if pdf:
        print(f"{out / 'report.pdf'}: {write_pdf(html, out / 'report.pdf')} pages")
    else:
        (out / "report.pdf").unlink(missing_ok=True)
    return out / "report.md"
