"""Compile training's own step for a named GPU on any machine: the GPU compiler's memory plan, no GPU needed.

    python -m jaxlm.memory --target h100-80gb --preset small --context 1024 --batch 8 --dtype bfloat16 --json
    python -m jaxlm.bench model --target h100-80gb:8 --preset large --mode train_step --set parallel.fsdp=8

XLA's GPU compiler runs on a CPU-only machine with the CUDA plugin installed (the
`gpu-compile` extra): `jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=TEXT)` gives abstract GPUs described by TEXT (a GpuTargetConfigProto), and
the train step `jaxlm.training.loop.build` jits for `python -m jaxlm.train` (same state,
donation and shardings) is lowered on a mesh of them and compiled. What comes back is
the compiler's buffer assignment per device (`memory_analysis()`) and the optimised GPU
program (`as_text()`): which matmuls run in which dtype, how many cuDNN attention calls,
what remat recomputes, which collectives a sharded layout needs. It is a plan, never a
measurement: nothing runs, so there are no times, and the allocator's fragmentation and
the CUDA context are not in it. A step fits when its total is within JAX's allocator
share of the device (jaxlm.analysis.memory.DEFAULT_USABLE: 0.75 unless
XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise); cuBLAS/cuDNN workspaces are already in
the compiled temp bytes (buffers of the library calls).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

from jaxlm.analysis.memory import usable_share
from jaxlm.core import platform
from jaxlm.core.config import Config
from jaxlm.core.errors import ConfigError, DataError, MissingExtra, UsageError

EXTRA = "pip install -e '.[gpu-compile]'"
LABEL = "compiled for {device} (the GPU compiler's plan), not measured"

@dataclass(frozen=True)
class Gpu:
    """The fields of a GpuTargetConfigProto that differ between GPUs. Shared by every CUDA GPU since Volta
    (CUDA C Programming Guide, "Technical Specifications per Compute Capability"): 1024 threads and 48 KiB
    static shared memory per block, warps of 32, 65,536 registers per SM and per block."""

    description: str  # the device name CUDA reports
    compute_capability: tuple[int, int]
    sms: int
    fp32_per_sm: int
    memory_bytes: int  # the total the CUDA driver reports
    bandwidth: int  # bytes/s
    l2_bytes: int
    clock_ghz: float  # boost clock
    shared_per_sm: int
    shared_per_block_optin: int
    threads_per_sm: int

    def config_text(self) -> str:
        major, minor = self.compute_capability
        return (
            "gpu_device_info { threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152 "
            f"shared_memory_per_core: {self.shared_per_sm} threads_per_core_limit: {self.threads_per_sm} "
            f"core_count: {self.sms} fpus_per_core: {self.fp32_per_sm} block_dim_limit_x: 2147483647 "
            f"block_dim_limit_y: 65535 block_dim_limit_z: 65535 memory_bandwidth: {self.bandwidth} "
            f"l2_cache_size: {self.l2_bytes} clock_rate_ghz: {self.clock_ghz} device_memory_size: {self.memory_bytes} "
            f"shared_memory_per_block_optin: {self.shared_per_block_optin} cuda_compute_capability {{ major: {major} "
            f"minor: {minor} }} registers_per_core_limit: 65536 registers_per_block_limit: 65536 }}\n"
            # cuDNN 9.8 and CUDA 12.8: what JAX 0.10's CUDA 12 wheels require and ship against.
            'platform_name: "CUDA"\ndnn_version_info { major: 9 minor: 8 }\n'
            f'runtime_version {{ major: 12 minor: 8 patch: 0 }}\ndevice_description_str: "{self.description}"\n')


_HOPPER = dict(compute_capability=(9, 0), sms=132, fp32_per_sm=128, l2_bytes=50 * 2**20, clock_ghz=1.98,
               shared_per_sm=228 * 1024, shared_per_block_optin=227 * 1024, threads_per_sm=2048)
_AMPERE = dict(compute_capability=(8, 0), sms=108, fp32_per_sm=64, l2_bytes=40 * 2**20, clock_ghz=1.41,
               shared_per_sm=164 * 1024, shared_per_block_optin=163 * 1024, threads_per_sm=2048)
_ADA = dict(compute_capability=(8, 9), fp32_per_sm=128, shared_per_sm=100 * 1024, shared_per_block_optin=99 * 1024,
            threads_per_sm=1536)

# H100, H200, A100: the figures of XLA's own target specs (openxla/xla xla/backends/gpu/target_config/specs/
# h100_sxm, h200, a100_sxm_40, a100_sxm_80 .txtpb, recorded from the devices), which match NVIDIA's datasheets
# (SMs, bandwidth, L2) and the Hopper / Ampere tuning guides (shared memory, threads per SM).
# L4 and RTX 4090 (not in XLA's specs): NVIDIA's L4 datasheet and the Ada architecture whitepaper (SMs, L2,
# bandwidth, boost clock), the CUDA programming guide for compute capability 8.9 (100 KiB shared memory per
# SM, 99 KiB per block, 1536 threads per SM), and nvidia-smi's reported totals (23,034 and 24,564 MiB).
TARGETS: dict[str, Gpu] = {
    "h100-80gb": Gpu("NVIDIA H100 80GB HBM3", memory_bytes=84_942_979_072, bandwidth=3_352_320_000_000, **_HOPPER),
    "h200": Gpu("NVIDIA H200 141GB HBM3e", memory_bytes=151_397_597_184, bandwidth=4_800_000_000_000, **_HOPPER),
    "a100-40gb": Gpu("NVIDIA A100-SXM4-40GB", memory_bytes=42_331_013_120, bandwidth=1_555_200_000_000, **_AMPERE),
    "a100-80gb": Gpu("NVIDIA A100-SXM4-80GB", memory_bytes=85_100_068_864, bandwidth=2_039_040_000_000, **_AMPERE),
    "l4": Gpu("NVIDIA L4", sms=58, memory_bytes=23_034 * 2**20, bandwidth=300_000_000_000, l2_bytes=48 * 2**20,
              clock_ghz=2.04, **_ADA),
    "rtx4090": Gpu("NVIDIA GeForce RTX 4090", sms=128, memory_bytes=24_564 * 2**20, bandwidth=1_008_000_000_000,
                   l2_bytes=72 * 2**20, clock_ghz=2.52, **_ADA),
}


@dataclass(frozen=True)
class Target:
    """`count` GPUs described by `config` (GpuTargetConfigProto text)."""

    name: str
    config: str
    count: int = 1

    @property
    def description(self) -> str:
        m = re.search(r'device_description_str:\s*"([^"]*)"', self.config)
        return m.group(1) if m else self.name

    @property
    def memory_bytes(self) -> int:
        return int(re.search(r"device_memory_size:\s*(\d+)", self.config).group(1))

    @property
    def label(self) -> str:
        device = self.description + (f" x{self.count}" if self.count > 1 else "")
        return LABEL.format(device=device)


def _count(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{flag}: the GPU count after ':' must be a positive integer, got {text!r}")
    return int(text)


def parse_target(name: str | None, config_file: str | Path | None = None) -> Target:
    """"h100-80gb" or "h100-80gb:8" (a known GPU, times 8), or a GpuTargetConfigProto text file (count: "FILE:8")."""
    if config_file is not None:
        path, _, n = str(config_file).rpartition(":") if re.search(r":\d+$", str(config_file)) else (config_file, "", "1")
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise DataError(f"--target-config {path}: cannot read it ({e.strerror})") from None
        for key in ("device_memory_size", "cuda_compute_capability", "core_count"):
            if key not in text:
                raise DataError(f"--target-config {path}: no {key}; expected a GpuTargetConfigProto in text form "
                                "(see docs/memory.md)")
        return Target(Path(path).stem, text, _count(n, "--target-config"))
    base, _, n = name.partition(":")
    if base not in TARGETS:
        raise UsageError(f"--target {name}: unknown GPU; known: {', '.join(TARGETS)} (or --target-config FILE)")
    return Target(base, TARGETS[base].config_text(), _count(n or "1", "--target"))


def require_compiler() -> None:
    """Stop in one line unless XLA's GPU compiler (the CUDA plugin) is installed."""
    if not platform.cuda_plugin_installed():
        raise MissingExtra(f"--target needs XLA's GPU compiler (jax-cuda12-plugin and -pjrt at jaxlib's version, "
                           f"cuDNN): it comes with the 'gpu-compile' extra: {EXTRA}")


@functools.cache
def devices(target: Target) -> tuple:
    """The target's abstract GPUs (jax.experimental.topologies), one per `count`."""
    require_compiler()
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="cuda", target_config=target.config,
                                            topology=f"1x1x{target.count}")
    except Exception as e:  # a malformed config file, or a CUDA backend that failed to start
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise UsageError(f"--target {target.name}: the GPU compiler refused the target ({first}); on a machine "
                         "without a GPU run with JAX_PLATFORMS=cpu") from None
    return tuple(topo.devices)


def lower_step(cfg: Config, target: Target, mode: str = "train_step"):
    """cfg's train step (or its eval step: "forward") as `python -m jaxlm.train` jits it, on a mesh of the
    target's GPUs laid out by cfg.parallel, lowered (traced, not yet compiled) for them."""
    import jax
    import numpy as np

    from jaxlm.core import sharding
    from jaxlm.nn.attention import compiling_for
    from jaxlm.training.loop import build

    if mode not in ("train_step", "forward"):
        raise UsageError(f"--mode {mode}: compiling for a target covers train_step and forward (the eval step)")
    gpus = devices(target)
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


def compile_step(cfg: Config, target: Target, mode: str = "train_step", lowered=None):
    """(compiled, seconds): the step of `lower_step` (or `lowered`, already lowered) compiled by XLA's GPU compiler."""
    from jaxlm.nn.attention import compiling_for

    lowered = lowered if lowered is not None else lower_step(cfg, target, mode)
    t0 = time.perf_counter()
    with compiling_for(devices(target)):
        compiled = lowered.compile()
    return compiled, time.perf_counter() - t0


# --------------------------------------------------------------------------- reading the compiled program

_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = \(?(\w+)\[")
_CALL = re.compile(r"\b(dot|custom-call)\(([^)]*)\)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_PARAM = re.compile(r"%?([\w.\-]+): (\w+)\[")


def program_facts(text: str) -> dict:
    """Static counts in optimised HLO text: matmuls (XLA dots, inside fusions too, and cuBLAS calls) by operand
    dtypes ("bf16xbf16"), cuDNN attention calls by kind. An op inside a loop body counts once."""
    matmuls, cudnn = collections.Counter(), collections.Counter()
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):  # a computation: its parameters
            types = dict(_PARAM.findall(line))
            continue
        d = _DEF.match(line)
        if not d:
            continue
        types[d.group(1)] = d.group(2)
        call = _CALL.search(line)
        if not call:
            continue
        if call.group(1) == "custom-call":
            name = (_TARGET.search(line) or [None, ""])[1]
            if name.startswith("__cudnn$fmha"):
                cudnn[name.removeprefix("__cudnn$")] += 1
            if not name.startswith("__cublas"):
                continue
        operands = re.findall(r"%([\w.\-]+)", call.group(2))[:2]
        matmuls["x".join(types.get(o, "?") for o in operands)] += 1
    return {"matmuls": sum(matmuls.values()), "matmul_dtypes": dict(sorted(matmuls.items())),
            "cudnn_attention_calls": sum(cudnn.values()), "cudnn_calls": dict(sorted(cudnn.items()))}


def describe(compiled, target: Target, fraction: float | None = None) -> dict:
    """What a compiled row reports: bytes per device, the program's facts, collectives, and whether it fits."""
    from jaxlm.bench.layouts import collectives

    m = compiled.memory_analysis()
    text = compiled.as_text()
    out = {"label": target.label, "target": target.name, "gpus": target.count,
           "argument_bytes": m.argument_size_in_bytes, "output_bytes": m.output_size_in_bytes,
           "alias_bytes": m.alias_size_in_bytes, "temp_bytes": m.temp_size_in_bytes}
    out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    out.update(program_facts(text))
    if target.count > 1:
        out["collectives"] = {op: c for op, c in collectives(text).items() if c["count"]}
    fraction = usable_share() if fraction is None else fraction
    out.update(capacity_bytes=target.memory_bytes, usable_fraction=fraction,
               usable_bytes=int(fraction * target.memory_bytes))
    out["fits"] = out["total_bytes"] <= out["usable_bytes"]
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
    compiled, seconds = compile_step(cfg, target, mode, lowered)
    return {**describe(compiled, target, fraction), "compile_s": seconds}


def largest_batch(cfg: Config, target: Target, mode: str = "train_step", limit: int = 1 << 14,
                  fraction: float | None = None) -> int:
    """The largest global batch whose compiled total fits the usable memory, found by compiling: the totals
    at one and two steps give an affine guess, then a search around it (galloping, then bisection), in
    steps of the rows the batch must divide into. 0 when not even one step's worth fits."""
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
    return search_largest(lambda k: row(k)["fits"], guess, max(1, limit // step)) * step


def search_largest(fits, guess: int, limit: int) -> int:
    """Largest k in [1, limit] with fits(k), given fits(1) and a monotone fits; probes `guess` first,
    then gallops away from it until bracketed, then bisects."""
    lo, hi = 1, limit + 1  # fits(lo); hi never fits (limit + 1 stands for "beyond the search")
    k, stride = min(max(guess, 2), limit), 1
    while hi - lo > 1:
        if fits(k):
            lo, k = k, k + stride
        else:
            hi, k = k, k - stride
        stride *= 2
        if not lo < k < hi:
            k = (lo + hi) // 2
    return lo


# --------------------------------------------------------------------------- rows of `python -m jaxlm.bench model`

BENCH_COLUMNS = ("framework", "mode", "dtype", "attention", "remat", "context", "batch", "status", "compile_s",
                 "argument_gb", "temp_gb", "total_gb", "fits", "matmuls", "matmul_dtypes", "cudnn_attention_calls",
                 "largest_batch", "error")


def setting_config(setting, cfg: Config, context: int, batch: int) -> Config:
    """cfg with a benchmark setting's model (window) and compute, at exactly this context and batch."""
    model, compute = setting.configs(cfg.model, context)
    return dataclasses.replace(cfg, model=dataclasses.replace(model, context_length=context), compute=compute,
                               data=dataclasses.replace(cfg.data, batch_size=batch))


def bench_row(setting, cfg: Config, context: int, batch: int, target: Target, name: str) -> dict:
    """One compiled benchmark row (no timing columns); a failure becomes an error row, as in a timed sweep."""
    from jaxlm.analysis.flops import param_counts

    row = {"framework": setting.framework, "model": name, "mode": setting.mode, "dtype": setting.dtype,
           "attention": setting.attention, "remat": setting.remat, "context": context, "batch": batch,
           "device": target.label, "params": param_counts(cfg.model)["total"]}
    try:
        r = compiled_row(setting_config(setting, cfg, context, batch), target, setting.mode)
    except (UsageError, ConfigError, ValueError) as e:  # e.g. cuDNN at float32, a batch the mesh cannot split
        return {**row, "status": "invalid", "error": str(e).splitlines()[0][:200]}
    r["matmul_dtypes"] = " ".join(f"{k}:{v}" for k, v in r["matmul_dtypes"].items())
    gb = {f"{k}_gb": r[f"{k}_bytes"] / 1e9 for k in ("argument", "output", "alias", "temp", "total")}
    # memory_gb / memory_source: what reports and plots of timed sweeps read, here the compiled total
    return {**row, **r, **gb, "memory_gb": gb["total_gb"], "memory_source": f"compiled for {target.name}",
            "status": "ok"}
