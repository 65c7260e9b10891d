"""How long a plan will take, before running it: model FLOPs (jaxlm.analysis.flops.step_flops) at a throughput per
platform (docs/experiments.md). Outcome-dependent (`--find-max-batch`), compile-only and `command` runs are not
estimated."""

from __future__ import annotations

import functools
import itertools
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from experiments.commands import Device, bench_overrides, train_config, unmet_requirement
from experiments.plan import Plan, RunSpec, load_plan, plan_names
from jaxlm.analysis.devices import DEVICES
from jaxlm.analysis.flops import step_flops
from jaxlm.core.config import Config, DataConfig, load_config
from jaxlm.data.prepare import read_meta


@dataclass(frozen=True)
class Throughput:
    flops_per_s: float
    step_overhead_s: float
    startup_s: float  # process start, JAX import, first compile
    row_compile_s: float  # each further bench row compiles its own step
    source: str

    def step_s(self, flops: float) -> float:
        return self.step_overhead_s + flops / self.flops_per_s


THROUGHPUT = {
    "cpu": Throughput(200e9, 0.5e-3, 4.0, 2.0, "fitted to recorded runs on a 2-core x86 CPU"),
    "gpu": Throughput(0.4 * DEVICES["h100-80gb"].peak_flops["bfloat16"], 2e-3, 30.0, 10.0,
                      "stated: an H100 at 40 % of its bfloat16 peak"),
}
BENCH_DEFAULTS = {"batch": 4, "mode": "forward", "warmup": 5, "steps": 10}  # jaxlm.bench model's own defaults


def train_seconds(cfg: Config, tp: Throughput) -> float:
    m, b, t = cfg.model, cfg.data.batch_size, cfg.model.context_length
    eval_tokens = cfg.data.eval_tokens
    val = Path(cfg.data.dir) / "val.bin"
    if not eval_tokens:  # the whole split: the prepared val.bin's length, else the default
        eval_tokens = (val.stat().st_size // np.dtype(read_meta(cfg.data.dir)["dtype"]).itemsize if val.is_file()
                       else DataConfig.eval_tokens)
    eb = cfg.data.batch_size // cfg.train.grad_accum
    evals = math.ceil(cfg.train.steps / cfg.train.eval_every) * math.ceil(math.ceil(eval_tokens / t) / eb)
    train = cfg.train.steps * tp.step_s(step_flops(m, b, t, "train_step"))
    return tp.startup_s + train + evals * tp.step_s(step_flops(m, eb, t, "forward"))


def _values(args: dict, key: str, default) -> list:
    v = args.get(key, default)
    return v if isinstance(v, list) else [v]


def bench_seconds(args: dict, overrides: list[str], tp: Throughput) -> float | None:
    """Every row of a `jaxlm.bench model` sweep: contexts x batches x modes x dtypes x attentions x remats x
    frameworks."""
    if args.get("find_max_batch") or args.get("target"):  # compile-only rows for a GPU: compile time is not modelled
        return None
    cfg = load_config(None, overrides, preset=args.get("preset"))
    steps = args.get("warmup", BENCH_DEFAULTS["warmup"]) + args.get("steps", BENCH_DEFAULTS["steps"])
    frameworks = 2 if args.get("framework") == "both" else 1
    variants = frameworks * math.prod(len(_values(args, k, None)) for k in ("dtype", "attention", "remat"))
    rows = itertools.product(_values(args, "context", cfg.model.context_length),
                             _values(args, "batch", BENCH_DEFAULTS["batch"]),
                             _values(args, "mode", BENCH_DEFAULTS["mode"]))
    per_variant = sum(tp.row_compile_s + steps * tp.step_s(step_flops(cfg.model, b, t, mode)) for t, b, mode in rows)
    return tp.startup_s + variants * per_variant


def estimate_seconds(spec: RunSpec, platform: str) -> float | None:
    """One run's estimated wall time on `platform` (cpu | gpu), or None where it cannot be told."""
    tp = THROUGHPUT.get(platform, THROUGHPUT["cpu"])
    if spec.kind == "train":
        return train_seconds(train_config(spec), tp)
    if spec.kind == "bench":
        return bench_seconds(spec.args, bench_overrides(spec), tp)
    return None


def plan_seconds(runs: Iterable[RunSpec], platform: str) -> tuple[float, int]:
    """The estimated seconds of the runs that can happen on `platform`, and how many have no estimate."""
    device = Device(platform, platform, 1)
    known = [estimate_seconds(r, platform) for r in runs if unmet_requirement(r, device) is None]
    return sum(s for s in known if s is not None), sum(s is None for s in known)


def format_seconds(s: float) -> str:
    """12 s, 4 min, 1.5 h: an estimate's precision."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def plan_estimate(runs: Iterable[RunSpec], platform: str) -> str:
    """`~4 min`, `~4 min + 2 runs not estimated`: the runs that can happen on `platform`."""
    seconds, unknown = plan_seconds(runs, platform)
    return f"~{format_seconds(seconds)}" + (f" + {unknown} run{'s' * (unknown > 1)} not estimated" if unknown else "")


def data_setting(plan: Plan) -> str | None:
    """'train wikitext-2/test.txt, validate wikitext-2/valid.txt, tokenizer bpe:4096' of the first training run."""
    for d in (train_config(r).data for r in plan.runs if r.kind == "train"):
        val = f"validate {', '.join(d.val_source)}" if d.val_source else f"validate on its last {d.val_fraction:g}"
        return f"train {', '.join(d.source)}, {val}, tokenizer {d.tokenizer}"
    return None


def list_plans() -> str:
    """Every shipped plan with its description and, per size, its runs and estimated time."""
    lines = ["plans (python -m experiments.run PLAN [--size SIZE] [--dry-run]):"]
    fill = functools.partial(textwrap.fill, width=100, initial_indent=" " * 4)
    for name in plan_names():
        sized = [load_plan(name, size) for size in load_plan(name).sizes]
        per_size = [f"{p.size}: {len(p.runs)} runs, {plan_estimate(p.runs, p.size)}" for p in sized]
        lines += ["", f"  {name}  ({'; '.join(per_size)})",
                  fill(" ".join(sized[0].description.split()), subsequent_indent=" " * 4)]
        if data := [f"{p.size}: {d}" for p in sized if (d := data_setting(p))]:
            lines.append(fill("data: " + "; ".join(data), subsequent_indent=" " * 6))
    lines += ["", "Times are estimates: " + "; ".join(f"{k}: {t.source}" for k, t in THROUGHPUT.items()) + "."]
    return "\n".join(lines)
