"""The rows of `python -m jaxlm.bench model --target GPU`: each setting and shape compiled for the GPU
(jaxlm.predict.compile) instead of timed, in the columns of a benchmark row, with its step time, tokens/s
and MFU predicted from the compiled program (`predicted_*`: its kernels priced, not measured). A `setting` is a
benchmark case (jaxlm.bench.measure.BenchCase: framework, mode, dtype, attention, remat and `configs()`).

    python -m jaxlm.bench model --target h100-80gb --preset small --context 256 1024 --mode train_step --json F

A sweep of compiles takes minutes; SIGTERM or Ctrl-C stops it when the compile in progress returns (XLA's
compiler cannot be interrupted) and keeps the rows done: the table and the --json file hold them, and one line
says how many (exit 130).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

from jaxlm.analysis.flops import param_counts
from jaxlm.core.config import Config
from jaxlm.core.errors import ConfigError, UsageError
from jaxlm.core.stop import Interrupted, StopFlag
from jaxlm.predict import compile as gpu
from jaxlm.predict.calibration import Calibration
from jaxlm.predict.target import Target

PREDICTED = ("predicted_step_ms", "predicted_tokens_per_s", "predicted_mfu")
GIB = 2**30
BENCH_COLUMNS = ("framework", "mode", "dtype_label", "attention", "remat", "context", "batch", "status", "compile_s",
                 *PREDICTED, "argument_gib", "temp_gib", "total_gib", "fits", "matmuls", "matmul_dtypes",
                 "cudnn_attention_calls", "largest_batch", "note", "error")


def setting_config(setting, cfg: Config, context: int, batch: int) -> Config:
    """cfg with a benchmark setting's model (window) and compute, at exactly this context and batch."""
    model, compute = setting.configs(cfg.model, context)
    return dataclasses.replace(cfg, model=dataclasses.replace(model, context_length=context), compute=compute,
                               data=dataclasses.replace(cfg.data, batch_size=batch))


def bench_row(setting, cfg: Config, context: int, batch: int, target: Target, name: str,
              calibration: Calibration | None = None) -> dict:
    """One compiled benchmark row (no timing columns, the predicted ones instead); a failure becomes an error row
    whose predicted columns are empty, as in a timed sweep. Memory in GiB; a step that does not fit has no
    predicted time and its `note` says so."""
    row = {"framework": setting.framework, "model": name, "mode": setting.mode, "dtype": setting.dtype,
           "dtype_label": setting.dtype, "attention": setting.attention, "remat": setting.remat, "context": context,
           "batch": batch, "device": target.label, "params": param_counts(cfg.model)["total"]}
    try:
        r = gpu.compiled_row(setting_config(setting, cfg, context, batch), target, setting.mode,
                             calibration=calibration)
    except (UsageError, ConfigError, ValueError) as e:  # e.g. cuDNN at float32, a batch the mesh cannot split
        return {**row, **dict.fromkeys(PREDICTED), "status": "invalid", "error": str(e).splitlines()[0][:200]}
    r["matmul_dtypes"] = " ".join(f"{k}:{v}" for k, v in r["matmul_dtypes"].items())
    gib = {f"{k}_gib": r[f"{k}_bytes"] / GIB for k in ("argument", "output", "alias", "temp", "total")}
    note = {"note": r["predicted_label"]} if r.get("predicted_step_ms") is None else {}
    # memory_gb / memory_source: what reports and plots of timed sweeps read (GB), here the compiled total
    return {**row, **r, **gib, **note, "memory_gb": r["total_bytes"] / 1e9,
            "memory_source": f"compiled for {target.name}", "status": "ok"}


def compiled_rows(settings: list, cfg: Config, contexts: list[int], batches: list[int], target: Target,
                  name: str, largest_limit: int | None = None, on_row: Callable[[object, dict], None] | None = None,
                  save: Callable[[list[dict]], str] = lambda rows: "", calibration: Calibration | None = None
                  ) -> list[dict]:
    """Every setting at every (context, batch), compiled (with the largest batch by compiling when
    `largest_limit`); `on_row(setting, row)` after each. A signal stops the sweep between compiles: `save(rows)`
    keeps what is done and returns where, and the stop (Interrupted) says how many rows that is."""
    rows: list[dict] = []
    shapes = list(itertools.product(settings, contexts, batches))
    with StopFlag() as flag:
        flag.on_abort.append(lambda: f"{len(rows)} of {len(shapes)} compiled rows kept in {save(rows)}")
        for setting, context, batch in shapes:
            if flag.signal:
                raise Interrupted(f"{flag.signal}: stopped after {len(rows)} of {len(shapes)} compiled rows; "
                                  f"kept in {save(rows)}")
            row = bench_row(setting, cfg, context, batch, target, name, calibration)
            if largest_limit and row["status"] == "ok":
                shaped = setting_config(setting, cfg, context, batch)
                row["largest_batch"] = gpu.largest_batch(shaped, target, setting.mode, limit=largest_limit)
            rows.append(row)
            if on_row:
                on_row(setting, row)
    return rows


def kernel_table(cfg: Config, target: Target, mode: str, top: int, calibration: Calibration | None = None) -> dict:
    """`python -m jaxlm.bench ops --target`'s figures: the step compiled for `target` and its predicted kernel
    groups, passes, model parts, slowest ops and kernels (jaxlm.predict.compile.prediction, the `top` of each)."""
    from jaxlm.predict import hlo

    compiled, seconds, options = gpu.compile_step(cfg, target, mode)
    row = gpu.describe(compiled, target)
    row.update(gpu.prediction(hlo.parse_module(compiled.as_text()), cfg, target, mode, top, calibration)
               if row["fits"] else {"predicted_label": gpu.does_not_fit(row)})
    c = cfg.compute
    keys = ("predicted_step_ms", "predicted_tokens_per_s", "predicted_mfu", "predicted_peak", "matmul_precision")
    return {"mode": mode, "batch": cfg.data.batch_size, "context": cfg.model.context_length, "dtype": c.dtype,
            "dtype_label": gpu.dtype_label(c.dtype, row["matmul_precision"]), "attention": c.attention,
            "remat": c.remat, "model": dataclasses.asdict(cfg.model), "compile_s": seconds,
            "compiler_options": options, "total_bytes": row["total_bytes"], "usable_bytes": row["usable_bytes"],
            "fits": row["fits"], "label": row["predicted_label"], **{k: row.get(k) for k in keys},
            **{k: row.get(f"predicted_{k}", [] if k in ("top", "ops", "notes") else {})
               for k in ("groups", "phases", "components", "ops", "top", "notes")}}
