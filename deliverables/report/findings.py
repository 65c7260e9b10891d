"""The curriculum's published findings and a check per finding: what jaxlm measured and a verdict (docs/experiments.md,
*Reports*). Every test of one report is judged together: `ctx["noise"]` is its `noise.Family` (Holm)."""

from __future__ import annotations

import math
import statistics
from functools import partial
from typing import Any, Callable, NamedTuple

from deliverables.common import table
from deliverables.report.bench import fit_memory_batch, fit_memory_context
from deliverables.report.noise import Family
from deliverables.report.plots import mean_curve
from deliverables.report.sections.divergence import edge, edge_sentence
from deliverables.report.seeds import SHORT, Setting, Stats, along, baseline_of, logged, resolved
from experiments.plan import format_value

AGREE, DISAGREE, UNRESOLVED = "agree", "disagree", "not resolved at this size"
SMALL = 0.02  # "about as well" / "changes loss little": mean validation losses within 2 %


def _by_name(settings: list[Setting], name: str) -> Setting | None:
    return next((s for s in settings if s.name == name), None)


def _loss(s: Setting | None) -> Stats | None:
    return s.stats("eval_loss") if s else None


def _values_along(settings: list[Setting], axis: str, of: Callable) -> list[tuple[float, Any]]:
    """(value on `axis`, `of(setting)`) of the settings along `axis` that `of` gives a value for."""
    return [(x, v) for x, s in along(settings, axis) if (v := of(s)) is not None]


def _versus(a: Stats, b: Stats, a_name: str, b_name: str, noise: Family) -> tuple[str, bool | None]:
    """The comparison's text and whether it is beyond noise (None: one seed)."""
    verdict = resolved(a, b, noise)
    change = 100 * (a.mean - b.mean) / b.mean
    return f"val loss {a_name} {a.text()} vs {b_name} {b.text()} ({change:+.1f}%, {SHORT[verdict]})", verdict


def _directed(beyond: bool | None, holds: bool) -> str:
    """Agree when a difference beyond noise goes the finding's way, disagree when it goes the other."""
    return AGREE if beyond and holds else DISAGREE if beyond else UNRESOLVED


def check_worse(settings: list[Setting], ctx: dict, variant: str) -> tuple[str, str]:
    """The variant's mean validation loss against the baseline's at the plan's baseline settings; at its other
    settings (another rate) it is reported beside, against the baseline there."""
    base, var = _by_name(settings, "baseline"), _by_name(settings, variant)
    extra = _elsewhere(settings, variant, ctx["noise"])
    if var and not var.ok:
        return f"{variant}: {var.status}{extra}", AGREE
    a, b = _loss(var), _loss(base)
    if a is None or b is None:
        return "not run", UNRESOLVED
    text, beyond = _versus(a, b, variant, "baseline", ctx["noise"])
    worse_at = _worse_at_evals(var, base)
    text += f"; above the baseline at {worse_at} evaluations (seed means)" if worse_at else ""
    return text + extra, _directed(beyond, a.mean > b.mean)


def _elsewhere(settings: list[Setting], variant: str, noise: Family) -> str:
    """'; at optim.lr=0.01: val loss ...' for the variant's other settings, each against the baseline there."""
    bases, out = baseline_of(settings, {"variant": "baseline"}), ""
    for s in settings:
        if s.axes.get("variant") != variant or s.name == variant or s.name not in bases:
            continue
        where, base = ", ".join(f"{k}={format_value(v)}" for k, v in s.axes.items() if k != "variant"), bases[s.name]
        a, b = _loss(s), _loss(base)
        if a is not None and b is not None:
            out += f"; at {where}: " + _versus(a, b, variant, "baseline", noise)[0]
        elif any(r.get("status") == "diverged" for r in s.runs + base.runs):
            out += f"; at {where}: {variant} {s.status}, baseline {base.status}"
        else:
            out += f"; at {where}: not complete"
    return out


def _worse_at_evals(var: Setting, base: Setting) -> str:
    xa, ma, _, _ = mean_curve(var.ok, "eval_loss", "step")
    xb, mb, _, _ = mean_curve(base.ok, "eval_loss", "step")
    common = dict(zip(xb, mb))
    pairs = [(m, common[x]) for x, m in zip(xa, ma) if x in common]
    return f"{sum(a > b for a, b in pairs)} of {len(pairs)}" if pairs else ""


def _close(a: Stats | None, b: Stats | None, a_name: str, b_name: str, ctx: dict) -> tuple[str, str]:
    """Within noise, or within SMALL of each other: agree; further apart: disagree."""
    if a is None or b is None:
        return "not run", UNRESOLVED
    text, beyond = _versus(a, b, a_name, b_name, ctx["noise"])
    close = beyond is False or abs(a.mean - b.mean) <= SMALL * b.mean  # one seed: by SMALL alone
    return text, AGREE if close else DISAGREE


def check_similar(settings: list[Setting], ctx: dict, a: str, b: str) -> tuple[str, str]:
    return _close(_loss(_by_name(settings, a)), _loss(_by_name(settings, b)), a, b, ctx)


def _best_lr(settings: list[Setting]) -> tuple[list[tuple[float, Setting]], tuple[float, Setting, Stats] | None, list]:
    pts = along(settings, "optim.lr")
    ok = [(x, s, st) for x, s in pts if (st := _loss(s)) is not None and len(s.ok) == len(s.runs)]
    return pts, (min(ok, key=lambda t: t[2].mean) if ok else None), ok


def check_lr(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    """The best rate (lowest mean loss) lies inside the sweep and beats every other completed rate beyond noise."""
    pts, best, ok = _best_lr(settings)
    if best is None:
        return "no completed rate", UNRESOLVED
    best_x, _, st = best
    others = [(x, o) for x, _, o in ok if x != best_x]
    text = (f"best lr {format_value(best_x)} (val loss {st.text()}); "
            + ", ".join(f"lr {format_value(x)}: {o.text()}" for x, o in others))
    interior = pts[0][0] < best_x < pts[-1][0]
    clear = all([resolved(st, o, ctx["noise"]) for _, o in others])  # a list: every comparison counts in the family
    text += "; best beyond noise of every other rate" if clear else "; best within noise of another rate"
    text += f"; this best is {best_x / 1e-3:.3g}x the seed reports' 1e-3 (where it lies depends on model and batch)"
    return text, AGREE if interior and clear else UNRESOLVED


def check_lr_diverge(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    """Every rate 10-100x the best stopped training (by `divergence.DEFINITION`): agree; the text says where the loss
    itself first turns non-finite."""
    pts, best, _ = _best_lr(settings)
    if best is None:
        return "no completed rate", UNRESOLVED
    best_x, e = best[0], edge([(x, s.runs) for x, s in pts], ctx.get("untrained_loss", math.inf))
    high = {x: kinds for x, kinds in e["kinds"].items() if x >= 10 * best_x}
    if not high:
        return "no rate 10x or more above the best", UNRESOLVED
    stopped = ["trained" not in kinds for x, kinds in high.items() if x <= 100 * best_x]
    parts = [f"lr {format_value(x)} ({x / best_x:.0f}x the best): {kinds.count('failed')} of {len(kinds)} seeds "
             f"failed to learn, {kinds.count('diverged')} diverged" for x, kinds in high.items()]
    verdict = UNRESOLVED if not stopped else AGREE if all(stopped) else DISAGREE
    return edge_sentence(e) + " " + "; ".join(parts), verdict


def _moves(pts: list[tuple[float, Stats]], down: bool, noise: Family) -> str:
    """Agree when every step along `pts` goes down (else up) beyond noise, not resolved when it only goes that way."""
    steps = [(a, b) for (_, a), (_, b) in zip(pts, pts[1:])]
    beyond = [resolved(b, a, noise) for a, b in steps]
    if not all((a.mean - b.mean if down else b.mean - a.mean) > 0 for a, b in steps):
        return DISAGREE
    return AGREE if all(beyond) else UNRESOLVED


def check_batch_steps(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    pts = _values_along(settings, "data.batch_size", _loss)
    if len(pts) < 2:
        return "fewer than two batch sizes", UNRESOLVED
    verdict = _moves(pts, True, ctx["noise"])
    text = ", ".join(f"batch {format_value(int(x))}: {st.text()}" for x, st in pts)
    return text + (" (not monotone)" if verdict == DISAGREE else ""), verdict


def roughness(s: Setting) -> float | None:
    """Mean over seeds of the std of successive differences of the logged training loss, second half of the run."""
    vals = []
    for r in s.ok:
        _, v, _ = logged(r, "train_loss")
        tail = v[len(v) // 2 :]
        diffs = [b - a for a, b in zip(tail, tail[1:])]
        if len(diffs) > 1:
            vals.append(statistics.stdev(diffs))
    return sum(vals) / len(vals) if vals else None


def check_batch_erratic(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    pts = _values_along(settings, "data.batch_size", roughness)
    if len(pts) < 2:
        return "fewer than two batch sizes", UNRESOLVED
    text = ("training-loss jitter (std of successive logged differences, 2nd half): "
            + ", ".join(f"batch {int(x)}: {r:.3f}" for x, r in pts))
    return text, AGREE if all(b < a for (_, a), (_, b) in zip(pts, pts[1:])) else DISAGREE


def check_batch_time(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    pts = _values_along(settings, "data.batch_size", lambda s: s.stats("step_time"))
    if len(pts) < 2:
        return "fewer than two batch sizes", UNRESOLVED
    text = "step time " + ", ".join(f"batch {int(x)}: {st.text(4)} s" for x, st in pts)
    return text, _moves(pts, False, ctx["noise"])


def check_bigger(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    pts = sorted(((st_p.mean, s, st) for s in settings if (st_p := s.stats("params")) and (st := _loss(s))),
                 key=lambda t: t[0])
    if len(pts) < 2:
        return "fewer than two sizes", UNRESOLVED
    text = ", ".join(f"{s.name} ({p / 1e3:.0f}k params): {st.text()}" for p, s, st in pts)
    (_, _, prev), (_, _, big) = pts[-2], pts[-1]
    if resolved(big, prev, ctx["noise"]) and big.mean < prev.mean:
        return text + "; the largest is better beyond noise", DISAGREE
    return text + "; the largest is not better beyond noise", AGREE


def check_context(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    pts = _values_along(settings, "model.context_length", _loss)
    if len(pts) < 2:
        return "fewer than two context lengths", UNRESOLVED
    return _little(", ".join(f"context {int(x)}: {st.text()}" for x, st in pts), [st for _, st in pts])


def _little(text: str, stats: list[Stats]) -> tuple[str, str]:
    """Agree when the mean losses span at most SMALL of the lowest."""
    lo, hi = min(st.mean for st in stats), max(st.mean for st in stats)
    return text + f"; range {100 * (hi - lo) / lo:.1f}% of the loss", AGREE if (hi - lo) <= SMALL * lo else DISAGREE


def check_mixed_precision(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    """Only a GPU answers it: XLA's CPU backend computes bfloat16 through float32 (no memory or speed effect to see)."""
    gpu = any(r.get("dtype") == "bfloat16" and r.get("status") == "ok" and r.get("memory_source") == "memory_stats"
              for r in ctx.get("bench_rows", []))
    return ("see the mixed-precision sentences above" if gpu else "left to the GPU campaign: on CPU, XLA computes "
            "bfloat16 through float32, so neither its memory nor its speed is the GPU's"), UNRESOLVED


def check_lora_ranks(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    pts = [(int(s.name.split("_r")[1]), st) for s in settings if s.name.startswith("lora_r") and (st := _loss(s))]
    if len(pts) < 2:
        return "fewer than two ranks", UNRESOLVED
    return _little(", ".join(f"r{r}: {st.text()}" for r, st in sorted(pts)), [st for _, st in pts])


def _quantized(ctx: dict, trained: str, bits: int | None) -> Stats | None:
    """Seed statistics of the validation loss of `trained` models evaluated at `bits` (None: as trained)."""
    return Stats.of([q["val_loss"] for q in ctx.get("quantize_rows", [])
                     if q["trained"] == trained and q["bits"] == bits])


def check_ptq8(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    return _close(_quantized(ctx, "float32", 8), _quantized(ctx, "float32", None), "int8 PTQ", "float32", ctx)


def check_qat(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    a, b = _quantized(ctx, "qat w4a8", 4), _quantized(ctx, "float32", 4)
    if a is None or b is None:
        return "not run", UNRESOLVED
    text, beyond = _versus(a, b, "QAT w4a8 at int4", "int4 PTQ of float32", ctx["noise"])
    return text, _directed(beyond, a.mean < b.mean)


def check_remat(settings: list[Setting], ctx: dict) -> tuple[str, str]:
    """Every remat setting's loss within noise of float32 at the same batch."""
    bases = baseline_of(settings, {"technique": "float32"})
    pairs = [(s, bases[s.name]) for s in settings if s.axes.get("technique") == "remat" and s.name in bases]
    pairs = [(a, b) for s, base in pairs if (a := _loss(s)) and (b := _loss(base))]
    if not pairs:
        return "not run", UNRESOLVED
    same = all([resolved(a, b, ctx["noise"]) is False or a.mean == b.mean for a, b in pairs])
    text = "; ".join(f"{a.text()} vs {b.text()}" for a, b in pairs) + " (remat vs float32, val loss by batch)"
    return text, AGREE if same else DISAGREE


class Finding(NamedTuple):
    """The seed reports: student reports on this curriculum (TinyStories / WikiText-103, GPU); for fine-tuning and
    quantisation, the methods' papers."""

    plan: str
    claim: str  # the finding, in a few words
    seen: str  # what the seed reports saw
    check: Callable[[list[Setting], dict], tuple[str, str]]  # (settings, ctx) -> (measured, verdict)


FINDINGS: tuple[Finding, ...] = (
    Finding("ablations", "removing RMSNorm hurts",
            "erratic at lr 1e-3 and clearly worse: final loss about 2.4 vs 2.0 after 5k steps; lower rates "
            "stabilise it but stay worse", partial(check_worse, variant="no_norm")),
    Finding("ablations", "post-norm trains about as well as pre-norm",
            "about the same loss (slightly lower in one report)", partial(check_similar, a="post_norm", b="baseline")),
    Finding("ablations", "NoPE is worse than RoPE", "clearly worse throughout training",
            partial(check_worse, variant="nope")),
    Finding("ablations", "SwiGLU beats the ungated SiLU feed-forward", "SwiGLU lower throughout training",
            partial(check_worse, variant="silu")),
    Finding("lr_sweep", "a learning-rate sweet spot: worse on both sides of the best rate",
            "best near 1e-3 (their models and batches), worse on both sides", check_lr),
    Finding("lr_sweep", "rates 10-100x above the best diverge, visibly early",
            "10-100x higher diverges, early in training", check_lr_diverge),
    Finding("batch_size", "at equal steps, larger batches reach lower loss",
            "lower loss with larger batches at equal steps", check_batch_steps),
    Finding("batch_size", "batch 1 and 8 are erratic", "noisy, erratic curves at batch 1 and 8", check_batch_erratic),
    Finding("batch_size", "time per step grows with batch", "longer steps at larger batches", check_batch_time),
    Finding("model_size", "at a short budget bigger models are not better yet",
            "bigger models converge more slowly at a fixed short budget", check_bigger),
    Finding("context_length", "context length changes loss little",
            "little change in loss across context lengths", check_context),
    Finding("profiling", "peak memory grows about linearly with batch", "about linear in batch",
            lambda s, c: fit_memory_batch(c.get("bench_rows", []))),
    Finding("profiling", "peak memory grows faster than linearly with context",
            "faster than linear in context (attention matrices)",
            lambda s, c: fit_memory_context(c.get("bench_rows", []))),
    *(Finding(plan, "mixed precision cuts memory by 1/4-1/3 and raises throughput 2-4x", "on a GPU",
              check_mixed_precision) for plan in ("profiling", "optimizations")),
    Finding("optimizations", "rematerialisation changes memory and time, not the loss",
            "by design: the backward recomputes the same forward", check_remat),
    Finding("peft", "LoRA comes close to full fine-tuning with a few % of the parameters",
            "LoRA paper (Hu et al. 2021): on par with full fine-tuning of GPT-3 and RoBERTa",
            partial(check_similar, a="lora_r8", b="full")),
    Finding("peft", "the LoRA rank matters little", "LoRA paper: ranks 1 to 64 perform about the same",
            check_lora_ranks),
    Finding("peft", "a 4-bit NF4 base (QLoRA) matches LoRA on a float base",
            "QLoRA paper (Dettmers et al. 2023): NF4 matches 16-bit LoRA",
            partial(check_similar, a="qlora_r16", b="lora_r16")),
    Finding("quantization", "int8 weight PTQ is about lossless",
            "per-channel int8 weights: near-lossless in the int8 literature (LLM.int8, GPTQ baselines)", check_ptq8),
    Finding("quantization", "QAT recovers what 4-bit PTQ loses",
            "QAT literature (Jacob et al. 2018, LLM-QAT 2023): QAT beats PTQ at low bit widths", check_qat),
)


def findings_rows(plan: str, settings: list[Setting], ctx: dict) -> list[dict]:
    """[{claim, seen, measured, verdict}] for the plan's findings. ctx: bench_rows, untrained_loss, noise
    (the table's `Family`)."""
    rows = []
    for name, claim, seen, check in FINDINGS:
        if name == plan:
            measured, verdict = check(settings, ctx)
            rows.append({"claim": claim, "seen": seen, "measured": measured, "verdict": verdict})
    return rows


def findings_table(rows: list[dict]) -> str:
    return table(["finding", "seed reports", "jaxlm measured", "verdict"],
                 [[r["claim"], r["seen"], r["measured"], r["verdict"]] for r in rows])
