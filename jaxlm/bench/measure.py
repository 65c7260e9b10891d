"""What a benchmark row is and how rows are measured (the rows' table, JSON and CSV: `jaxlm.bench.output`).

A *setting* is everything about a run except its shape: the side that measures it (`framework`: jaxlm's
own, or a side plugged in through `jaxlm.bench.sides`), mode, dtype, attention and remat. A sweep runs
every setting at every (context, batch) in the product of the lists it was given; each run becomes one
row (a flat dict, columns in `COLUMNS`), OOM and errors included, so a sweep never stops half way.
Settings that compare (one mode, dtype and attention) are timed together at each shape, in alternating
rounds on the host CPU (`run_group`). Each side builds and compiles its own step; the timing is done
here, by the one loop of `jaxlm.bench.timing`. This module imports no framework at import time.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import statistics
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from jaxlm.analysis import flops, memory
from jaxlm.bench import sides
from jaxlm.bench.timing import Load, time_calls
from jaxlm.core.config import ComputeConfig, Config, ModelConfig
from jaxlm.core.errors import UserError

# What a row's speed_vs_reference is (its `speed_vs_reference_of`): the table prints it below the ratios.
PAIRED_RATIO = "median over the alternating rounds of the reference's step time / jax's (not a ratio of mean step ms)"
MEAN_RATIO = "the reference's mean step ms / jax's"

# Row columns, in table / CSV order (the JSON rows carry the same keys).
COLUMNS = (
    "framework", "model", "mode", "dtype", "attention", "remat", "compiled", "context", "batch", "params",
    "status", "compile_s", "step_ms", "step_ms_std", "step_ms_median", "step_ms_first", "tokens_per_s",
    "flops_per_step", "xla_flops", "tflops", "mfu", "memory_gb", "memory_source", "estimate_gb",
    "speed_vs_reference", "reference", "speed_vs_reference_of", "other_cpus", "busy", "device", "error",
)


@dataclass(frozen=True)
class BenchCase:
    """What one benchmark row runs: the side, the step, its dtype, attention and remat; `attention` is "xla",
    "cudnn", "window:N" or "cudnn+window:N"."""

    framework: str = sides.OWN  # the side that measures it (`jaxlm.bench.sides`)
    mode: str = "forward"
    dtype: str = "float32"
    attention: str = "xla"
    remat: str = "none"  # jaxlm's rematerialisation policy; other sides run without
    compute: ComputeConfig = ComputeConfig()  # the config's other compute keys (scan_layers, loss_chunk)

    def configs(self, base: ModelConfig, context: int) -> tuple[ModelConfig, ComputeConfig]:
        """The row's model (context raised to fit, window from `attention`) and how it runs (another side
        reads the dtype and whether the attention is fused from the compute config)."""
        impl, window = parse_attention(self.attention)
        model = dataclasses.replace(base, context_length=max(context, base.context_length), window=window)
        return model, dataclasses.replace(self.compute, dtype=self.dtype, attention=impl, remat=self.remat)

    @property
    def label(self) -> str:
        parts = [self.framework, self.mode, self.dtype, self.attention]
        if self.remat != "none":
            parts.append(f"remat={self.remat}")
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
    run: Config | None = None  # the run's config: a train step's optimizer, accumulation, LoRA, QAT (default Config())
    side_args: Mapping[str, Any] = field(default_factory=dict)  # the command's options; a plugged-in side reads its own


class Prepared(NamedTuple):
    """What a side's `prepare` returns for a row it compiled: the library's loop times `call`."""

    call: Callable[[], Any]  # one step; returns what `wait` blocks on
    wait: Callable[[Any], Any]  # returns once the step's work is done (e.g. jax.block_until_ready)
    finish: Callable[[], None]  # after the timing: fill what is read afterwards (memory), release the step


def empty_row(setting: BenchCase, cfg: ModelConfig, context: int, batch: int, opts: Options) -> dict:
    row = {c: None for c in COLUMNS}
    row.update(
        framework=setting.framework, model=opts.model_name, mode=setting.mode, dtype=setting.dtype,
        attention=setting.attention, remat=setting.remat, context=context, batch=batch,
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
    """XLA's RESOURCE_EXHAUSTED, an allocator's OutOfMemoryError (another side's GPU), or a plain MemoryError."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower() or "Out of memory" in text


def _invalid_row(setting: BenchCase, context: int, batch: int, opts: Options, error: Exception) -> dict:
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
    _release_memory(row["framework"])


def _release_memory(framework: str) -> None:
    """After a failure: drop the failed step's buffers so the next row starts clean."""
    gc.collect()
    release = getattr(sides.LOADED.get(framework), "release_memory", None)
    if release is not None:
        release()


def _step_statistics(row: dict, times: list[float], cpu_s: float) -> None:
    row["step_ms"] = 1e3 * statistics.fmean(times)
    row["step_ms_std"] = 1e3 * statistics.pstdev(times)
    row["step_ms_median"] = 1e3 * statistics.median(times)
    row["step_ms_first"] = 1e3 * times[0]  # what warm-up is for: the first timed step after --warmup steps
    row["step_cpu_ms"] = 1e3 * cpu_s / len(times)  # this process's CPU time: steadier than wall time under load


def _prepare_rows(settings: list[BenchCase], base: ModelConfig, context: int, batch: int,
                  opts: Options) -> tuple[list[dict], dict[int, Prepared]]:
    """A row per setting, and the prepared step of each that compiled and is to be timed."""
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
        side = sides.load(setting.framework)  # outside the try: a missing extra stops the sweep in one line
        try:
            row["device"] = side.device_kind()
            ready = side.prepare(setting, cfg, compute, batch, context, opts, row)
        except UserError as e:  # e.g. a batch that train.grad_accum does not divide
            rows[-1] = _invalid_row(setting, context, batch, opts, e)
            continue
        except Exception as e:
            _fail(row, e)
            continue
        if ready is not None:
            prepared[i] = Prepared(*ready)
    return rows, prepared


def run_group(settings: list[BenchCase], base: ModelConfig, context: int, batch: int, opts: Options) -> list[dict]:
    """Benchmark settings that compare (one mode, dtype and attention) at one shape; never raises.

    Each side's `prepare` compiles its step and returns a `Prepared` (or None when the row is already decided).
    When every row runs on the host CPU the rows are timed call by call, in alternating order, so that a change
    of load or of clock speed during the run hits all of them alike; a jax row's `speed_vs_reference` is then
    the median over the rounds of the reference's time / jax's time in the same round. Elsewhere (a GPU, whose
    memory peak is per row and which need not hold two models at once) each row is prepared, timed and
    released before the next. The other processes' CPU load while the rows were timed marks them (`busy`).
    """
    if len(settings) > 1 and not all(_on_host_cpu(s) for s in settings):
        return [row for s in settings for row in run_group([s], base, context, batch, opts)]
    rows, prepared = _prepare_rows(settings, base, context, batch, opts)
    with Load() as load:
        times = _time_rows(prepared, rows, opts)
    for i, ready in prepared.items():
        if i in times:
            _step_statistics(rows[i], *times[i])
            ready.finish()
            rows[i]["status"] = rows[i]["status"] or "ok"
            load.mark(rows[i])
    prepared.clear()
    for row in rows:
        if row.get("step_ms"):
            finish_row(row, opts, row["device"])
    _paired_ratios(rows, {i: t for i, (t, _) in times.items()})
    return rows


def _on_host_cpu(setting: BenchCase) -> bool:
    try:
        return sides.load(setting.framework).device_kind() == "cpu"
    except Exception:  # no such side: run_group turns that into its one-line error
        return False


def _time_rows(prepared: dict[int, Prepared], rows: list[dict], opts: Options) -> dict[int, tuple[list[float], float]]:
    """(seconds per step, CPU seconds) of every prepared row, after its warm-up: several (run_group prepares several
    together on the host CPU only) in `steps` rounds that each run every row once, settled first, in
    alternating order; one alone."""
    times = {}
    for i, (call, wait, _) in prepared.items():
        try:
            time_calls(call, 0, warmup=opts.warmup, wait=wait)
            times[i] = ([], 0.0)
        except Exception as e:
            _fail(rows[i], e)
    interleave = len(times) > 1
    rounds = [list(times)] if not interleave else [list(times)[::1 - 2 * (r % 2)] for r in range(opts.steps)]
    for order in rounds:
        for i in order:
            if i not in times:
                continue  # failed in an earlier round
            call, wait, _ = prepared[i]
            try:
                got = time_calls(call, 1 if interleave else opts.steps, wait=wait, settled=interleave)
            except Exception as e:
                _fail(rows[i], e)
                del times[i]
                continue
            times[i] = (times[i][0] + got.seconds, times[i][1] + got.cpu_s)
    return times


def _paired_ratios(rows: list[dict], times: dict[int, list[float]]) -> None:
    """speed_vs_reference of interleaved rows: the median of the per-round ratios, with their interquartile range."""
    references = [i for i in times if rows[i]["framework"] != sides.OWN]
    if not references or len(times[references[0]]) < 2:  # a row timed alone (a GPU) or one round
        return
    ref = references[0]
    for i in times:
        if rows[i]["framework"] == sides.OWN and len(times[i]) == len(times[ref]):
            quartiles = statistics.quantiles([a / b for a, b in zip(times[ref], times[i])], n=4, method="inclusive")
            rows[i].update(speed_vs_reference=quartiles[1], speed_vs_reference_iqr=[quartiles[0], quartiles[2]],
                           reference=rows[ref]["framework"], speed_vs_reference_of=PAIRED_RATIO)


def run_one(setting: BenchCase, base: ModelConfig, context: int, batch: int, opts: Options) -> dict:
    """Benchmark one (setting, context, batch); never raises: failures become OOM / error rows."""
    return run_group([setting], base, context, batch, opts)[0]


def compare_key(setting: BenchCase) -> tuple:
    """Rows with the same key compare with each other: one mode, dtype and attention, any side or remat."""
    return setting.mode, setting.dtype, setting.attention


def run_sweep(
    base: ModelConfig,
    settings: Iterable[BenchCase],
    contexts: Iterable[int],
    batches: Iterable[int],
    opts: Options = Options(),
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Run every setting at every (context, batch), the settings that compare timed together (`run_group`);
    returns the rows in the order setting x context x batch, with speed ratios against the reference side."""
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
    """speed_vs_reference = the reference side's step time / jax's (> 1: jax faster), on the jax row of each matched
    pair that `run_group` did not already give the median of its paired rounds; `reference` names the side."""
    key = lambda r: (r["model"], r["mode"], r["dtype"], r["attention"], r["context"], r["batch"])
    references = {}
    for r in rows:
        if r["framework"] != sides.OWN and r.get("step_ms"):
            references.setdefault(key(r), r)
    for r in rows:
        ref = references.get(key(r))
        if r["framework"] == sides.OWN and r.get("step_ms") and ref is not None and r.get("speed_vs_reference") is None:
            r["speed_vs_reference"], r["reference"] = ref["step_ms"] / r["step_ms"], ref["framework"]
            r["speed_vs_reference_of"] = MEAN_RATIO


# --------------------------------------------------------------------------- largest batch
# The search itself is jaxlm.analysis.memory.search_largest, shared by every largest-batch search.


def batch_fits(setting: BenchCase, base: ModelConfig, context: int, opts: Options) -> Callable[[int], bool]:
    """fits(batch). With a memory limit: the estimate (JAX: compiled memory_analysis; torch: the analytic
    jaxlm.analysis.memory.estimate) is within it, and nothing runs. Without one: a real 1-step run does not OOM."""

    def fits(batch: int) -> bool:
        if opts.memory_limit_gb is not None:
            cfg, compute = setting.configs(base, context)
            return estimate_bytes(setting, cfg, compute, batch, context) <= opts.memory_limit_gb * 1e9
        row = run_one(setting, base, context, batch, dataclasses.replace(opts, warmup=1, steps=1))
        return row["status"] == "ok"

    return fits


def estimate_bytes(setting: BenchCase, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int) -> float:
    """Estimated step memory without running: XLA's memory_analysis (JAX) or jaxlm.analysis.memory.estimate (torch)."""
    if setting.framework == "jax":
        from jaxlm.bench import steps

        step = steps.build_step(setting.mode, cfg, compute, batch, context)
        est = memory.compiled_memory(steps.compile_step(step))
        if est is not None:
            return est.total
    return memory.estimate(cfg, batch, context, compute, setting.mode, fused=compute.attention != "xla").total
