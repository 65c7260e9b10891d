"""The one-plan report sections: a plan whose `[report]` sets NAME = true gets section NAME, each a (findings
sentences, Markdown lines) pair; `backend` runs for every CPU plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deliverables.report.noise import Family
from deliverables.report.sections.divergence import divergence_section
from deliverables.report.sections.parallel import parallel
from deliverables.report.sections.peft import peft, quantization
from deliverables.report.sections.tokenizer import tokenizer
from deliverables.report.seeds import Setting


@dataclass
class Plan:
    runs: list[dict]
    settings: list[Setting]
    cfg: dict  # the plan's [report] table
    ctx: dict  # write_report's: bench rows, the untrained model's loss, the quantisation rows
    out: Path
    noise: Family  # the Holm family the sections' comparisons join


SECTIONS: dict[str, Callable[[Plan], tuple[list[str], list[str]]]] = {
    "peft": lambda p: peft(p.runs, p.noise),
    "quantization": lambda p: quantization(p.runs, p.noise),
    "tokenizer": lambda p: tokenizer(p.runs),
    "parallel": lambda p: parallel(p.runs, p.out),
    "divergence": lambda p: ([], divergence_section(p.settings, p.cfg["x"], p.ctx["untrained_loss"])
                             if p.cfg.get("x") else []),
}


def plan_sections(p: Plan) -> tuple[list[str], list[str]]:
    """(findings, lines) of every section the plan's [report] table switches on, in SECTIONS' order."""
    findings, lines = [], []
    for name, section in SECTIONS.items():
        if p.cfg.get(name):
            f, body = section(p)
            findings, lines = findings + f, lines + body
    return findings, lines
