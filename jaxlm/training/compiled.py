"""Compile training's own step for a named GPU on any machine: the GPU compiler's memory plan, no GPU needed.

    python -m jaxlm.memory --target h100-80gb --preset small --context 1024 --batch 8 --dtype bfloat16 --json
    python -m jaxlm.bench model --target h100-80gb:8 --preset large --mode train_step --set parallel.fsdp=8

XLA's GPU compiler runs on a CPU-only machine with the CUDA plugin installed (the
`gpu-compile` extra): `jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=TEXT)` gives abstract GPUs described by TEXT (a GpuTargetConfigProto, from
the device table jaxlm.analysis.devices or a file), and the train step
`jaxlm.training.loop.build` jits for `python -m jaxlm.train` (same state, donation and
shardings) is lowered on a mesh of them and compiled. What comes back is the compiler's
buffer assignment per device (`jaxlm.analysis.memory.compiled_memory`) and the optimised
GPU program (`as_text()`), read here: which matmuls run in which dtype, how many cuDNN
attention calls, what remat recomputes, which collectives a sharded layout needs. It is a
plan, never a measurement: nothing runs, so there are no times, and the allocator's
fragmentation and the CUDA context are not in it. A step fits when its total is within
JAX's allocator share of the device (jaxlm.analysis.memory.usable_share: 0.75 unless
XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise); cuBLAS/cuDNN workspaces are already in the
compiled temp bytes (buffers of the library calls).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from jaxlm.analysis import hlo, roofline
from jaxlm.analysis.devices import DEVICES, TARGETS, Device, find
from jaxlm.analysis.flops import step_flops
from jaxlm.analysis.hlo import Module
from jaxlm.analysis.memory import compiled_memory, search_largest, usable_share
from jaxlm.core import platform
from jaxlm.core.config import Config
from jaxlm.core.errors import ConfigError, DataError, MissingExtra, UsageError

EXTRA = "pip install -e '.[gpu-compile]'"
LABEL = "compiled for {device} (the GPU compiler's plan), not measured"
PREDICTED = "predicted from the compiled program for {device}, not measured"


@dataclass(frozen=True)
class Target:
    """`count` GPUs described by `config` (GpuTargetConfigProto text); `flag`: how the user named them."""

    name: str
    config: str
    count: int = 1
    flag: str = "--target"

    @property
    def description(self) -> str:
        m = re.search(r'device_description_str:\s*"([^"]*)"', self.config)
        return m.group(1) if m else self.name

    @property
    def memory_bytes(self) -> int:
        return int(re.search(r"device_memory_size:\s*(\d+)", self.config).group(1))

    @property
    def label(self) -> str:
        return LABEL.format(device=self._devices)

    @property
    def predicted_label(self) -> str:
        return PREDICTED.format(device=self._devices)

    @property
    def _devices(self) -> str:
        return self.description + (f" x{self.count}" if self.count > 1 else "")

    @property
    def device(self) -> Device | None:
        """The device table's row for this GPU (a config file's: the row its description names), or None."""
        return DEVICES.get(self.name) if self.name in TARGETS else find(self.description)


def _count(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{flag}: the GPU count after ':' must be a positive integer, got {text!r}")
    return int(text)


def parse_target(name: str | None, config_file: str | Path | None = None) -> Target:
    """"h100-80gb" or "h100-80gb:8" (a GPU of jaxlm.analysis.devices, times 8), or a GpuTargetConfigProto text
    file (count: "FILE:8")."""
    if config_file is not None:
        counted = re.search(r":\d+$", str(config_file))
        path, _, n = str(config_file).rpartition(":") if counted else (config_file, "", "1")
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise DataError(f"--target-config {path}: cannot read it ({e.strerror})") from None
        for key in ("device_memory_size", "cuda_compute_capability", "core_count"):
            if key not in text:
                raise DataError(f"--target-config {path}: no {key}; expected a GpuTargetConfigProto in text form "
                                "(see docs/memory.md)")
        return Target(Path(path).stem, text, _count(n, "--target-config"), f"--target-config {path}")
    base, _, n = name.partition(":")
    if base not in TARGETS:
        raise UsageError(f"--target {name}: unknown GPU; known: {', '.join(TARGETS)} (or --target-config FILE)")
    return Target(base, DEVICES[base].config_text(), _count(n or "1", "--target"), f"--target {name}")


def require_compiler() -> None:
    """Stop in one line unless XLA's GPU compiler (the CUDA plugin) is installed."""
    if not platform.cuda_plugin_installed():
        raise MissingExtra(f"--target needs XLA's GPU compiler (jax-cuda12-plugin and -pjrt at jaxlib's version, "
                           f"cuDNN): it comes with the 'gpu-compile' extra: {EXTRA}")


@functools.cache
def devices(target: Target) -> tuple:
    """The target's abstract GPUs (jax.experimental.topologies), one per `count`. What XLA logs while reading
    the target (a malformed config's parse error) goes into the one-line refusal, not onto the terminal."""
    require_compiler()
    from jax.experimental import topologies

    log: list[str] = []
    try:
        with platform.plugin_noise_filtered(kept=log):
            topo = topologies.get_topology_desc(platform="cuda", target_config=target.config,
                                                topology=f"1x1x{target.count}")
    except Exception as e:  # a malformed config file, or a CUDA backend that failed to start
        raise UsageError(refusal(target, e, log)) from None
    sys.stderr.write("".join(log))  # what the compiler said about a target it took
    return tuple(topo.devices)


def refusal(target: Target, error: Exception, log: list[str]) -> str:
    """One line for a target the compiler refused: where a config file fails to parse, and JAX_PLATFORMS=cpu
    as advice only where it is not what is already set."""
    parse = next((line for line in log if "Error parsing text-format" in line), None)
    if parse is not None:
        where = parse.split("GpuTargetConfigProto: ", 1)[-1].strip()
        return f"{target.flag}: not a GpuTargetConfigProto in text form ({where}; see docs/memory.md)"
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    helps = os.environ.get("JAX_PLATFORMS") != "cpu"
    advice = "; on a machine without a GPU run with JAX_PLATFORMS=cpu" if helps else ""
    return f"{target.flag}: the GPU compiler refused the target ({first}){advice}"


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
            return lowered.compile(compiler_options=given or None), time.perf_counter() - t0, {}
        except Exception as e:  # jax's JaxRuntimeError: match the compiler's words
            if NO_TILING not in str(e):
                raise
            shape = (re.search(r"= (\w+\[[\d,]*\])", str(e)) or [None, "a matmul"])[1]
        try:
            return lowered.compile(compiler_options={**given, **TRITON_OFF}), time.perf_counter() - t0, TRITON_OFF
        except Exception as e:
            raise UsageError(f"{target.flag}: the GPU compiler found no Triton tiling for {shape} at batch "
                             f"{cfg.data.batch_size}, context {cfg.model.context_length}, and failed without Triton "
                             f"GEMMs too ({str(e).strip().splitlines()[0][:120]}); try a context or batch that is a "
                             "power of two") from None


# --------------------------------------------------------------------------- reading the compiled program


def program_facts(program: str | Module) -> dict:
    """Static counts in an optimised HLO module (or its text): matmuls (XLA dots, inside fusions too, and cuBLAS
    calls) by operand dtypes ("bf16xbf16"), cuDNN attention calls by kind, and the instructions XLA's own
    rematerialisation pass cloned to fit the memory limit (it names them `NAME.remat`, `NAME.remat2`; not jaxlm's
    `compute.remat`, whose recomputation is traced into the program). An op inside a loop body counts once."""
    module = hlo.parse_module(program) if isinstance(program, str) else program
    matmuls, cudnn, remat = collections.Counter(), collections.Counter(), 0
    for comp in module.computations.values():
        for ins in comp.instrs.values():
            remat += bool(re.search(r"\.remat\d*$", ins.name))
            target = ins.attr("custom_call_target") or "" if ins.opcode == "custom-call" else ""
            if target.startswith("__cudnn$fmha"):
                cudnn[target.removeprefix("__cudnn$")] += 1
            if ins.opcode == "dot" or target.startswith("__cublas"):
                types = [comp.instrs[o].shape[0].dtype if o in comp.instrs else "?" for o in ins.operands[:2]]
                matmuls["x".join(types)] += 1
    return {"matmuls": sum(matmuls.values()), "matmul_dtypes": dict(sorted(matmuls.items())),
            "cudnn_attention_calls": sum(cudnn.values()), "cudnn_calls": dict(sorted(cudnn.items())),
            "rematerialised": remat}


def prediction(module: Module, cfg: Config, target: Target, mode: str = "train_step", top: int = 15) -> dict:
    """The predicted_* keys of a compiled row: step time, tokens/s and MFU from the roofline over the compiled
    program (jaxlm.analysis.roofline) at the target GPU's achieved rates, and the per-group, per-pass, per-part
    times and the `top` slowest kernels behind them. MFU: the model FLOPs of jaxlm.analysis.flops (attention's
    full T x T, the convention of measured MFU too) over the dense peak of the dtype class most matmul FLOPs
    run in (TF32 for float32 at JAX's default precision). All None (and the label says why) for a GPU without a
    row in the device table or a matmul dtype without a rate."""
    device = target.device
    none = dict.fromkeys(("predicted_step_ms", "predicted_tokens_per_s", "predicted_mfu"))
    if device is None:
        return none | {"predicted_label": f"no prediction: {target.description} has no achieved rates in "
                                          "jaxlm.analysis.devices"}
    try:
        p = roofline.predict(module, roofline.device_rates(device))
    except ValueError as e:  # a matmul dtype the device table has no rate for (fp8, int8): the memory stands
        return none | {"predicted_label": f"no prediction: {e}"}
    s = roofline.summary(p, top)
    peak_key = roofline.PEAK_KEYS.get(s["dtype_class"] or "")
    peak = device.peak_flops.get(peak_key) if peak_key else None
    model = step_flops(cfg.model, cfg.data.batch_size, cfg.model.context_length, mode)
    seconds = p.seconds
    return {"predicted_step_ms": 1e3 * seconds,
            "predicted_tokens_per_s": cfg.data.batch_size * cfg.model.context_length / seconds,
            "predicted_mfu": model / (seconds * peak * target.count) if peak else None, "predicted_peak": peak_key,
            "predicted_label": target.predicted_label, "predicted_groups": s["groups"],
            "predicted_phases": s["phases"], "predicted_components": s["components"], "predicted_top": s["top"],
            "predicted_ops": s["ops"], "predicted_notes": s["notes"]}


def describe(compiled, target: Target, fraction: float | None = None, cfg: Config | None = None,
             mode: str = "train_step") -> dict:
    """What a compiled row reports: bytes per device, the program's facts, collectives, whether it fits, and
    (given the step's config) its predicted time."""
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
        out.update(prediction(module, cfg, target, mode))
    return out


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
                 lowered=None) -> dict:
    compiled, seconds, options = compile_step(cfg, target, mode, lowered)
    row = {**describe(compiled, target, fraction, cfg, mode), "compile_s": seconds}
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


# --------------------------------------------------------------------------- collectives

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def collectives(program: str | Module) -> dict[str, dict[str, int]]:
    """op -> {"count", "bytes"} over an optimised HLO module's instructions (their result shapes; tuples summed;
    an async pair counted at its start). A static count: an op inside a loop body (the scanned layers) counts
    once."""
    module = hlo.parse_module(program) if isinstance(program, str) else program
    out = {op: {"count": 0, "bytes": 0} for op in COLLECTIVES}
    for comp in module.computations.values():
        for ins in comp.instrs.values():
            op = ins.opcode.removesuffix("-start")
            if op in out:
                out[op]["count"] += 1
                out[op]["bytes"] += int(hlo.nbytes(ins.shape))
    return out
