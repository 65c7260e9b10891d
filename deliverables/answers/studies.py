"""learning_rate and generate, answered from the studies' records and a trained run's page."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from deliverables.answers.accounting import table
from experiments.results import load_results

LR_PLAN, LR_AXIS = "lr_sweep", "optim.lr"


def lr_settings(root: Path) -> dict[float, list[dict]]:
    """learning rate -> the runs at that rate (every seed), from ROOT/lr_sweep's records."""
    for where in (root / LR_PLAN / "records", root / LR_PLAN):
        if where.is_dir():
            out: dict[float, list[dict]] = {}
            for r in load_results(where):
                lr = (r.get("axes") or {}).get(LR_AXIS)
                if isinstance(lr, (int, float)):
                    out.setdefault(float(lr), []).append(r)
            return dict(sorted(out.items()))
    return {}


def mean_loss(runs: list[dict]) -> tuple[float, float] | None:
    losses = [r["metrics"]["eval_loss"] for r in runs
              if r.get("status") == "ok" and (r.get("metrics") or {}).get("eval_loss") is not None]
    if not losses:
        return None
    return statistics.mean(losses), statistics.stdev(losses) if len(losses) > 1 else 0.0


def learning_rate_section(root: Path) -> list[str]:
    settings = lr_settings(root)
    out = ["### learning_rate", ""]
    if not settings:
        return out + [f"**Missing**: no `{LR_PLAN}` records under `{root}`; `python -m experiments.run {LR_PLAN}`.", ""]
    rows, ok, diverged = [], {}, []
    for lr, runs in settings.items():
        m = mean_loss(runs)
        bad = [r for r in runs if r.get("status") == "diverged"]
        if m:
            ok[lr] = m
        if bad:
            diverged.append(lr)
        rows.append([f"{lr:g}", str(len(runs)), f"{m[0]:.3f} ± {m[1]:.3f}" if m else "–",
                     f"{len(bad)} of {len(runs)}" if bad else "none"])
    best = min(ok, key=lambda lr: ok[lr][0])
    stable = max(ok)
    edge = min((lr for lr in diverged if lr > stable), default=None)
    spec = next(iter(settings.values()))[0].get("spec") or {}
    s = spec.get("set") or {}
    setup = (f"{s.get('model.num_layers', '?')} layers x {s.get('model.d_model', '?')}, context "
             f"{s.get('model.context_length', '?')}, batch {s.get('data.batch_size', '?')}, {s.get('train.steps', '?')} steps")
    out += [f"(a) From the `{LR_PLAN}` plan's records ({setup}; validation loss as mean ± standard deviation over "
            f"seeds; curves in [results/{LR_PLAN}/report.md](results/{LR_PLAN}/report.md)):", ""]
    out += table(["peak lr", "seeds", "validation loss", "diverged"], rows)
    if edge is None:
        out += [f"(b) The best rate is {best:g}; the largest rate on the grid, {stable:g}, still trained, so this grid "
                "does not reach the edge of stability.", ""]
    else:
        rates = sorted(ok)
        i = rates.index(best)
        neighbours = rates[max(i - 1, 0):i] + rates[i + 1:i + 2]  # the grid points on either side of the best
        folk = "does not hold" if stable / best > 10 else "holds"
        out += [f"(b) The best rate is {best:g}. The largest rate that trained is {stable:g} ({stable / best:g}x the "
                f"best); {edge:g} ({edge / best:g}x) diverged. The edge of stability lies between the two, so here the "
                f"best rate sits at least {stable / best:g}x below it: the folk wisdom (the best rate is just below the "
                f"edge) {folk} at this size. **The grid's limits**: {len(settings)} rates, so the edge is "
                f"bracketed only within a factor {edge / stable:g} and the best within its neighbours "
                f"({' and '.join(f'{lr:g}' for lr in neighbours)}); a finer grid between {stable:g} and {edge:g} places the "
                "edge, and one around the best places it.", ""]
    return out


def run_page_facts(page: Path) -> dict | None:
    """The sample, its decoding settings and the model's facts from a run's page
    (`python -m experiments.report RUN`)."""
    if not page.is_file():
        return None
    text = page.read_text()
    sample = re.search(r"## Sample\n(.*?)\n```text\n(.*?)\n```\n+(.*?)(?:\n\n|$)", text, re.S)
    row = lambda key: (re.search(rf"^\| {key} \| (.*?) \|$", text, re.M) or [None, None])[1]
    if not sample:
        return None
    return {"decoding": sample.group(1).strip(), "sample": sample.group(2), "measures": sample.group(3).strip(),
            "model": row("model"), "data": row("data"),
            "params": (re.search(r"([\d,]+) parameters", row("model") or "") or [None, "?"])[1],
            "steps": row("steps"), "val_loss": row("final validation loss"),
            "title": text.splitlines()[0].lstrip("# ")}


def generate_section(page: Path, link: str) -> list[str]:
    out = ["### generate", ""]
    facts = run_page_facts(page)
    if facts is None:
        return out + [f"**Missing**: no run page with a sample at `{page}`; "
                      f"`python -m experiments.report RUN_DIR --out {page.parent}` writes one (256 tokens from the "
                      "run's newest checkpoint).", ""]
    tokens = " and reads bytes, not BPE tokens" if "bytes tokenizer" in (facts["data"] or "") else ""
    quoted = "\n".join("> " + line if line else ">" for line in facts["sample"].splitlines())
    return out + [
        f"From the [{facts['title']}]({link}): model {facts['model']}; data {facts['data']}; {facts['steps']} steps, "
        f"validation loss {facts['val_loss']}. {facts['decoding']}", "", quoted, "",
        f"{facts['measures']}", "",
        "**Fluency.** The text has the corpus's local form (its words, punctuation, quoting and line layout) but not "
        "its sense: phrases run into each other and no sentence carries a meaning across more than a few words. "
        "Two factors decide how good a sample is. (1) **Decoding**: the temperature sharpens (below 1) or flattens "
        "(above 1) the next-token distribution, and top-p keeps only the smallest set of tokens holding p of the "
        "probability; lower values give safer, more repetitive text, higher values more varied and less coherent "
        "text. (2) **The model and its data**: the parameter count, the tokens trained on and the tokenizer set the "
        f"validation loss; this one has {facts['params']} parameters{tokens}, and the TinyStories paper (Eldan and "
        "Li, 2023) shows models of a few million parameters trained on that simple corpus writing fluent short "
        "stories.", ""]
