"""Divergence in a learning-rate sweep: one definition, each run's outcome under it, and where the edge lies.

A run *diverged* when its loss or parameters became non-finite (the trainer stops it and the runner
labels it `diverged`), or when it finished with a validation loss above ln V, the loss of the untrained
model's uniform prediction: training left it worse than where it started.
"""

from __future__ import annotations

import math
import re

from experiments.plan import format_value
from experiments.report.format import table
from experiments.report.seeds import Setting

DEFINITION = ("A run *diverged* when its loss or parameters became non-finite (the trainer stops it) or when its "
              "final validation loss is above ln V, the untrained model's loss (uniform prediction over the V token ids): "
              "training left it worse than where it started.")


def outcome(run: dict, untrained: float) -> tuple[bool, str]:
    """(diverged, how): 'non-finite at step 45 of 300', 'final val loss 8.91 > ln V = 8.32', or 'val loss 4.01'.

    The step is the trainer's own (its stop message, the runner's `reason`), else the run's last logged step."""
    m = run.get("metrics") or {}
    if run.get("status") == "diverged":
        planned = ((run.get("config") or {}).get("train") or {}).get("steps")
        at = re.search(r"at step (\d+)", run.get("reason") or "")
        when = f"at step {at.group(1)}" if at else f"after step {m.get('steps', '?')}"
        return True, f"non-finite {when}" + (f" of {planned}" if planned else "")
    loss = m.get("eval_loss")
    if isinstance(loss, (int, float)) and math.isfinite(loss) and loss > untrained:
        return True, f"final val loss {loss:.2f} > ln V = {untrained:.2f}"
    return False, f"val loss {loss:.3f}" if isinstance(loss, (int, float)) else "no evaluation"


def rates(settings: list[Setting], axis: str) -> list[tuple[float, Setting]]:
    return sorted(((float(s.axes[axis]), s) for s in settings if isinstance(s.axes.get(axis), (int, float))),
                  key=lambda t: t[0])


def edge_sentence(points: list[tuple[float, list[bool]]]) -> str:
    """Where the sweep goes from every seed training to every seed diverging."""
    stable = [x for x, d in points if d and not any(d)]
    broken = [x for x, d in points if d and all(d)]
    if not broken:
        return f"No rate up to {format_value(points[-1][0])} diverged: the grid does not reach the edge of stability."
    first_broken = min(broken)
    below = [x for x in stable if x < first_broken]
    if not below:
        return f"Every rate diverged from the smallest, {format_value(first_broken)}: the grid starts past the edge."
    mixed = [format_value(x) for x, d in points if below[-1] < x < first_broken]
    between = f"; between them some seeds diverged (lr {', '.join(mixed)})" if mixed else ""
    return (f"Edge of stability: every seed trained at lr {format_value(below[-1])} and every seed diverged from lr "
            f"{format_value(first_broken)} ({first_broken / below[-1]:.3g}x higher){between}.")


def divergence_section(settings: list[Setting], axis: str, untrained: float) -> list[str]:
    """The '## Divergence' section: the definition, a row per rate with each seed's outcome, and the edge."""
    pts = rates(settings, axis)
    if not pts or not math.isfinite(untrained):
        return []
    rows, points = [], []
    for x, s in pts:
        outs = [outcome(r, untrained) for r in s.runs]
        points.append((x, [d for d, _ in outs]))
        rows.append([format_value(x), str(len(outs)), str(sum(d for d, _ in outs)), "; ".join(how for _, how in outs)])
    return ["## Divergence", "", DEFINITION, "", table(["lr", "seeds", "diverged", "each seed"], rows), "",
            edge_sentence(points), ""]
