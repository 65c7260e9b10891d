"""What a CPU backend can show of a plan's rows (faithful for float32, not for bfloat16's or remat's memory or
speed), from the compiled steps jaxlm.bench records, and each CPU-measured step compiled for an 80 GB H100."""

from __future__ import annotations

import dataclasses
import json
import re

from deliverables.common import table
from deliverables.report.format import fmt
from jaxlm.core.errors import MissingExtra, UserError
from jaxlm.core.typedconfig import to_dict, toml_value

SECTION = "What this backend can show"
DEVICE = "h100-80gb"
TECHNIQUE_SENTENCE = re.compile(r"^(?:\w+: )?(?:bfloat16|remat\w*|dtype=bfloat16|remat=\w+) against .*memory")


def is_cpu(runs: list[dict]) -> bool:
    return any(r.get("device") == "cpu" for r in runs)


def _shape(r: dict) -> str:
    return f"{r.get('mode')} T={r.get('context')} B={r.get('batch')}"


def evidence(brows: list[dict]) -> list[str]:
    """Sentences on remat and bfloat16 from the compiled steps' recorded matmuls, FLOPs and memory estimates."""
    ok = [r for r in brows if r.get("status") == "ok" and r.get("device") == "cpu"]
    same = lambda r: (r.get("mode"), r.get("dtype"), r.get("attention"), r.get("context"), r.get("batch"))
    plain = {same(r): r for r in ok if r.get("remat") in (None, "none")}
    out = []
    for r in ok:
        b = plain.get(same(r))
        if r.get("remat") in (None, "none") or b is None or r.get("hlo_dots") is None or b.get("hlo_dots") is None:
            continue
        kept = r["hlo_dots"] > b["hlo_dots"]
        out.append(f"remat={r['remat']} ({_shape(r)}): the compiled step has {r['hlo_dots']} matmuls and "
                   f"{fmt(r.get('xla_flops'), 'count')} FLOPs against {b['hlo_dots']} and "
                   f"{fmt(b.get('xla_flops'), 'count')} "
                   f"without remat, so XLA:CPU {'keeps' if kept else 'removed'} the recomputation; its compiled memory "
                   f"estimate is {fmt(r.get('estimate_gb'), 'g')} GB against {fmt(b.get('estimate_gb'), 'g')} GB. "
                   "XLA:CPU schedules and frees buffers unlike a GPU, so this memory figure is not remat's effect "
                   "there (the GPU campaign measures it; the estimate below is what the policy should save).")
    for r in ok:
        dtypes = r.get("matmul_dtypes")
        if r.get("dtype") == "bfloat16" and dtypes:
            through = dtypes == ["f32"]
            out.append(f"bfloat16 ({_shape(r)}): the compiled step's {r.get('hlo_dots')} matmuls produce "
                       f"{', '.join(dtypes)}" + (", i.e. XLA:CPU computes bfloat16 through float32: neither memory nor "
                                                 "speed here is bfloat16's effect on a GPU." if through else "."))
    if not out and any(r.get("remat") not in (None, "none") or r.get("dtype") == "bfloat16" for r in ok):
        out.append("These records predate the recorded compiled-step evidence (matmul count and dtypes); rerun the "
                   "plan to have it.")
    return out


def annotate(sentences: list[str], cpu: bool) -> list[str]:
    """On a CPU, a sentence giving bfloat16's or remat's memory change says it is not the technique's effect."""
    if not cpu:
        return sentences
    note = f" On a CPU this memory figure is not the technique's effect (see *{SECTION}*)."
    return [s + note if TECHNIQUE_SENTENCE.search(s) else s for s in sentences]


def _bench_config(run: dict, row: dict):
    from jaxlm.bench.measure import BenchCase
    from jaxlm.core.config import load_config

    spec = run.get("spec") or {}
    overrides = [f"{k}={toml_value(v)}" for k, v in (spec.get("set") or {}).items()
                 if k.split(".")[0] in ("model", "compute")]
    cfg = load_config(None, overrides, preset=(spec.get("args") or {}).get("preset"))
    setting = BenchCase(mode=row["mode"], dtype=row["dtype"], attention=row.get("attention") or "xla",
                        remat=row.get("remat") or "none")
    return setting.configs(cfg.model, row["context"])


def _job(model, compute, batch: int, mode: str, config: dict | None = None) -> dict:
    """The step as a compile job (jaxlm.predict.store's form): every model and compute key it ran with, and a
    training run's LoRA or QAT settings where it had them (`config`: its recorded config)."""
    config = config or {}
    parts = {"model": to_dict(model), "compute": to_dict(compute),
             "lora": config["lora"] if (config.get("lora") or {}).get("rank") else {}, "qat": config.get("qat") or {}}
    sets = [f"{part}.{k}={toml_value(v)}" for part, keys in parts.items() for k, v in sorted(keys.items())]
    return {"preset": None, "set": [*sets, f"data.batch_size={batch}"], "mode": mode}


def _steps(runs: list[dict], brows: list[dict]) -> list[dict]:
    """Each CPU-measured step: its label, what was measured, and its compile job (bench rows, then training runs)."""
    from jaxlm.core.config import ComputeConfig, ModelConfig

    out = []
    by_name = {r["name"]: r for r in runs}
    for row in brows:
        if row.get("status") != "ok" or row.get("device") != "cpu" or row.get("framework", "jax") != "jax":
            continue
        try:
            model, compute = _bench_config(by_name.get(row["run"], {}), row)
        except (KeyError, TypeError, ValueError, UserError):  # a record without the fields to rebuild its model
            continue
        what = {"memory_analysis": "compiled estimate",
                "memory_stats": "peak device memory"}.get(row.get("memory_source"), "?")
        model = dataclasses.replace(model, context_length=row["context"])
        label = f"`{row['run']}` {row['mode']} {row['dtype']} {row.get('attention')} remat={row.get('remat')}"
        out.append({"label": label,
                    "bytes": row["memory_gb"] * 1e9 if isinstance(row.get("memory_gb"), (int, float)) else None,
                    "what": what, "job": _job(model, compute, row["batch"], row["mode"])})
    for r in runs:
        c = r.get("config") or {}
        if r.get("kind") == "bench" or not c or r.get("device") != "cpu" or r.get("status") != "ok":
            continue
        try:
            model, compute = ModelConfig(**c["model"]), ComputeConfig(**c.get("compute", {}))
            job = _job(model, compute, c["data"]["batch_size"], "train_step", c)
        except (KeyError, TypeError, ValueError, UserError):
            continue
        out.append({"label": f"`{r['name']}`", "bytes": r.get("max_rss_bytes"), "what": "peak host RSS", "job": job})
    return out


def _compiled(job: dict, store, target, compile: bool) -> dict | None:
    """The job's compiled figures: from the cache, or compiled now (`compile`); None when neither can be had."""
    if job["mode"] not in ("train_step", "forward"):
        return {"error": "(train_step and forward only)"}
    if not (compile or store.has(job, target)):
        return None
    try:
        return store.row(job, target, log=lambda m: print(f"compiled for {target.name}: {m}", flush=True))
    except MissingExtra:
        return None
    except UserError as e:  # a setting the GPU compiler refuses: the row says so
        return {"error": str(e).splitlines()[0][:120]}


def _measured(steps: list[dict]) -> str:
    values = sorted(s["bytes"] for s in steps if s["bytes"])
    if not values:
        return "-"
    low, high = fmt(values[0], "bytes"), fmt(values[-1], "bytes")
    span = low + ("" if low == high else f" to {high}")
    return f"{span} ({steps[0]['what']})"


def gpu_table(runs: list[dict], brows: list[dict], compile: bool = False, cache=None) -> str | None:
    """The CPU-measured steps compiled for an 80 GB H100 (the GPU compiler's plan), with jaxlm.memory's estimate
    beside them; steps with the same model, compute settings and batch share a row. Compiled figures are kept in
    `cache` (default: deliverables.compiled_memory's, docs/results/compiled/)."""
    from deliverables.compiled_memory import OUT_DIR
    from jaxlm.analysis import memory
    from jaxlm.analysis.devices import DEVICES
    from jaxlm.predict.store import CompileCache, job_config
    from jaxlm.predict.target import parse_target

    groups: dict[str, list[dict]] = {}
    for step in _steps(runs, brows):
        groups.setdefault(json.dumps(step["job"], sort_keys=True), []).append(step)
    if not groups:
        return None
    target, store = parse_target(DEVICE), CompileCache(cache or OUT_DIR / f"{DEVICE}.json")
    cap = DEVICES[DEVICE].memory_bytes * memory.DEFAULT_USABLE
    rows, missing = [], False
    for steps in groups.values():
        job = steps[0]["job"]
        cfg = job_config(job)
        names = [s["label"] for s in steps]
        label = ", ".join(names) if len(names) <= 3 else f"{names[0]} ... {names[-1]} ({len(names)} runs)"
        c = _compiled(job, store, target, compile)
        missing |= c is None
        compiled = "-" if c is None else c.get("error") or fmt(c["total_bytes"], "bytes")
        fits = "-" if c is None or "error" in c else "yes" if c["total_bytes"] <= cap else "no"
        est = memory.estimate(cfg.model, cfg.data.batch_size, cfg.model.context_length, cfg.compute, job["mode"]).total
        rows.append([label, str(cfg.model.context_length), str(cfg.data.batch_size), _measured(steps), compiled, fits,
                     fmt(est, "bytes"), str(memory.largest_batch(cfg.model, cfg.model.context_length, cap, cfg.compute,
                                                                 job["mode"]))])
    text = ("Each CPU-measured step compiled for an 80 GB H100 by XLA's GPU compiler on a CPU-only machine (`python "
            f"-m jaxlm.memory --target {DEVICE}`): the compiler's plan (arguments + outputs + temporaries - donated), "
            f"**not a measurement**; *fits*: within JAX's allocator share, {100 * memory.DEFAULT_USABLE:.0f}% of its "
            f"{DEVICES[DEVICE].memory_bytes / 2**30:.1f} GiB. Beside it, `python -m jaxlm.memory`'s analytic estimate "
            "of the same step and the largest batch it predicts. Steps with the same model, compute settings and "
            "batch share a row.")
    if missing:
        text += (" *-*: not compiled here (rebuild the report with `--compile`, which needs the `gpu-compile` extra).")
    return text + "\n\n" + table(["run", "context", "batch", "measured here", "H100 compiled", "fits",
                                   "H100 estimate", "largest batch (estimate)"], rows)


def section(runs: list[dict], brows: list[dict], compile: bool = False) -> list[str]:
    """The report section, on CPU runs only; `compile` compiles for the H100 what the cache does not hold."""
    if not is_cpu(runs):
        return []
    lines = [f"## {SECTION}", "", "This plan ran on a CPU. XLA's CPU backend gives faithful float32 results and a "
             "faithful compiled memory estimate for float32 without remat; what it shows of bfloat16 and remat is "
             "stated here from the compiled steps themselves. Memory figures say what they are: *compiled estimate* "
             "(XLA's memory_analysis of the step), *peak host RSS* (the whole process, measured by the runner), "
             "*peak device memory* (an accelerator's allocator).", ""]
    found = evidence(brows)
    lines += [f"- {s}" for s in found] + ([""] if found else [])
    gpu_rows = gpu_table(runs, brows, compile)
    return lines + ([gpu_rows, ""] if gpu_rows else [])
