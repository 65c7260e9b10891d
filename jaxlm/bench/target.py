"""The rows of `python -m jaxlm.bench model --target GPU`: each setting and shape compiled for the GPU
(jaxlm.training.compiled) instead of timed, in the columns of a benchmark row, with its step time, tokens/s
and MFU predicted from the compiled program (`predicted_*`: a roofline over its kernels, not measured).

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
from jaxlm.training import compiled as gpu

PREDICTED = ("predicted_step_ms", "predicted_tokens_per_s", "predicted_mfu")
BENCH_COLUMNS = ("framework", "mode", "dtype", "attention", "remat", "context", "batch", "status", "compile_s",
                 *PREDICTED, "argument_gb", "temp_gb", "total_gb", "fits", "matmuls", "matmul_dtypes",
                 "cudnn_attention_calls", "largest_batch", "error")


def setting_config(setting, cfg: Config, context: int, batch: int) -> Config:
    """cfg with a benchmark setting's model (window) and compute, at exactly this context and batch."""
    model, compute = setting.configs(cfg.model, context)
    return dataclasses.replace(cfg, model=dataclasses.replace(model, context_length=context), compute=compute,
                               data=dataclasses.replace(cfg.data, batch_size=batch))


def bench_row(setting, cfg: Config, context: int, batch: int, target: gpu.Target, name: str) -> dict:
    """One compiled benchmark row (no timing columns, the predicted ones instead); a failure becomes an error row
    whose predicted columns are empty, as in a timed sweep."""
    row = {"framework": setting.framework, "model": name, "mode": setting.mode, "dtype": setting.dtype,
           "attention": setting.attention, "remat": setting.remat, "context": context, "batch": batch,
           "device": target.label, "params": param_counts(cfg.model)["total"]}
    try:
        r = gpu.compiled_row(setting_config(setting, cfg, context, batch), target, setting.mode)
    except (UsageError, ConfigError, ValueError) as e:  # e.g. cuDNN at float32, a batch the mesh cannot split
        return {**row, **dict.fromkeys(PREDICTED), "status": "invalid", "error": str(e).splitlines()[0][:200]}
    r["matmul_dtypes"] = " ".join(f"{k}:{v}" for k, v in r["matmul_dtypes"].items())
    gb = {f"{k}_gb": r[f"{k}_bytes"] / 1e9 for k in ("argument", "output", "alias", "temp", "total")}
    # memory_gb / memory_source: what reports and plots of timed sweeps read, here the compiled total
    return {**row, **r, **gb, "memory_gb": gb["total_gb"], "memory_source": f"compiled for {target.name}",
            "status": "ok"}


def compiled_rows(settings: list, cfg: Config, contexts: list[int], batches: list[int], target: gpu.Target,
                  name: str, largest_limit: int | None = None, on_row: Callable[[object, dict], None] | None = None,
                  save: Callable[[list[dict]], str] = lambda rows: "") -> list[dict]:
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
            row = bench_row(setting, cfg, context, batch, target, name)
            if largest_limit and row["status"] == "ok":
                shaped = setting_config(setting, cfg, context, batch)
                row["largest_batch"] = gpu.largest_batch(shaped, target, setting.mode, limit=largest_limit)
            rows.append(row)
            if on_row:
                on_row(setting, row)
    return rows
