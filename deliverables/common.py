"""What several deliverables state: the Markdown table writer, the page templates, a plan's runs, the study models
beside the presets, the settings a technique's label names, the course's device memory."""

from __future__ import annotations

import re
from pathlib import Path

from experiments.results import load_results

# The course's device memory: adamwAccounting (b) asks for "the maximum batch size you can use and still fit within
# 80GB memory".
COURSE_MEMORY = 80e9

# Models the memory studies name beside the presets (`--set` overrides): the RTX 5090 study's, 4 layers, d_model
# 256, 8 heads, d_ff 1024, GPT-2's vocabulary, tied embeddings.
STUDY_MODELS = {"rtx5090": ["model.num_layers=4", "model.d_model=256", "model.num_heads=8", "model.d_ff=1024",
                            "model.vocab_size=50257", "model.tie_embeddings=true"]}


def technique(label: str) -> tuple[str, str, str, int | None]:
    """(dtype, remat, attention, window) that a technique's label names: 'bfloat16 + cuDNN + remat full'."""
    parts = label.split(" + ")
    remat = next((p.split()[-1] for p in parts if p.endswith(("full", "dots_saveable"))), "none")
    window = next((int(p.split()[-1]) for p in parts if p.startswith("window ")), None)
    return parts[0], remat, "cudnn" if "cuDNN" in parts else "xla", window


def plan_runs(root: Path, plan: str) -> list[dict]:
    """A plan's runs under ROOT: its committed records (ROOT/PLAN/records), else the runs as the runner leaves them."""
    for where in (root / plan / "records", root / plan):
        if where.is_dir():
            return load_results(where)
    return []


def table(head: list[str], rows: list[list], align: str = "l") -> str:
    """A Markdown table. `align` gives each column's side, 'l' or 'r', its last letter repeated for the columns
    after it ("lr": names left, numbers right). A None cell reads '-'; a short row (a setting and its error) keeps
    its cells."""
    sides = (align + align[-1] * len(head))[:len(head)]
    lines = ["| " + " | ".join(head) + " |", "|" + "".join("---|" if s == "l" else "---:|" for s in sides)]
    lines += ["| " + " | ".join("-" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


ALONE = r"\||#|```|\{[\w-]+\}$"  # a line of its own: a table row, a heading, a code fence, a field alone ("{table}")
WRAPPED = re.compile(rf"^(?!{ALONE})(.+)\n(?!{ALONE}|- |$)", re.M)  # a break in a paragraph, not before a list item


def render(template: str, block: str = "", /, **fields) -> str:
    """Template TEMPLATE in deliverables/pages/ (its `<!-- BLOCK -->` block, else the whole file), its wrapped
    lines joined, filled by str.format (a field's name has no dot: `{2_7B}`). A field may be lines (joined); one
    left empty leaves no run of blank lines behind."""
    text = (Path(__file__).parent / "pages" / template).read_text()
    if block:
        parts = re.split(r"^<!-- (\w+) -->\n", text, flags=re.M)
        text = dict(zip(parts[1::2], parts[2::2]))[block]
    fields = {k: "\n".join(v) if isinstance(v, list) else v for k, v in fields.items()}
    return re.sub(r"\n{3,}", "\n\n", WRAPPED.sub(r"\1 ", text).format(**fields))
