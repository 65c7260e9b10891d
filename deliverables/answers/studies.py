"""learning_rate and generate, answered from the studies' records and a trained run's page."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path

from deliverables.answers import prose
from deliverables.common import plan_runs, table
from deliverables.report.sections.divergence import DEFINITION, by_rate, edge, edge_sentence, untrained_loss

LR_PLAN, LR_AXIS = "lr_sweep", "optim.lr"
WORDS = {"trained": "trained", "failed": "failed to learn", "diverged": "diverged"}


def learning_rate_section(root: Path) -> list[str]:
    runs = plan_runs(root, LR_PLAN)
    points = by_rate(runs, LR_AXIS)
    if not points:
        return ["### learning_rate", "", *prose("missing", plan=LR_PLAN, what="records", root=root)]
    e = edge(points, untrained_loss(runs))
    rows = []
    for lr, runs in points:
        losses = [r["metrics"]["eval_loss"] for r in runs
                  if r.get("status") == "ok" and (r.get("metrics") or {}).get("eval_loss") is not None]
        std = statistics.stdev(losses) if len(losses) > 1 else 0.0
        kinds = e["kinds"][lr]
        rows.append([f"{lr:g}", str(len(runs)), f"{statistics.mean(losses):.3f} ± {std:.3f}" if losses else "–",
                     ", ".join(f"{kinds.count(k)} {WORDS[k]}" for k in WORDS if k in kinds)])
    folk = []
    if e["trained"] and e["broken"]:
        folk = prose("folk", best=e["broken"] / e["best"], rates=len(points), bracket=e["broken"] / e["trained"],
                     verdict="holds loosely" if e["broken"] / e["best"] <= 10 else "does not hold",
                     trained=e["trained"], broken=e["broken"])
    setup = defaultdict(lambda: "?", (points[0][1][0].get("spec") or {}).get("set") or {})
    return prose("learning_rate", plan=LR_PLAN, s=setup, definition=DEFINITION, e=e, edge=edge_sentence(e), folk=folk,
                 table=table(["peak lr", "seeds", "validation loss", "seeds by outcome"], rows, "lr"))


def generate_section(page: Path, link: str) -> list[str]:
    """The sample, its decoding settings and the model's facts from a run's page (`python -m deliverables.report`)."""
    text = page.read_text() if page.is_file() else ""
    sample = re.search(r"## Sample\n(.*?)\n```text\n(.*?)\n```\n+(.*?)(?:\n\n|$)", text, re.S)
    if not sample:
        return prose("missing_sample", page=page)
    row = lambda key: (re.search(rf"^\| {key} \| (.*?) \|$", text, re.M) or [None, None])[1]
    params = (re.search(r"([\d,]+) parameters", row("model") or "") or [None, "?"])[1]
    tokens = " and reads bytes, not BPE tokens" if "bytes tokenizer" in (row("data") or "") else ""
    quoted = "\n".join("> " + line if line else ">" for line in sample.group(2).splitlines())
    return prose("generate", title=text.splitlines()[0].lstrip("# "), link=link, model=row("model"), data=row("data"),
                 steps=row("steps"), loss=row("final validation loss"), decoding=sample.group(1).strip(),
                 quoted=quoted, repetition=sample.group(3).strip(), params=params, tokens=tokens)
