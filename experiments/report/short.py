"""The written report itself (report.md, 3-4 printed pages): a template with the computed numbers filled in.

The prose lives in `template.md` beside this file; every `$name` in it is a fact computed here from the
plans' records (through the plan reports `written` has just regenerated, their findings.json and the
required figures), from the library's analytic memory model, or from the technique pages. A fact the
records cannot give says so and names the command that would measure it; the template never carries a
figure. Everything longer (every plan's full report, the technique pages) is the appendix.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

from experiments.report import figures
from experiments.report.format import fmt
from jaxlm.core.files import read_json

TEMPLATE = Path(__file__).with_name("template.md")
TECHNIQUES_INDEX = Path(__file__).resolve().parents[2] / "docs" / "techniques" / "index.md"
GPU_COMMANDS = "`python -m deliverables.gpu` and `python -m experiments.run profiling --size gpu`"
TARGET_COMMAND = "`python -m deliverables.compiled_memory --target h100-80gb` (the memory questions compiled for an H100)"


def render(facts: dict[str, str]) -> str:
    """template.md with every $name replaced (a name without a fact is an error, not a silent gap)."""
    return string.Template(TEMPLATE.read_text()).substitute(facts)


# --------------------------------------------------------------------------- findings


def all_findings(out: Path, plans: list[str]) -> list[dict]:
    """Every plan report's findings (its findings.json), one row per distinct claim."""
    rows, seen = [], set()
    for plan in plans:
        for r in (read_json(out / "plans" / plan / "findings.json", default=None) or {}).get("findings") or []:
            if isinstance(r, dict) and r.get("claim") not in seen:
                seen.add(r.get("claim"))
                rows.append({"plan": plan, **r})
    return rows


def finding(rows: list[dict], plan: str, words: str) -> dict | None:
    return next((r for r in rows if r["plan"] == plan and words in r.get("claim", "")), None)


def measured(rows: list[dict], plan: str, words: str, command: str, first: bool = False) -> str:
    """A finding's measured figures (only the first clause with `first`) and its verdict, or where they would come from."""
    r = finding(rows, plan, words)
    if r is None:
        return f"not in the records (run `python -m experiments.run {command}`)"
    return f"{first_clause(r['measured']) if first else r['measured']} (*{r['verdict']}* with the published finding)"


def first_clause(text: str) -> str:
    """The text up to its first '; ' outside parentheses."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text.startswith("; ", i):
            return text[:i]
    return text


def findings_facts(rows: list[dict]) -> dict[str, str]:
    if not rows:
        return {"findings_summary": "No plan report here checks a published finding (missing).", "findings": ""}
    tally: dict[str, int] = {}
    for r in rows:
        tally[r.get("verdict", "?")] = tally.get(r.get("verdict", "?"), 0) + 1
    summary = (f"{len(rows)} published findings checked against the runs: "
               + ", ".join(f"{n} {v}" for v, n in sorted(tally.items())) + ". Figures are seed means with their spread "
               "as each plan report gives it; *beyond noise* and *within noise* are the plan reports' tests. "
               "A *disagree* is a result at this scale, not an error: the published findings come from GPU runs "
               "thousands of steps long.")
    body = ["| study | finding | measured (first figure) | verdict |", "|---|---|---|---|"]
    body += [f"| {r['plan']} | {r.get('claim', '–')} | {first_clause(str(r.get('measured', '–')))} | {r.get('verdict', '–')} |"
             for r in rows]
    return {"findings_summary": summary, "findings": "\n".join(body)}


# --------------------------------------------------------------------------- setup


def corpora(runs: list[dict], corpus) -> str:
    """'FILE (TOKENIZER tokenizer; N training and M validation tokens; K plans)' per corpus the runs record counts of."""
    seen: dict[tuple, tuple[dict, set]] = {}
    for r in runs:
        d = corpus(r)
        if d:
            key = (", ".join(d.get("sources") or ["?"]), str(d.get("tokenizer")))
            seen.setdefault(key, (d.get("tokens") or {}, set()))[1].add(r.get("plan", "?"))
    counted = {k: v for k, v in seen.items() if isinstance(v[0].get("train"), int)}
    if not counted:
        return "No run records the token counts of its corpus (missing)."
    parts = [f"`{src}` ({tok} tokenizer; {t['train']:,} training and {t.get('val', 0):,} validation tokens; "
             f"{len(plans)} plan{'s' if len(plans) > 1 else ''})"
             for (src, tok), (t, plans) in sorted(counted.items(), key=lambda kv: -len(kv[1][1]))]
    rest = sorted({src for src, _ in seen} - {src for src, _ in counted})
    return ("The studies train on " + "; ".join(parts) + "."
            + (f" Records of older runs name {', '.join(f'`{x}`' for x in rest)} without token counts." if rest else ""))


def models(runs: list[dict]) -> str:
    from jaxlm.analysis.flops import param_counts
    from jaxlm.core.config import ModelConfig
    from jaxlm.core.typedconfig import from_dict

    cfgs = [from_dict(ModelConfig, m) for r in runs if (m := (r.get("config") or {}).get("model"))]
    if not cfgs:
        return "No training run recorded its model (missing)."
    span = lambda xs: f"{min(xs):,}" if min(xs) == max(xs) else f"{min(xs):,}-{max(xs):,}"
    params = [param_counts(c)["total"] for c in cfgs]
    return (f"Training runs use models of {min(params):,} to {max(params):,} parameters (d_model "
            f"{span([c.d_model for c in cfgs])}, {span([c.num_layers for c in cfgs])} layers, context "
            f"{span([c.context_length for c in cfgs])}), sized for the CPU they ran on.")


def seeds(runs: list[dict]) -> str:
    per: dict[tuple, set] = {}
    for r in runs:
        axes = dict(r.get("axes") or {})
        if "seed" in axes:
            per.setdefault((r.get("plan"), tuple(sorted((k, str(v)) for k, v in axes.items() if k != "seed"))),
                           set()).add(axes["seed"])
    n = max((len(s) for s in per.values()), default=1)
    return f"training settings at up to {n} seeds" if n > 1 else "one seed per setting"


def host(runs: list[dict]) -> str:
    """Cores, load, CPU model and software versions as the records give them."""
    hosts = [r.get("host") or {} for r in runs]
    models_ = sorted({h["cpu_model"] for h in hosts if h.get("cpu_model")})
    cpus = sorted({str(h["cpus"]) for h in hosts if h.get("cpus")})
    loads = [v for h in hosts for k, v in h.items() if k.startswith("load_avg") and isinstance(v, (int, float))]
    versions = {k: sorted(v) for k, v in _versions(runs).items() if k in ("jax", "flax", "optax", "torch")}
    out = [f"Every run here ran on a CPU host with {'/'.join(cpus) or 'an unrecorded number of'} cores"
           + (f", shared with other work (1-minute load average {min(loads):.1f} to {max(loads):.1f}), so times are "
              "indicative only." if loads else ".")]
    out.append(f"CPU: {', '.join(models_)}" + (" (only the newer records name it)." if any(not h.get("cpu_model") for h in hosts)
                                               else ".") if models_ else "CPU: model not recorded.")
    if versions:
        out.append("Software: " + ", ".join(f"{k} {' / '.join(v)}" for k, v in versions.items()) + ".")
    return " ".join(out)


def _versions(runs: list[dict]) -> dict[str, set]:
    out: dict[str, set] = {}
    for r in runs:
        for k, v in (r.get("versions") or {}).items():
            out.setdefault(k, set()).add(str(v))
    return out


def gpu(runs: list[dict], root: Path, out: Path) -> str:
    caches = {p.stem: read_json(p, default=None) or {} for p in sorted((root / "compiled").glob("*.json"))}
    n = sum(len(c) for c in caches.values())
    pages = sorted((root / "compiled").glob("*-memory.md"))
    compiled = (f"{n} steps were compiled for {', '.join(caches)} by XLA's GPU compiler on this CPU machine (memory "
                "plans, no timings; " + ", ".join(f"[{p.stem}]({os.path.relpath(p.resolve(), out.resolve())})" for p in pages)
                + ")" if n else
                f"No step has been compiled for a GPU yet ({TARGET_COMMAND} makes the memory plans on this machine)")
    measured_ = [r for r in runs if r.get("platform") == "gpu" and r.get("status") == "ok"]
    ran = ("the GPU campaign's results are in the appendix" if (root / "gpu" / "report.md").is_file() else
           f"{len(measured_)} runs ran on a GPU" if measured_ else f"nothing has run on a GPU yet ({GPU_COMMANDS})")
    return f"{compiled}; {ran}."


def gpu_short(runs: list[dict], root: Path, out: Path) -> str:
    said = gpu(runs, root, out)
    if said.startswith("No step") and "nothing has run" in said:
        return "No step has run on, or been compiled for, a GPU yet (section 5 gives the commands)."
    return said[0].upper() + said[1:]


def techniques(docs: str) -> str:
    """The technique index's table, its links made to work from the report's folder (`docs`: the docs folder from there)."""
    lines = [ln for ln in TECHNIQUES_INDEX.read_text().splitlines() if ln.startswith("|")] if TECHNIQUES_INDEX.is_file() else []
    return "\n".join(re.sub(r"\]\(([\w.-]+\.md)\)", rf"]({docs}/techniques/\1)", ln) for ln in lines) or "(missing: docs/techniques/index.md)"


# --------------------------------------------------------------------------- trade-offs


def attention_share() -> str:
    """The attention matrices' share of one sequence's activations, from jaxlm.memory's model."""
    from jaxlm.analysis import memory
    from jaxlm.core.config import ComputeConfig, ModelConfig

    out = []
    for t in (256, 1024):
        est = memory.estimate(ModelConfig.from_name("small", context_length=t), 1, t, ComputeConfig())
        att = sum(v for k, v in est.activations.items() if k.startswith("attention") and "output" not in k)
        out.append(f"{100 * att / est.activation_total:.0f}% at T = {t}")
    return ("in `jaxlm.memory`'s activation model of the `small` preset they are " + " and ".join(out)
            + " of what a float32 train step keeps per sequence.")


H100 = (("float32", {}), ("bfloat16", {"dtype": "bfloat16"}), ("+ fused attention", {"dtype": "bfloat16", "attention": "cudnn"}),
        ("+ full remat", {"dtype": "bfloat16", "attention": "cudnn", "remat": "full"}))


def h100_batches() -> str:
    from jaxlm.analysis import memory
    from jaxlm.analysis.devices import DEVICES
    from jaxlm.core.config import ComputeConfig, ModelConfig

    m = ModelConfig.from_name("small", context_length=1024)
    usable = DEVICES["h100-80gb"].memory_bytes * memory.DEFAULT_USABLE  # what `python -m jaxlm.memory` plans for
    got = [(label, memory.largest_batch(m, 1024, usable, ComputeConfig(**kw))) for label, kw in H100]
    return ("the largest batch that fits is " + ", ".join(f"{b} sequences in {label}" for label, b in got)
            + f" ({got[-1][1] / got[0][1]:.0f}x float32's): bfloat16 halves the activation bytes but adds bfloat16 "
            "copies of the weights, fused attention drops the T x T matrices, and remat keeps only each block's input.")


def h100_compiled(root: Path) -> str:
    """The techniques' memory compiled for an H100 (deliverables.compiled_memory's `techniques-small` rows), if any."""
    from deliverables.compiled_memory import cached

    got = cached("techniques-small", "h100-80gb", root / "compiled")
    if "float32" not in got:
        return ("Compiled for an H100 by XLA's GPU compiler, the same comparison is pending: "
                f"{TARGET_COMMAND}.")
    base = got["float32"]["total_bytes"]
    parts = [f"{label} {v['total_bytes'] / 2**30:.2f} GiB ({100 * (v['total_bytes'] / base - 1):+.0f}%)"
             for label, v in got.items() if label != "float32"]
    return ("Compiled for an H100 by XLA's GPU compiler on this machine (the compiler's plan, not a measurement), "
            f"the `small` model's train step at context 1024, batch 8, needs {base / 2**30:.2f} GiB in float32; "
            + "; ".join(parts) + ".")


def speed_cpu(rows: list[dict]) -> str:
    train = [r for r in rows if r.get("mode") == "train_step" and r.get("device") == "cpu" and r.get("tokens_per_s")]
    if not train:
        return "No train-step throughput was measured here (missing)."
    lo, hi = min(train, key=lambda r: r["tokens_per_s"]), max(train, key=lambda r: r["tokens_per_s"])
    return (f"On this CPU a train step runs at {fmt(lo['tokens_per_s'], 'count')} to {fmt(hi['tokens_per_s'], 'count')} "
            f"tokens/s across the benchmarked shapes (context {lo.get('context')} batch {lo.get('batch')} to context "
            f"{hi.get('context')} batch {hi.get('batch')}). A CPU has a few cores and no tensor cores to keep busy, so a "
            "larger batch does not buy the throughput it buys on a GPU, and the load of the shared machine moves single "
            "rows; the GPU figures "
            "(throughput against batch in both dtypes, MFU) are pending (section 5).")


def backend_facts(runs: list[dict]) -> str:
    """What the compiled CPU steps of the optimizations plan show about remat and bfloat16 (bench rows)."""
    rows = [r for r in figures.bench_rows([x for x in runs if x.get("plan") == "optimizations"]) if r.get("device") == "cpu"]
    key = lambda r: (r.get("mode"), r.get("context"), r.get("batch"), r.get("attention"))
    base = {key(r): r for r in rows if r.get("dtype") == "float32" and r.get("remat") in (None, "none")}
    said = []
    for r in rows:
        b = base.get(key(r))
        if r.get("remat") not in (None, "none") and b and r.get("xla_flops") and b.get("xla_flops") and not said:
            said.append(f"full remat's compiled step (T={r['context']}, B={r['batch']}) has {r.get('hlo_dots')} matmuls "
                        f"against {b.get('hlo_dots')} and {100 * (r['xla_flops'] / b['xla_flops'] - 1):.0f}% more FLOPs, "
                        "so the CPU does recompute, but its buffer schedule is not a GPU's")
    dtypes = {tuple(r.get("matmul_dtypes") or ()) for r in rows if r.get("dtype") == "bfloat16"}
    if dtypes == {("f32",)}:
        said.append("the bfloat16 steps' matmuls all produce float32: XLA:CPU computes bfloat16 through float32")
    return ("Read from the compiled CPU steps: " + "; ".join(said) + ". So the bars above are not these techniques' GPU "
            "effect.") if said else ""


def accuracy(rows: list[dict], runs: list[dict]) -> dict[str, str]:
    return {"remat_loss": measured(rows, "optimizations", "rematerialisation", "optimizations", first=True),
            "window_loss": variant_loss(runs, r"window\d+", lambda n: f"a {n[6:]}-token window", "with full attention"),
            "bf16_loss": variant_loss(runs, "bfloat16", lambda n: "bfloat16", "in float32"),
            "lora": measured(rows, "peft", "LoRA comes close", "peft") + "; "
                    + measured(rows, "peft", "NF4", "peft"),
            "int8": measured(rows, "quantization", "int8", "quantization"),
            "qat": measured(rows, "quantization", "QAT", "quantization")}


def variant_loss(runs: list[dict], pattern: str, label, base_label: str) -> str:
    """Variants of the optimizations plan (run names matching `pattern`_bN) against float32_bN at the smallest batch
    both have: seed-mean validation loss and whether every variant was at or below the baseline."""
    import statistics

    loss: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        m = re.match(rf"({pattern}|float32)_b(\d+)", str(r.get("name")))
        if r.get("plan") == "optimizations" and m and r.get("status") == "ok" and (r.get("metrics") or {}).get("eval_loss"):
            loss.setdefault((m.group(1), int(m.group(2))), []).append(r["metrics"]["eval_loss"])
    batches = sorted({b for (n, b) in loss if n != "float32" and ("float32", b) in loss})
    if not batches:
        return "not in the records (run `python -m experiments.run optimizations`)"
    b = batches[0]
    base = statistics.mean(loss[("float32", b)])
    means = {name: statistics.mean(v) for (name, bb), v in sorted(loss.items()) if bb == b and name != "float32"}
    verdict = ("no loss cost" if all(v <= base + 1e-3 for v in means.values()) else
               "a loss cost" if all(v > base for v in means.values()) else "mixed")
    return (" and ".join(f"{label(n)} reached {v:.3f}" for n, v in means.items()) + f" against {base:.3f} {base_label} "
            f"(validation loss at batch {b}, seed means; the plan report tests the noise): {verdict} at this size")


# --------------------------------------------------------------------------- limits and the document


def limits(runs: list[dict], missing: list[str], root: Path, out: Path) -> str:
    skipped: dict[str, list[str]] = {}
    for r in runs:
        if r.get("status") == "skipped":
            skipped.setdefault(str(r.get("reason") or "no reason recorded"), []).append(r["name"])
    items = [
        "- **GPU speed and memory.** " + gpu(runs, root, out) + " XLA's CPU backend computes bfloat16 through float32, "
        "has no fused attention kernel and schedules buffers unlike a GPU, so the speed-ups and most memory savings "
        "of bfloat16, fused attention and remat are GPU figures; the CPU gives their loss effect and the analytic "
        "estimate gives their memory.",
        "- **Kernel-level profiles** (the Nsight questions) need CUDA kernels: the campaign's `profile` step answers them "
        "on a GPU ([answers.md]($docs/answers.md#nsys_profile)).",
        "- **Full-size corpora and models.** TinyStories, OpenWebText and WikiText-103 are not on this machine and "
        "GPT-2-sized models do not train on 2 cores: the studies use the corpora of section 1 with "
        f"{models(runs).split(' (')[0].replace('Training runs use models', 'models')}, so absolute losses are not "
        "comparable with the published ones, only the directions.",
    ]
    items += [f"- {len(names)} run(s) skipped here: {reason} ({', '.join(f'`{n}`' for n in names[:3])}"
              f"{', ...' if len(names) > 3 else ''})." for reason, names in skipped.items()]
    if missing:
        items.append("- Plans without records here: " + ", ".join(f"`{p}`" for p in missing) + ".")
    return "\n".join(items)


def required_figures(runs: list[dict], out: Path) -> dict[str, str]:
    """The three required plots (written under OUT/figures by `figures`) with their computed sentences."""
    fig_dir = out / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    rows = figures.bench_rows(runs)
    return {"fig_memory": "\n".join(figures.memory_vs_context(rows, fig_dir)),
            "fig_throughput": "\n".join(figures.throughput_vs_batch(rows, fig_dir)),
            "fig_before_after": "\n".join(figures.before_after(runs, fig_dir))}


def build(root: Path, out: Path, runs: list[dict], plans: list[str], missing: list[str], corpus) -> str:
    """report.md's text from every plan's runs (`written` has regenerated each plan's report under OUT/plans)."""
    rows = all_findings(out, [p for p in plans if p not in missing])
    docs = os.path.relpath(TECHNIQUES_INDEX.parents[1].resolve(), out.resolve())
    facts = {"docs": docs, "generated": (f"Generated by `python -m experiments.report --all {root} --out {out}` from "
                                         f"{len(runs)} run records of {len(plans) - len(missing)} plans; every number is "
                                         "computed from them or from the library's analytic models, none typed in."),
             "corpora": corpora(runs, corpus), "models": models(runs), "seeds": seeds(runs),
             "records": f"under `{root}`",
             "host": host(runs), "gpu": gpu_short(runs, root, out), "techniques": techniques(docs),
             "mem_batch": measured(rows, "profiling", "linearly with batch", "profiling", first=True),
             "mem_context": measured(rows, "profiling", "faster than linearly", "profiling", first=True),
             "attention_share": attention_share()[0].upper() + attention_share()[1:], "h100_batches": h100_batches(),
             "h100_compiled": h100_compiled(root),
             "speed_cpu": speed_cpu(figures.bench_rows(runs)), "backend": backend_facts(runs),
             "limits": limits(runs, missing, root, out)}
    facts |= required_figures(runs, out) | accuracy(rows, runs) | findings_facts(rows)
    text = render(facts)
    return string.Template(text).safe_substitute(docs=docs)  # $docs inside the facts themselves
