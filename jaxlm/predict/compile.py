"""Compile training's own step for a GPU on any machine and read what comes back: the GPU compiler's memory plan
and, priced from the same compile, the predicted step time. No GPU needed.

    python -m jaxlm.memory --target h100-80gb --preset small --context 1024 --batch 8 --dtype bfloat16 --json
    python -m jaxlm.bench model --target h100-80gb:8 --preset large --mode train_step --set parallel.fsdp=8

The train step `jaxlm.training.loop.build` jits for `python -m jaxlm.train` (same state, donation and shardings)
is lowered on a mesh of the target's abstract GPUs (jaxlm.predict.target) and compiled. What comes back is the
compiler's buffer assignment per device (`jaxlm.analysis.memory.compiled_memory`, the one compiled-memory
reader) and the optimised GPU program (`as_text()`): which matmuls run in which dtype, how many cuDNN attention
calls, what remat recomputes, which collectives a sharded layout needs (jaxlm.predict.program), and the
predicted time of its kernels (jaxlm.predict.roofline). It is a plan, never a measurement: nothing runs, and
the allocator's fragmentation and the CUDA context are not in it. A step fits when its total is within JAX's
allocator share of the device (jaxlm.analysis.memory.usable_share: 0.75 unless XLA_PYTHON_CLIENT_MEM_FRACTION
says otherwise); cuBLAS/cuDNN workspaces are already in the compiled temp bytes. A step that does not fit gets
no predicted time: the compiler rematerialised it trying to fit, and the time would describe a step that can
never run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time

from jaxlm.analysis.flops import step_flops
from jaxlm.analysis.memory import compiled_memory, search_largest, usable_share
from jaxlm.core import platform
from jaxlm.core.config import Config
from jaxlm.core.errors import ConfigError, UsageError
from jaxlm.predict import calibration as calib
from jaxlm.predict import hlo, roofline
from jaxlm.predict.hlo import Module
from jaxlm.predict.program import collectives, program_facts
from jaxlm.predict.target import Target, devices


def lower_step(cfg: Config, target: Target, mode: str = "train_step"):
    """cfg's train step (or its eval step: "forward") as `python -m jaxlm.train` jits it, on a mesh of the
    target's GPUs laid out by cfg.parallel, lowered (traced, not yet compiled) for them."""
    if mode not in ("train_step", "forward"):
        raise UsageError(f"--mode {mode}: compiling for a target covers train_step and forward (the eval step)")
    return lower_on(cfg, devices(target), mode)


def lower_on(cfg: Config, gpus, mode: str = "train_step"):
    """The step of `lower_step` on a mesh of `gpus`, any devices (this machine's too: jax.devices())."""
    import jax
    import numpy as np

    from jaxlm.core import sharding
    from jaxlm.nn.attention import compiling_for
    from jaxlm.training.loop import build

    mesh = sharding.make_mesh(devices=list(gpus), cfg=cfg.parallel)
    sharding.check_layout(cfg, mesh)
    built = build(cfg, mesh)
    x = jax.ShapeDtypeStruct((cfg.data.batch_size, cfg.model.context_length), np.int32,
                             sharding=sharding.batch_sharding(mesh))
    fn, args = (built.step_fn, (x, x)) if mode == "train_step" else (built.eval_fn, (x, x, x.update(dtype=np.float32)))
    with compiling_for(gpus):  # the cuDNN guard asks the target while tracing
        return fn.lower(built.abstract, *args)


def program_hash(lowered, target: Target) -> str:
    """What decides a compiled row: the lowered program (without source locations), the target and jax's version.
    Equal hashes compile to the same plan, whatever edits to jaxlm's sources led there."""
    import jax

    text = lowered.as_text(debug_info=False)
    parts = (text, target.config, str(target.count), jax.__version__)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# XLA's GPU compiler without a device cannot autotune its Triton GEMMs; with default tiles it finds none for some
# shapes that are not powers of two (`Couldn't find output tile sizes ...`, e.g. bf16[3000,768] at context 1000,
# batch 3). Without Triton GEMMs those matmuls compile as cuBLAS calls, which autotuning on a GPU may choose too.
NO_TILING = "Couldn't find output tile sizes"
TRITON_OFF = {"xla_gpu_enable_triton_gemm": False}


def _compile(lowered, options: dict | None = None):
    """`lowered` compiled, what XLA's C++ logs meanwhile kept off the terminal: its complaints about a step larger
    than the GPU ("The byte size of input/output arguments ... exceeds the base limit. This indicates an error in
    the calculation!", "Can't reduce memory use below ...") describe what the compiled row reports as not fitting."""
    with platform.plugin_noise_filtered(kept=[]):
        return lowered.compile(compiler_options=options) if options else lowered.compile()


def compile_step(cfg: Config, target: Target, mode: str = "train_step", lowered=None, options: dict | None = None):
    """(compiled, seconds, options): the step of `lower_step` (or `lowered`, already lowered) compiled by XLA's GPU
    compiler with the compiler `options` given (XLA's debug options, e.g. a dump folder: `xla_dump_to`); the
    options returned are those it needed beyond the defaults (TRITON_OFF or none)."""
    from jaxlm.nn.attention import compiling_for

    lowered = lowered if lowered is not None else lower_step(cfg, target, mode)
    given = dict(options or {})
    t0 = time.perf_counter()
    with compiling_for(devices(target)):
        try:
            return _compile(lowered, given or None), time.perf_counter() - t0, {}
        except Exception as e:  # jax's JaxRuntimeError: match the compiler's words
            if NO_TILING not in str(e):
                raise
            shape = (re.search(r"= (\w+\[[\d,]*\])", str(e)) or [None, "a matmul"])[1]
        try:
            return _compile(lowered, {**given, **TRITON_OFF}), time.perf_counter() - t0, TRITON_OFF
        except Exception as e:
            raise UsageError(f"{target.flag}: the GPU compiler found no Triton tiling for {shape} at batch "
                             f"{cfg.data.batch_size}, context {cfg.model.context_length}, and failed without Triton "
                             f"GEMMs too ({str(e).strip().splitlines()[0][:120]}); try a context or batch that is a "
                             "power of two") from None


def dtype_label(dtype: str, matmul_precision: str | None) -> str:
    """"float32 (TF32 matmuls)": a compute dtype with the precision its matmuls run at where that differs."""
    if not matmul_precision or matmul_precision.lower() == dtype.lower():
        return dtype
    return f"{dtype} ({matmul_precision} matmuls)"


def prediction(module: Module, cfg: Config, target: Target, mode: str = "train_step", top: int = 15,
               calibration: calib.Calibration | None = None) -> dict:
    """The predicted_* keys of a compiled row: step time, tokens/s and MFU from the roofline over the compiled
    program (jaxlm.predict.roofline) at the target GPU's achieved rates (scaled by `calibration`), and the
    per-group, per-pass, per-part times and the `top` slowest kernels behind them. MFU: the model FLOPs of
    jaxlm.analysis.flops (attention's full T x T, the convention of measured MFU too) over the dense peak of the
    dtype class most matmul FLOPs run in (TF32 for float32 at JAX's default precision). All None (and the label
    says why) for a GPU without rates or a matmul dtype without a rate."""
    device = target.device
    none = dict.fromkeys(("predicted_step_ms", "predicted_tokens_per_s", "predicted_mfu"))
    if device is None:
        return none | {"predicted_label": f"no prediction: {target.description} has no rates in "
                                          "jaxlm.analysis.devices (give them in a .toml --target-config file)"}
    try:
        p = roofline.predict(module, roofline.device_rates(device), calibration)
    except ValueError as e:  # a matmul dtype the device table has no rate for (fp8, int8): the memory stands
        return none | {"predicted_label": f"no prediction: {e}"}
    s = roofline.summary(p, top)
    peak_key = roofline.PEAK_KEYS.get(s["dtype_class"] or "")
    peak = device.peak_flops.get(peak_key) if peak_key else None
    model = step_flops(cfg.model, cfg.data.batch_size, cfg.model.context_length, mode)
    seconds = p.seconds
    label = target.predicted_label + (f"; {p.calibration}" if p.calibration else "")
    return {"predicted_step_ms": 1e3 * seconds,
            "predicted_tokens_per_s": cfg.data.batch_size * cfg.model.context_length / seconds,
            "predicted_mfu": model / (seconds * peak * target.count) if peak else None, "predicted_peak": peak_key,
            "predicted_label": label, "predicted_calibration": p.calibration,
            "predicted_pricing": roofline.PRICING_VERSION, "predicted_groups": s["groups"],
            "predicted_phases": s["phases"], "predicted_components": s["components"], "predicted_top": s["top"],
            "predicted_ops": s["ops"], "predicted_notes": s["notes"]}


def describe(compiled, target: Target, fraction: float | None = None, cfg: Config | None = None,
             mode: str = "train_step", calibration: calib.Calibration | None = None) -> dict:
    """What a compiled row reports: bytes per device, the program's facts, collectives, whether it fits, and
    (given the step's config) its predicted time, which a step that does not fit has not."""
    m = compiled_memory(compiled)
    module = hlo.parse_module(compiled.as_text())
    out = {"label": target.label, "target": target.name, "gpus": target.count, "argument_bytes": m.argument,
           "output_bytes": m.output, "alias_bytes": m.alias, "temp_bytes": m.temp, "total_bytes": m.total}
    out.update(program_facts(module))
    if target.count > 1:
        out["collectives"] = {op: c for op, c in collectives(module).items() if c["count"]}
    fraction = usable_share() if fraction is None else fraction
    out.update(capacity_bytes=target.memory_bytes, usable_fraction=fraction,
               usable_bytes=int(fraction * target.memory_bytes))
    out["fits"] = out["total_bytes"] <= out["usable_bytes"]
    if cfg is not None:
        out["dtype_label"] = dtype_label(cfg.compute.dtype, out["matmul_precision"])
        out.update(prediction(module, cfg, target, mode, calibration=calibration) if out["fits"] else {
            **dict.fromkeys(("predicted_step_ms", "predicted_tokens_per_s", "predicted_mfu")),
            "predicted_label": does_not_fit(out)})
    return out


def does_not_fit(row: dict) -> str:
    return f"does not fit ({row['total_bytes'] / 2**30:.2f} GiB of {row['usable_bytes'] / 2**30:.2f} GiB usable)"


def with_shape(cfg: Config, batch: int | None = None, context: int | None = None, **compute) -> Config:
    """cfg at another global batch / context / compute setting (validated as a loaded config is)."""
    try:
        return dataclasses.replace(
            cfg, data=dataclasses.replace(cfg.data, batch_size=batch or cfg.data.batch_size),
            model=dataclasses.replace(cfg.model, context_length=context or cfg.model.context_length),
            compute=dataclasses.replace(cfg.compute, **compute))
    except ConfigError as e:
        raise UsageError(str(e)) from None


def compiled_row(cfg: Config, target: Target, mode: str = "train_step", fraction: float | None = None,
                 lowered=None, calibration: calib.Calibration | None = None) -> dict:
    compiled, seconds, options = compile_step(cfg, target, mode, lowered)
    row = {**describe(compiled, target, fraction, cfg, mode, calibration), "compile_s": seconds}
    if options:
        row["compiler_options"] = options
    return row


def largest_batch(cfg: Config, target: Target, mode: str = "train_step", limit: int = 1 << 14,
                  fraction: float | None = None) -> int:
    """The largest global batch whose compiled total fits the usable memory, found by compiling: the totals
    at one and two steps give an affine guess, then `search_largest` confirms it around the guess, in steps
    of the rows the batch must divide into. 0 when not even one step's worth fits."""
    p = cfg.parallel
    step = max(1, target.count // (p.tensor * p.pipeline)) * cfg.train.grad_accum * p.microbatches
    totals: dict[int, dict] = {}

    def row(k: int) -> dict:
        if k not in totals:
            totals[k] = compiled_row(with_shape(cfg, batch=k * step), target, mode, fraction)
        return totals[k]

    if not row(1)["fits"]:
        return 0
    slope = row(2)["total_bytes"] - row(1)["total_bytes"]
    room = row(1)["usable_bytes"] - row(1)["total_bytes"]
    guess = 1 + int(room // slope) if slope > 0 else limit // step
    return search_largest(lambda k: row(k)["fits"], max(1, limit // step), guess) * step
