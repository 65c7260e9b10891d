"""What a benchmark row is and how a sweep runs (the rows' table, JSON and CSV: `jaxlm.bench.output`).

A *setting* is everything about a run except its shape: framework, mode,
dtype, attention, remat, torch.compile. A sweep runs every setting at every
(context, batch) in the product of the lists it was given; each run becomes one
row (a flat dict, columns in `COLUMNS`), OOM and errors included, so a sweep
never stops half way. Settings that compare (one mode, dtype and attention) are
timed together at each shape, in alternating rounds on the host CPU (`run_group`). The framework-specific work
lives in the modules of `SIDES`:
`jax_side` here, and the PyTorch side that `python -m parity.bench` registers
(jaxlm never imports torch); this module imports no framework at import time.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import itertools
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Iterable

from jaxlm.analysis import flops, memory
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.errors import UsageError

FRAMEWORKS = ("jax", "torch")

# Row columns, in table / CSV order (the JSON rows carry the same keys).
COLUMNS = (
    "framework", "model", "mode", "dtype", "attention", "remat", "compiled", "context", "batch", "params",
    "status", "compile_s", "step_ms", "step_ms_std", "step_ms_median", "step_ms_first", "tokens_per_s",
    "flops_per_step", "xla_flops", "tflops", "mfu",
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


def finish_row(row: dict, opts: Options, device_kind: str | None) -> dict:
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


def _invalid_row(setting: Setting, context: int, batch: int, opts: Options, error: Exception) -> dict:
    """An invalid combination (e.g. cudnn with float32): a row that says so."""
    row = {c: None for c in COLUMNS}
    row.update(framework=setting.framework, model=opts.model_name, mode=setting.mode, dtype=setting.dtype,
               attention=setting.attention, remat=setting.remat, context=context, batch=batch,
               status="invalid", error=str(error).splitlines()[0][:200])
    return row


def _fail(row: dict, exc: Exception) -> None:
    """An exception while measuring: an OOM or error row (the error row keeps a short traceback)."""
    row["status"] = "OOM" if is_oom(exc) else "error"
    text = str(exc).strip()
    row["error"] = f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
    if row["status"] == "error":
        row["traceback"] = traceback.format_exc(limit=6)
    _release_memory()


def _step_statistics(row: dict, times: list[float]) -> None:
    row["step_ms"] = 1e3 * statistics.fmean(times)
    row["step_ms_std"] = 1e3 * statistics.pstdev(times)
    row["step_ms_median"] = 1e3 * statistics.median(times)
    row["step_ms_first"] = 1e3 * times[0]  # what warm-up is for: the first timed step after --warmup steps


def run_group(settings: list[Setting], base: ModelConfig, context: int, batch: int, opts: Options) -> list[dict]:
    """Benchmark settings that compare (one mode, dtype and attention) at one shape; never raises.

    Each side's `prepare(...)` compiles and warms up its step and returns (run, finish): run(n, timed=True)
    runs n steps and returns their seconds each (timed=False: settling calls, left out of the row's CPU
    time), finish(times) adds what is read after timing (memory). When every row runs on
    the host CPU the rows are timed call by call, in alternating order, so that a change of load or of
    clock speed during the run hits all of them alike; a jax row's `jax_torch_speed` is then the median
    over the rounds of torch's time / jax's time in the same round. Elsewhere (a GPU, whose memory peak
    is per row and which need not hold two models at once) each row is prepared, timed and released before
    the next.
    """
    if len(settings) > 1 and not all(_on_host_cpu(s) for s in settings):
        return [row for s in settings for row in run_group([s], base, context, batch, opts)]
    rows, prepared = [], {}
    for i, setting in enumerate(settings):
        try:
            if context < 1 or batch < 1:
                raise ValueError(f"context {context} and batch {batch} must be >= 1")
            cfg, compute = setting.configs(base, context)
            row = empty_row(setting, cfg, context, batch, opts)
        except Exception as e:
            rows.append(_invalid_row(setting, context, batch, opts, e))
            continue
        rows.append(row)
        side = framework_side(setting.framework)  # outside the try: a missing torch extra stops the sweep in one line
        try:
            row["device"] = side.device_kind()
            ready = side.prepare(setting, cfg, compute, batch, context, opts, row)
        except Exception as e:
            _fail(row, e)
            continue
        if ready is not None:
            prepared[i] = ready
    times = _time_rows(prepared, rows, opts.steps)
    for i, (_, finish) in prepared.items():
        if i in times:
            _step_statistics(rows[i], times[i])
            finish(times[i])
            rows[i]["status"] = rows[i]["status"] or "ok"
    prepared.clear()
    for row in rows:
        if row.get("step_ms"):
            finish_row(row, opts, row["device"])
    _paired_ratios(rows, times)
    return rows


# After a call torch's OpenMP threads spin for milliseconds before they sleep, and would take CPU from a
# JAX step that followed at once: in interleaved timing every row first runs untimed for this long.
SETTLE_S = 0.03


def settle(call: Callable[[], object]) -> None:
    """Run `call` untimed (at least once) until SETTLE_S have passed: the other framework's threads go quiet."""
    start = time.perf_counter()
    while True:
        call()
        if time.perf_counter() - start >= SETTLE_S:
            return


def _on_host_cpu(setting: Setting) -> bool:
    try:
        return framework_side(setting.framework).device_kind() == "cpu"
    except Exception:  # no such side: run_group turns that into its one-line error
        return False


def _time_rows(prepared: dict, rows: list[dict], steps: int) -> dict[int, list[float]]:
    """Seconds per step of every prepared row: several (run_group prepares several together on the host CPU
    only) in `steps` rounds that each run every row once, settled first, in alternating order; one alone."""
    times = {i: [] for i in prepared}
    interleave = len(prepared) > 1
    rounds = [list(prepared)] if not interleave else [list(prepared)[::1 - 2 * (r % 2)] for r in range(steps)]
    for order in rounds:
        for i in order:
            if i not in times:
                continue  # failed in an earlier round
            run = prepared[i][0]
            try:
                if interleave:
                    settle(lambda: run(1, timed=False))
                times[i] += run(1 if interleave else steps)
            except Exception as e:
                _fail(rows[i], e)
                del times[i]
    return times


def _paired_ratios(rows: list[dict], times: dict[int, list[float]]) -> None:
    """jax_torch_speed of interleaved rows: the median of the per-round ratios, with their interquartile range."""
    torch_rows = [i for i in times if rows[i]["framework"] == "torch"]
    if not torch_rows or len(times[torch_rows[0]]) < 2:  # a row timed alone (a GPU) or one round
        return
    t = times[torch_rows[0]]
    for i in times:
        if rows[i]["framework"] == "jax" and len(times[i]) == len(t):
            quartiles = statistics.quantiles([a / b for a, b in zip(t, times[i])], n=4, method="inclusive")
            rows[i]["jax_torch_speed"] = quartiles[1]
            rows[i]["jax_torch_speed_iqr"] = [quartiles[0], quartiles[2]]


def run_one(setting: Setting, base: ModelConfig, context: int, batch: int, opts: Options) -> dict:
    """Benchmark one (setting, context, batch); never raises: failures become OOM / error rows."""
    return run_group([setting], base, context, batch, opts)[0]


def _release_memory() -> None:
    """After an OOM: drop the failed step's buffers so the next row starts clean."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


SIDES = {"jax": "jaxlm.bench.jax_side"}  # framework -> module; `python -m parity.bench` adds "torch"


def framework_side(framework: str, command: str = "model"):
    """The module that measures one framework's rows (build_step, prepare, memory, decode_runner)."""
    if framework not in SIDES:
        raise UsageError(f"--framework {framework}: torch rows come from `python -m parity.bench {command} ...` "
                         "(the torch extra); `python -m jaxlm.bench` measures jax only")
    return importlib.import_module(SIDES[framework])


def compare_key(setting: Setting) -> tuple:
    """Rows with the same key compare with each other: one mode, dtype and attention, any framework or remat."""
    return setting.mode, setting.dtype, setting.attention


def run_sweep(
    base: ModelConfig,
    settings: Iterable[Setting],
    contexts: Iterable[int],
    batches: Iterable[int],
    opts: Options = Options(),
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every setting at every (context, batch), the settings that compare timed together (`run_group`);
    returns the rows in the order setting x context x batch, with jax/torch speed ratios."""
    settings, contexts, batches = list(settings), list(contexts), list(batches)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(settings):
        groups.setdefault(compare_key(s), []).append(i)
    done = {}
    for members in groups.values():
        for context, batch in itertools.product(contexts, batches):
            for i, row in zip(members, run_group([settings[i] for i in members], base, context, batch, opts)):
                done[i, context, batch] = row
                if on_row:
                    on_row(row)
    rows = [done[key] for key in itertools.product(range(len(settings)), contexts, batches)]
    add_speed_ratios(rows)
    return rows


def add_speed_ratios(rows: list[dict]) -> None:
    """jax_torch_speed = torch step time / jax step time (> 1: jax faster), on the jax row of each matched pair
    that `run_group` did not already give the median of its paired rounds."""
    key = lambda r: (r["model"], r["mode"], r["dtype"], r["attention"], r["context"], r["batch"])
    torch_rows = {}
    for r in rows:
        if r["framework"] == "torch" and r.get("step_ms"):
            torch_rows.setdefault(key(r), r)
    for r in rows:
        t = torch_rows.get(key(r))
        if r["framework"] == "jax" and r.get("step_ms") and t is not None and r.get("jax_torch_speed") is None:
            r["jax_torch_speed"] = t["step_ms"] / r["step_ms"]


# --------------------------------------------------------------------------- largest batch
# The search itself is jaxlm.analysis.memory.search_largest, shared by every largest-batch search.


def batch_fits(setting: Setting, base: ModelConfig, context: int, opts: Options) -> Callable[[int], bool]:
    """fits(batch). With a memory limit: the estimate (JAX: compiled memory_analysis; torch: the analytic
    jaxlm.analysis.memory.estimate) is within it, and nothing runs. Without one: a real 1-step run does not OOM."""

    def fits(batch: int) -> bool:
        if opts.memory_limit_gb is not None:
            cfg, compute = setting.configs(base, context)
            return estimate_bytes(setting, cfg, compute, batch, context) <= opts.memory_limit_gb * 1e9
        row = run_one(setting, base, context, batch, dataclasses.replace(opts, warmup=1, steps=1))
        return row["status"] == "ok"

    return fits


def estimate_bytes(setting: Setting, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int) -> float:
    """Estimated step memory without running: XLA's memory_analysis (JAX) or jaxlm.analysis.memory.estimate (torch)."""
    if setting.framework == "jax":
        from jaxlm.bench import jax_side

        step = jax_side.build_step(setting.mode, cfg, compute, batch, context)
        est = memory.compiled_memory(jax_side.compile_step(step))
        if est is not None:
            return est.total
    return memory.estimate(cfg, batch, context, compute, setting.mode, fused=compute.attention != "xla").total
