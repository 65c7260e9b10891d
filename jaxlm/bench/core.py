"""What a benchmark row is, how a sweep runs, and how rows are written out.

A *setting* is everything about a run except its shape: framework, mode,
dtype, attention, remat, torch.compile. A sweep runs every setting at every
(context, batch) in the product of the lists it was given; each run becomes one
row (a flat dict, columns in `COLUMNS`), OOM and errors included, so a sweep
never stops half way. The framework-specific work lives in the modules of `SIDES`:
`jax_side` here, and the PyTorch side that `python -m parity.bench` registers
(jaxlm never imports torch); this module imports no framework at import time.
"""

from __future__ import annotations

import csv
import dataclasses
import gc
import importlib
import itertools
import json
import math
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from jaxlm.analysis import flops, memory
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.errors import UsageError
from jaxlm.core.files import atomic_write

FRAMEWORKS = ("jax", "torch")

# Row columns, in table / CSV order (the JSON rows carry the same keys).
COLUMNS = (
    "framework", "model", "mode", "dtype", "attention", "remat", "compiled", "context", "batch", "params",
    "status", "compile_s", "step_ms", "step_ms_std", "step_ms_median", "step_ms_first", "tokens_per_s", "flops_per_step", "xla_flops", "tflops", "mfu",
    "memory_gb", "memory_source", "estimate_gb", "jax_torch_speed", "device", "error",
)


@dataclass(frozen=True)
class Setting:
    """One optimisation setting; `attention` is "xla", "cudnn", "window:N" or "cudnn+window:N"."""

    framework: str = "jax"
    mode: str = "forward"
    dtype: str = "float32"
    attention: str = "xla"
    remat: str = "none"
    compile: bool = True  # torch.compile (JAX is always jitted)
    compute: ComputeConfig = ComputeConfig()  # the config's other compute keys (scan_layers, loss_chunk): JAX rows

    def configs(self, base: ModelConfig, context: int) -> tuple[ModelConfig, ComputeConfig]:
        """The row's model (context raised to fit, window from `attention`) and how it runs.

        On torch rows, any attention but "xla" means torchref's fused `F.scaled_dot_product_attention`
        (the counterpart of cudnn); "xla" rows run torchref's explicit softmax(QK^T)V.
        """
        impl, window = parse_attention(self.attention)
        model = dataclasses.replace(base, context_length=max(context, base.context_length), window=window)
        if self.framework == "torch":
            return model, ComputeConfig(dtype=self.dtype, attention="xla" if impl == "xla" else "auto")
        return model, dataclasses.replace(self.compute, dtype=self.dtype, attention=impl, remat=self.remat)

    @property
    def label(self) -> str:
        parts = [self.framework, self.mode, self.dtype, self.attention]
        if self.remat != "none":
            parts.append(f"remat={self.remat}")
        if self.framework == "torch" and not self.compile:
            parts.append("eager")
        return " ".join(parts)


def parse_attention(text: str) -> tuple[str, int | None]:
    """"xla" | "cudnn" | "auto" | "window:N" (xla, sliding window N) | "cudnn+window:N" -> (implementation, window)."""
    impl, _, rest = text.partition("+")
    if impl.startswith("window:"):
        impl, rest = "xla", impl
    if impl not in ("xla", "cudnn", "auto"):
        raise ValueError(f"unknown attention {text!r}: use xla, cudnn, auto, window:N or cudnn+window:N")
    window = None
    if rest:
        if not rest.startswith("window:") or not rest[7:].isdigit():
            raise ValueError(f"bad window in attention {text!r}; expected window:N")
        window = int(rest[7:])
    return impl, window


@dataclass(frozen=True)
class Options:
    """Run-wide knobs shared by every row."""

    warmup: int = 5
    steps: int = 10
    memory_limit_gb: float | None = None  # rows estimated above this are OOM without running
    peak_tflops: float | None = None  # override the device peak for MFU
    model_name: str = "custom"
    seed: int = 0
    torch_optimizer: str = "torch"  # "torch" (torch.optim.AdamW, foreach/fused) or "torchref" (torchref.AdamW)


def empty_row(setting: Setting, cfg: ModelConfig, context: int, batch: int, opts: Options) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(
        framework=setting.framework, model=opts.model_name, mode=setting.mode, dtype=setting.dtype,
        attention=setting.attention, remat=setting.remat if setting.framework == "jax" else "none",
        compiled=setting.compile if setting.framework == "torch" else True, context=context, batch=batch,
        params=flops.param_counts(cfg)["total"], flops_per_step=flops.step_flops(cfg, batch, context, setting.mode),
    )
    return row


def finish_row(row: dict, cfg: ModelConfig, opts: Options, device_kind: str | None) -> dict:
    """Derive tokens/s, TFLOP/s and MFU from the timed step."""
    row["device"] = device_kind
    if row.get("step_ms"):
        sec = row["step_ms"] / 1e3
        row["tokens_per_s"] = row["batch"] * row["context"] / sec
        row["tflops"] = row["flops_per_step"] / sec / 1e12
        peak = flops.peak_flops(device_kind or "", row["dtype"], opts.peak_tflops * 1e12 if opts.peak_tflops else None)
        row["mfu"] = row["flops_per_step"] / sec / peak if peak else None
    return row


def is_oom(exc: BaseException) -> bool:
    """XLA RESOURCE_EXHAUSTED, torch.cuda.OutOfMemoryError, or a plain MemoryError."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or "Out of memory" in text


def run_one(setting: Setting, base: ModelConfig, context: int, batch: int, opts: Options) -> dict:
    """Benchmark one (setting, context, batch); never raises: failures become OOM / error rows."""
    try:
        if context < 1 or batch < 1:
            raise ValueError(f"context {context} and batch {batch} must be >= 1")
        cfg, compute = setting.configs(base, context)
        row = empty_row(setting, cfg, context, batch, opts)
    except Exception as e:  # an invalid combination (e.g. cudnn with float32): a row that says so
        row = {c: None for c in COLUMNS}
        row.update(framework=setting.framework, model=opts.model_name, mode=setting.mode, dtype=setting.dtype,
                   attention=setting.attention, remat=setting.remat, context=context, batch=batch,
                   status="invalid", error=str(e).splitlines()[0][:200])
        return row
    side = framework_side(setting.framework)  # outside the try: a missing torch extra stops the sweep in one line
    try:
        device_kind = side.device_kind()
        side.measure(setting, cfg, compute, batch, context, opts, row)
        row["status"] = row["status"] or "ok"
        return finish_row(row, cfg, opts, device_kind)
    except Exception as e:
        row["status"] = "OOM" if is_oom(e) else "error"
        row["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        if row["status"] == "error":
            row["traceback"] = traceback.format_exc(limit=6)
        del e
        _release_memory()
        return row


def _release_memory() -> None:
    """After an OOM: drop the failed step's buffers so the next row starts clean."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


SIDES = {"jax": "jaxlm.bench.jax_side"}  # framework -> module; `python -m parity.bench` adds "torch"


def framework_side(framework: str, command: str = "model"):
    """The module that measures one framework's rows (build_step, run/time, memory, decode_runner)."""
    if framework not in SIDES:
        raise UsageError(f"--framework {framework}: torch rows come from `python -m parity.bench {command} ...` "
                         "(the torch extra); `python -m jaxlm.bench` measures jax only")
    return importlib.import_module(SIDES[framework])


def run_sweep(
    base: ModelConfig,
    settings: Iterable[Setting],
    contexts: Iterable[int],
    batches: Iterable[int],
    opts: Options = Options(),
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every setting at every (context, batch); returns the rows (with jax/torch speed ratios)."""
    rows = []
    for setting, context, batch in itertools.product(list(settings), list(contexts), list(batches)):
        row = run_one(setting, base, context, batch, opts)
        rows.append(row)
        if on_row:
            on_row(row)
    add_speed_ratios(rows)
    return rows


def add_speed_ratios(rows: list[dict]) -> None:
    """jax_torch_speed = torch step time / jax step time (> 1: jax faster), on the jax row of each matched pair."""
    key = lambda r: (r["model"], r["mode"], r["dtype"], r["attention"], r["context"], r["batch"])
    torch_rows = {}
    for r in rows:
        if r["framework"] == "torch" and r.get("step_ms"):
            torch_rows.setdefault(key(r), r)
    for r in rows:
        t = torch_rows.get(key(r))
        if r["framework"] == "jax" and r.get("step_ms") and t is not None:
            r["jax_torch_speed"] = t["step_ms"] / r["step_ms"]


# --------------------------------------------------------------------------- largest batch


def find_max_batch(fits: Callable[[int], bool], start: int = 1, limit: int = 1 << 16) -> int:
    """Largest batch b in [start, limit] with fits(b), by doubling then bisection; 0 if not even `start` fits.

    Assumes fits is monotone (a batch that fits implies every smaller one does).
    """
    if not fits(start):
        return 0
    lo = start  # fits
    hi = None  # does not fit
    b = start
    while b < limit:
        b = min(2 * b, limit)
        if fits(b):
            lo = b
        else:
            hi = b
            break
    if hi is None:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def batch_fits(setting: Setting, base: ModelConfig, context: int, opts: Options) -> Callable[[int], bool]:
    """fits(batch). With a memory limit: the estimate (JAX: compiled memory_analysis; torch: the analytic
    jaxlm.memory.estimate) is within it, and nothing runs. Without one: a real 1-step run does not OOM."""

    def fits(batch: int) -> bool:
        if opts.memory_limit_gb is not None:
            cfg, compute = setting.configs(base, context)
            return estimate_bytes(setting, cfg, compute, batch, context) <= opts.memory_limit_gb * 1e9
        row = run_one(setting, base, context, batch, dataclasses.replace(opts, warmup=1, steps=1))
        return row["status"] == "ok"

    return fits


def estimate_bytes(setting: Setting, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int) -> float:
    """Estimated step memory without running: XLA's memory_analysis (JAX) or jaxlm.memory.estimate (torch)."""
    if setting.framework == "jax":
        from jaxlm.bench import jax_side

        step = jax_side.build_step(setting.mode, cfg, compute, batch, context)
        est = jax_side.compiled_memory_bytes(jax_side.compile_step(step))
        if est is not None:
            return est
    return memory.estimate(cfg, batch, context, compute, setting.mode, fused=compute.attention != "xla").total


# --------------------------------------------------------------------------- output


def _fmt(value, col: str) -> str:
    if value is None:
        return "-"
    if col == "memory_gb" or col == "estimate_gb":
        return f"{value:.3f}"
    if col == "mfu":
        return f"{100 * value:.1f}%"
    if col in ("params", "flops_per_step"):
        return _si(value)
    if col == "tokens_per_s":
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _si(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return str(x)


TABLE_COLUMNS = (
    "framework", "mode", "dtype", "attention", "remat", "context", "batch", "status", "compile_s", "step_ms",
    "step_ms_std", "tokens_per_s", "tflops", "mfu", "memory_gb", "memory_source", "jax_torch_speed",
)


HEADINGS = {  # table headings that read as words; other columns: the key with spaces
    "compile_s": "compile s", "step_ms": "step ms", "tokens_per_s": "tokens/s",
    "tflops": "TFLOP/s", "mfu": "MFU", "memory_gb": "memory GB", "memory_source": "memory from",
    "jax_torch_speed": "speedup vs torch",
}


def format_table(rows: list[dict], columns=TABLE_COLUMNS) -> str:
    """A fixed-width console table; columns that are empty in every row are dropped."""
    cols = [c for c in columns if any(r.get(c) not in (None, "none") for r in rows) or c in ("framework", "status")]
    cells = [[_fmt(r.get(c), c) for c in cols] for r in rows]
    heads = [HEADINGS.get(c, c.replace("_", " ")) for c in cols]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(c) for c in cells])


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_rows(rows: list[dict], path: str | Path, meta: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean = [{k: _json_safe(v) for k, v in r.items()} for r in rows]
    return atomic_write(path, json.dumps({"meta": meta or {}, "rows": clean}, indent=1))


def read_rows(path: str | Path) -> list[dict]:
    data = json.loads(Path(path).read_text())
    return data["rows"] if isinstance(data, dict) else data


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _json_safe(r.get(k)) for k in COLUMNS})
    return path
