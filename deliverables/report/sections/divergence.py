"""Divergence in a learning-rate sweep: one definition, each run's outcome under it, and where the edge lies. Runs
are judged against the best setting, not ln V: a run a nat above the best has stopped learning, though finite."""

from __future__ import annotations

import math
import re
import statistics

from deliverables.common import table
from deliverables.report.seeds import Setting, along
from experiments.plan import format_value

LEARNED_WITHIN = 0.5  # nats above the best setting's mean loss: a perplexity at most e^0.5 = 1.65x the best's
DEFINITION = ("Each run is judged against the best setting (the lowest mean final validation loss L\\*, its mean "
              "accuracy A\\*). A run *diverged* when its loss or parameters became non-finite (the trainer stops it) "
              "or it ended above ln V, the untrained model's loss. It *failed to learn* when it ended finite but more "
              f"than {LEARNED_WITHIN:g} nats above L\\* (a perplexity over {math.exp(LEARNED_WITHIN):.2f}x the "
              "best's); its accuracy against A\\* is shown beside. Otherwise it *trained*.")


def _metric(run: dict, key: str) -> float | None:
    v = (run.get("metrics") or {}).get(key)
    return float(v) if run.get("status") == "ok" and isinstance(v, (int, float)) and math.isfinite(v) else None


def reference(groups: list[list[dict]]) -> tuple[float, float | None]:
    """(L*, A*): the mean final validation loss and accuracy of the setting (a list of seeds' runs) with the lowest
    mean loss."""
    means = []
    for runs in groups:
        losses = [x for r in runs if (x := _metric(r, "eval_loss")) is not None]
        accs = [x for r in runs if (x := _metric(r, "eval_acc")) is not None]
        if losses:
            means.append((statistics.mean(losses), statistics.mean(accs) if accs else None))
    return min(means, key=lambda m: m[0]) if means else (math.inf, None)


def outcome(run: dict, untrained: float, best: tuple[float, float | None]) -> tuple[str, str]:
    """('diverged' | 'failed' | 'trained', how): 'non-finite at step 45 of 300', 'val loss 6.02 (+0.95 nats),
    acc 13.6 % (66 % of the best's)'. The step is the trainer's own (its stop message), else the last logged step."""
    m = run.get("metrics") or {}
    if run.get("status") == "diverged":
        planned = ((run.get("config") or {}).get("train") or {}).get("steps")
        at = re.search(r"at step (\d+)", run.get("reason") or "")
        when = f"at step {at.group(1)}" if at else f"after step {m.get('steps', '?')}"
        return "diverged", f"non-finite {when}" + (f" of {planned}" if planned else "")
    loss, acc = _metric(run, "eval_loss"), _metric(run, "eval_acc")
    if loss is None:
        return "failed", "no evaluation"
    if loss > untrained:
        return "diverged", f"final val loss {loss:.2f} > ln V = {untrained:.2f}"
    how = f"val loss {loss:.3f} ({loss - best[0]:+.2f} nats)"
    if acc is not None and best[1]:
        how += f", acc {100 * acc:.1f}% ({100 * acc / best[1]:.0f}% of the best's)"
    return ("failed" if loss - best[0] > LEARNED_WITHIN else "trained"), how


def by_rate(runs: list[dict], axis: str = "optim.lr") -> list[tuple[float, list[dict]]]:
    """(rate, the runs at that rate: every seed), by rate."""
    out: dict[float, list[dict]] = {}
    for r in runs:
        if isinstance(x := (r.get("axes") or {}).get(axis), (int, float)):
            out.setdefault(float(x), []).append(r)
    return sorted(out.items())


def untrained_loss(runs: list[dict]) -> float:
    """ln V of the sweep's model (the untrained model's loss), from the first run's recorded config."""
    vocab = ((runs[0].get("config") or {}).get("model") or {}).get("vocab_size") if runs else None
    return math.log(vocab) if vocab else math.inf


def edge(points: list[tuple[float, list[dict]]], untrained: float) -> dict:
    """Where the sweep goes from every seed training to no seed training: {best, trained, broken, nonfinite,
    best_loss, threshold_range}; `trained`/`broken` are None when the grid does not bracket the edge.
    threshold_range: the thresholds (nats above L*) that put the edge in the same place, seed by seed: above every
    seed's gap from the best rate up to `trained`, and below every seed's gap at `broken`."""
    best = reference([runs for _, runs in points])
    kinds = {x: [outcome(r, untrained, best)[0] for r in runs] for x, runs in points}
    best_x = next(x for x, runs in points if reference([runs])[0] == best[0])
    above = [x for x, _ in points if x > best_x]
    broken = next((x for x in above if kinds[x] and "trained" not in kinds[x]), None)
    trained = max((x for x in above if broken is None or x < broken), default=best_x)
    trained = trained if all(k == "trained" for k in kinds[trained]) else None
    nonfinite = next((x for x, _ in points if kinds[x] and all(k == "diverged" for k in kinds[x])), None)
    gaps = {x: [v - best[0] for r in runs if (v := _metric(r, "eval_loss")) is not None] for x, runs in points}
    g = {x: v for x, v in gaps.items() if v}  # rate -> each completed seed's final loss above L*
    below = max((v for x in g if best_x <= x <= (trained or best_x) for v in g[x]), default=0.0)
    return {"best": best_x, "best_loss": best[0], "best_acc": best[1], "trained": trained, "broken": broken,
            "nonfinite": nonfinite, "kinds": kinds, "threshold_range": (below, min(g.get(broken) or [math.inf]))}


def times(x: float, best: float) -> str:
    """How many times the best rate: '5x', '3,000x'."""
    r = x / best
    return f"{r:,.0f}x" if r >= 10 else f"{r:.3g}x"


def edge_sentence(e: dict) -> str:
    """Where learning stops and where the loss turns non-finite, relative to the best rate."""
    if e["broken"] is None:
        return "Every rate above the best trained: the grid does not reach the edge of stability."
    lo, hi = e["threshold_range"]
    margin = min(LEARNED_WITHIN - lo, hi - LEARNED_WITHIN)
    robust = (f"any threshold between {lo:.2f} and {hi:.2f} nats (seed by seed) puts it there, and the "
              f"{LEARNED_WITHIN:g} used here is {margin:.2f} nats from moving it" if math.isfinite(hi) else
              f"any threshold above {lo:.2f} nats puts it there")
    out = (f"Edge of stability: every seed trained up to lr {format_value(e['trained'])} "
           f"({times(e['trained'], e['best'])} the best rate, {format_value(e['best'])}) and no seed trained from lr "
           f"{format_value(e['broken'])} ({times(e['broken'], e['best'])}); {robust}.") if e["trained"] else (
        f"Learning stops at lr {format_value(e['broken'])} ({times(e['broken'], e['best'])} the best rate); the "
        "rates just below it are mixed.")
    if e["nonfinite"]:
        out += (f" The loss first turns non-finite for every seed at lr {format_value(e['nonfinite'])} "
                f"({times(e['nonfinite'], e['best'])} the best).")
    return out


def divergence_section(settings: list[Setting], axis: str, untrained: float) -> list[str]:
    """The '## Divergence' section: the definition, a row per rate with each seed's outcome, and the edge."""
    pts = along(settings, axis)
    if not pts or not math.isfinite(untrained):
        return []
    points = [(x, s.runs) for x, s in pts]
    best = reference([runs for _, runs in points])
    rows = []
    for x, runs in points:
        outs = [outcome(r, untrained, best) for r in runs]
        rows.append([format_value(x), str(len(outs)), *(str(sum(k == c for k, _ in outs)) for c in
                     ("trained", "failed", "diverged")), "; ".join(how for _, how in outs)])
    return ["## Divergence", "", DEFINITION, "",
            table(["lr", "seeds", "trained", "failed to learn", "diverged", "each seed"], rows), "",
            edge_sentence(edge(points, untrained)), ""]
