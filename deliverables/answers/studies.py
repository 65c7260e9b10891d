"""learning_rate and generate, answered from the studies' records and a trained run's page."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from deliverables.answers import prose
from deliverables.common import plan_runs, table
from deliverables.report.sections.divergence import DEFINITION, by_rate, edge, edge_sentence, untrained_loss

LR_PLAN, LR_AXIS = "lr_sweep", "optim.lr"
WORDS = {"trained": "trained", "failed": "failed to learn", "diverged": "diverged"}


def learning_rate_section(root: Path) -> list[str]:
    runs = plan_runs(root, LR_PLAN)
    points = by_rate(runs, LR_AXIS)
    out = ["### learning_rate", ""]
    if not points:
        return out + prose("missing", plan=LR_PLAN, what="records", root=root)
    e = edge(points, untrained_loss(runs))
    rows = []
    for lr, runs in points:
        losses = [r["metrics"]["eval_loss"] for r in runs
                  if r.get("status") == "ok" and (r.get("metrics") or {}).get("eval_loss") is not None]
        std = statistics.stdev(losses) if len(losses) > 1 else 0.0
        kinds = e["kinds"][lr]
        rows.append([f"{lr:g}", str(len(runs)), f"{statistics.mean(losses):.3f} ± {std:.3f}" if losses else "–",
                     ", ".join(f"{kinds.count(k)} {WORDS[k]}" for k in WORDS if k in kinds)])
    spec = points[0][1][0].get("spec") or {}
    s = spec.get("set") or {}
    setup = (f"{s.get('model.num_layers', '?')} layers x {s.get('model.d_model', '?')}, context "
             f"{s.get('model.context_length', '?')}, batch {s.get('data.batch_size', '?')}, "
             f"{s.get('train.steps', '?')} steps")
    out += prose("learning_rate", plan=LR_PLAN, setup=setup, definition=DEFINITION,
                 table=table(["peak lr", "seeds", "validation loss", "seeds by outcome"], rows, "lr"))
    out += [f"(b) The best rate is {e['best']:g} (validation loss {e['best_loss']:.3f}). " + edge_sentence(e)]
    if e["trained"] and e["broken"]:
        folk = "holds loosely" if e["broken"] / e["best"] <= 10 else "does not hold"
        out[-1] += (f" So the best rate sits within a factor {e['broken'] / e['best']:g} of the edge: the folk wisdom "
                    f"(the best rate is just below the edge of stability) {folk} here: the rates just under the edge "
                    "still train nearly as well as the best while the next step up no longer learns. Where the loss "
                    f"becomes non-finite is a different, much higher edge. **The grid's limits**: {len(points)} "
                    f"rates, so the edge is bracketed only within a factor {e['broken'] / e['trained']:g}; a finer "
                    f"grid between {e['trained']:g} and {e['broken']:g} places it.")
    return out + [""]


def generate_section(page: Path, link: str) -> list[str]:
    """The sample, its decoding settings and the model's facts from a run's page (`python -m deliverables.report
    RUN`), and what decides how fluent it is."""
    text = page.read_text() if page.is_file() else ""
    sample = re.search(r"## Sample\n(.*?)\n```text\n(.*?)\n```\n+(.*?)(?:\n\n|$)", text, re.S)
    if not sample:
        return ["### generate", "", f"**Missing**: no run page with a sample at `{page}`; `python -m "
                f"deliverables.report RUN_DIR --out {page.parent}` writes one (256 tokens from the run's newest "
                "checkpoint).", ""]
    row = lambda key: (re.search(rf"^\| {key} \| (.*?) \|$", text, re.M) or [None, None])[1]
    params = (re.search(r"([\d,]+) parameters", row("model") or "") or [None, "?"])[1]
    tokens = " and reads bytes, not BPE tokens" if "bytes tokenizer" in (row("data") or "") else ""
    quoted = "\n".join("> " + line if line else ">" for line in sample.group(2).splitlines())
    return prose("generate", title=text.splitlines()[0].lstrip("# "), link=link, model=row("model"), data=row("data"),
                 steps=row("steps"), loss=row("final validation loss"), decoding=sample.group(1).strip(),
                 quoted=quoted, repetition=sample.group(3).strip(), params=params, tokens=tokens)
