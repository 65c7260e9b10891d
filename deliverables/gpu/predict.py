"""Predictions beside the GPU campaign's measurements: each timed row's roofline, and each kernel group's against
the profiler's trace (a trace event names its kernel by the HLO instruction that launched it, as the roofline does)."""

from __future__ import annotations

import re
import time
import warnings
from collections import Counter
from typing import NamedTuple

import jax

from jaxlm.analysis.devices import DEVICES, find
from jaxlm.predict import calibration
from jaxlm.predict.roofline import GROUPS, device_rates, predict

NO_GPU_TARGET = "h100-80gb"
TOP = 12


class Event(NamedTuple):
    """One kernel (or, on a CPU, one XLA op) of a profiler trace."""

    name: str
    us: float
    hlo_op: str  # the HLO instruction that launched it ("" when the trace does not say)
    module: str  # the HLO module ("jit_train_step"; "" when the trace does not say)


def target():
    """(device row, label): this GPU's row of the device table, or the H100's on a machine without one."""
    found = find(jax.devices()[0].device_kind) if jax.devices()[0].platform == "gpu" else None
    device = found or DEVICES[NO_GPU_TARGET]
    r = device_rates(device)
    rates = (f"{r.matmul_flops['bf16'] / 1e12:.0f} TFLOP/s bf16 matmuls in full waves, "
             f"{r.memory_bandwidth / 1e12:.1f} TB/s, {r.launch_seconds * 1e6:.0f} us per kernel launch")
    if found is None:
        return device, f"this machine's program priced at {device.description} rates ({rates}): no prediction"
    return device, f"predicted from the compiled program for {device.description} at {rates}; not measured"


def compiled_text(jitted, args) -> tuple[str, float]:
    """(optimised HLO text, seconds) of `jitted` compiled for `args` (arrays or ShapeDtypeStructs). An executable
    loaded from the compilation cache without its program text is compiled again, the cache off."""
    t0 = time.perf_counter()
    cached = jax.config.jax_enable_compilation_cache
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*donated buffers.*")
            lowered = jitted.lower(*args)
            text = _text(lowered.compile())
            if not text and cached:
                jax.config.update("jax_enable_compilation_cache", False)
                text = _text(lowered.compile())
    finally:
        jax.config.update("jax_enable_compilation_cache", cached)
    return text, time.perf_counter() - t0


def _text(compiled) -> str:
    try:
        return compiled.as_text() or ""
    except NotImplementedError:  # an executable that cannot print its program
        return ""


def figures(prediction, tokens: int, model_flops: float | None, dtype: str, device, label: str) -> dict:
    """The predicted keys of a row: step time, tokens/s and MFU (model FLOPs over the dense peak of `dtype`, the
    peak the row's measured MFU uses: for float32 the CUDA cores', which TF32 matmuls can exceed)."""
    seconds = prediction.seconds
    peak = device.peak_flops.get(dtype)
    return {"predicted_step_ms": 1e3 * seconds, "predicted_tokens_per_s": tokens / seconds,
            "predicted_mfu": prediction.mfu(model_flops, peak) if model_flops and peak else None,
            "prediction": label}


def for_row(row: dict, model_cfg, compute) -> dict:
    """The predicted keys for a timed benchmark row (nothing for a row that did not run), and
    `measured_over_predicted`; a failure is a `prediction_error`, never a lost row. The program is the benchmark's
    step (jaxlm.bench's own builder) lowered from abstract arguments: nothing is allocated."""
    if row.get("status") != "ok" or not row.get("step_ms"):
        return {}
    from jaxlm.bench import steps

    built = {}

    def abstract_args():
        built["step"] = steps.build_step(row["mode"], model_cfg, compute, row["batch"], row["context"])
        return built["step"].args

    try:
        args = jax.eval_shape(abstract_args)
        text, seconds = compiled_text(built["step"].jitted, args)
        device, label = target()
        out = figures(predict(text, device_rates(device)), row["batch"] * row["context"], row.get("flops_per_step"),
                      row["dtype"], device, label)
    except Exception as e:  # the measurement stands without its prediction
        return {"prediction_error": f"{type(e).__name__}: {str(e).strip()[:200]}"}
    return {**out, "measured_over_predicted": row["step_ms"] / out["predicted_step_ms"], "predict_compile_s": seconds}


def program_ms(jitted, args) -> float | None:
    """Predicted milliseconds of one call of `jitted` on `args` (the attention kernels' rows)."""
    try:
        text, _ = compiled_text(jitted, args)
        return 1e3 * predict(text, device_rates(target()[0])).seconds if text else None
    except Exception:  # the measurement stands without its prediction
        return None


# --------------------------------------------------------------------------- per kernel group, from a trace


def module_name(text: str) -> str:
    m = re.match(r"HloModule ([\w.\-]+)", text)
    return m.group(1) if m else ""


def _kernel_of(event: Event, kernels: dict, names: dict[str, str]) -> str | None:
    """The program's kernel that launched `event`: its hlo_op, else its own name (XLA names the kernels it
    generates after their instruction, '.' written '_')."""
    for key in filter(None, (event.hlo_op, event.name)):
        if key in kernels:
            return key
        if key.replace(".", "_") in names:
            return names[key.replace(".", "_")]
    return None


def _matched(prediction, events: list[Event], module: str) -> tuple[Counter, Counter]:
    """(microseconds per program kernel, microseconds of trace events no kernel of the program launched)."""
    kernels = {k.name: k for k in prediction.kernels}
    names = {name.replace(".", "_"): name for name in kernels}
    per_kernel, unmatched = Counter(), Counter()
    for e in events:
        if module and e.module and not e.module.startswith(module):
            continue  # another program (the inputs' next batch, a copy)
        name = _kernel_of(e, kernels, names)
        if name is None:
            unmatched[e.hlo_op or e.name] += e.us
        else:
            per_kernel[name] += e.us
    return per_kernel, unmatched


def compare(prediction, events: list[Event], calls: int, module: str = "") -> dict:
    """Per kernel group: predicted against measured milliseconds per call of the program, measured / predicted,
    the overall error, and how much of the trace's kernel time was matched to the program's kernels."""
    kernels = {k.name: k for k in prediction.kernels}
    per_kernel, unmatched = _matched(prediction, events, module)
    measured = Counter()
    for name, us in per_kernel.items():
        measured[kernels[name].group] += us
    ms = lambda us: us / 1e3 / calls
    groups = []
    for g in prediction.groups():
        m = ms(measured[g.group])
        groups.append({"group": g.group, "predicted_ms": 1e3 * g.seconds, "measured_ms": m, "bound": g.bound,
                       "measured_over_predicted": m / (1e3 * g.seconds) if g.seconds else None})
    predicted, matched = 1e3 * prediction.seconds, ms(sum(measured.values()))
    top = [{"kernel": n, "group": kernels[n].group, "op_name": kernels[n].op_name, "measured_ms": ms(us),
            "predicted_ms": 1e3 * kernels[n].total_seconds, "bound": kernels[n].bound}
           for n, us in per_kernel.most_common(TOP)]
    return {"groups": [g for g in groups if g["group"] in GROUPS], "predicted_ms": predicted, "measured_ms": matched,
            "measured_over_predicted": matched / predicted if predicted else None,
            "error": predicted / matched - 1 if matched else None,
            "group_abs_error": sum(abs(g["predicted_ms"] - g["measured_ms"]) for g in groups) / matched
            if matched else None,
            "unmatched_ms": ms(sum(unmatched.values())),
            "matched_share": matched / (matched + ms(sum(unmatched.values()))) if matched else 0.0,
            "unmatched_top": [{"name": n, "ms": ms(us)} for n, us in unmatched.most_common(5)], "kernels": top}


def calibrate(prediction, events: list[Event], calls: int, module: str, device: str, source: str):
    """A calibration (jaxlm.predict.calibration) fitted on a trace: each matched kernel's measured time per call
    over its (uncalibrated) prediction, per kernel group and shape class."""
    per_kernel, _ = _matched(prediction, events, module)
    return calibration.fit(prediction, {n: us / 1e6 / calls for n, us in per_kernel.items()}, device, source)
