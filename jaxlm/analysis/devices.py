"""The accelerators jaxlm knows, one row each: the one home of their memory, bandwidth, dense peak FLOP/s and
the fields XLA's GPU compiler needs to compile for them without one.

    python -m jaxlm.memory --device h100-80gb ...   # memory: the estimator's largest batch
    python -m jaxlm.memory --target h100-80gb ...   # compiler fields: the GPU compiler's own plan

Memory is what CUDA reports as the device's total (cuDeviceTotalMem, the figure XLA's target specs record and
JAX's allocator share multiplies: 0.75 of it by default, jaxlm.analysis.memory.usable_share); nvidia-smi's
total is a few hundred MiB larger (81,559 MiB on an H100 80GB against CUDA's 81,008 MiB: memory the driver
keeps). Where no CUDA figure is published the row says which figure it holds.

Peak FLOP/s are dense (no structured sparsity) from the vendors' datasheets, per dtype: "bfloat16" and
"float16" (tensor cores, float32 accumulation), "tf32" (tensor cores; JAX's default precision runs float32
matmuls this way on Ampere and later) and "float32" (the CUDA cores: `precision=HIGHEST`). Beside them, the
*achieved* rates the roofline (jaxlm.predict.roofline) prices kernels with: measured on machines of this kind
where one was measured (the record: docs/results/measured-rates.md), else one rule for every other GPU (the H100's
measured share of its datasheet figure): `Device.matmul_share`, `achieved_bandwidth`, `achieved_link`,
`achieved_host_link`; and the constants of how a kernel runs by its shape (SHAPE_CONSTANTS: GEMM_TILE,
ATTENTION_BLOCK, EXP_PER_SM_CLOCK, KERNEL_LAUNCH_S), each with its source beside it (`Sourced`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sourced:
    """A constant of how kernels run, with the public document or measurement it comes from."""

    value: Any
    source: str


@dataclass(frozen=True)
class CudaTarget:
    """The fields of a GpuTargetConfigProto that differ between GPUs. Shared by every CUDA GPU since Volta
    (CUDA C Programming Guide, "Technical Specifications per Compute Capability"): 1024 threads and 48 KiB
    static shared memory per block, warps of 32, 65,536 registers per SM and per block."""

    compute_capability: tuple[int, int]
    sms: int
    fp32_per_sm: int
    l2_bytes: int
    clock_ghz: float  # boost clock
    shared_per_sm: int
    shared_per_block_optin: int
    threads_per_sm: int


@dataclass(frozen=True)
class Device:
    """One accelerator. `kind`: the words of JAX's `device_kind` that name it ("NVIDIA H100 80GB HBM3" holds
    "H100"); `cuda`: what compiling for it needs (None: not a compile target)."""

    name: str
    description: str  # the device name CUDA (or the TPU runtime) reports
    kind: str
    memory_bytes: int
    bandwidth: float  # bytes/s of device memory
    peak_flops: dict[str, float]  # dtype -> dense FLOP/s
    cuda: CudaTarget | None = None
    measured_matmul: float | None = None  # FLOP/s of an 8192^3 bf16 matmul measured on a machine of this kind
    measured_copy: float | None = None  # bytes/s (read + written) of a device-to-device copy measured likewise
    link: float | None = None  # bytes/s each GPU sends over its links (NVLink, else PCIe), datasheet, one way
    host_link: float | None = None  # bytes/s between the GPU and host memory (PCIe, NVLink-C2C), datasheet, one way

    @property
    def matmul_share(self) -> float:
        """Achieved over dense peak for matmuls, the same for every dtype (measured in bf16 only: TF32 and float32
        are priced at bf16's share of their own peaks, derived, not measured); UNMEASURED_MATMUL_SHARE else."""
        if self.measured_matmul and "bfloat16" in self.peak_flops:
            return self.measured_matmul / self.peak_flops["bfloat16"]
        return UNMEASURED_MATMUL_SHARE

    @property
    def achieved_bandwidth(self) -> float:
        return self.measured_copy or UNMEASURED_COPY_SHARE * self.bandwidth

    @property
    def achieved_link(self) -> float | None:
        """Never measured here: the datasheet's one-way figure at the copy's share (UNMEASURED_COPY_SHARE)."""
        return self.link and UNMEASURED_COPY_SHARE * self.link

    @property
    def achieved_host_link(self) -> float | None:
        """Host <-> device copies (remat offload): the datasheet's one-way figure at the copy's share, like links."""
        return self.host_link and UNMEASURED_COPY_SHARE * self.host_link

    def config_text(self) -> str:
        """The GpuTargetConfigProto (text form) XLA's GPU compiler takes for this GPU."""
        c = self.cuda
        if c is None:
            raise ValueError(f"{self.name} is not a GPU the compiler can target")
        major, minor = c.compute_capability
        return (
            "gpu_device_info { threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152 "
            f"shared_memory_per_core: {c.shared_per_sm} threads_per_core_limit: {c.threads_per_sm} "
            f"core_count: {c.sms} fpus_per_core: {c.fp32_per_sm} block_dim_limit_x: 2147483647 "
            f"block_dim_limit_y: 65535 block_dim_limit_z: 65535 memory_bandwidth: {int(self.bandwidth)} "
            f"l2_cache_size: {c.l2_bytes} clock_rate_ghz: {c.clock_ghz} device_memory_size: {self.memory_bytes} "
            f"shared_memory_per_block_optin: {c.shared_per_block_optin} cuda_compute_capability {{ major: {major} "
            f"minor: {minor} }} registers_per_core_limit: 65536 registers_per_block_limit: 65536 }}\n"
            # cuDNN 9.8 and CUDA 12.8: what JAX 0.10's CUDA 12 wheels require and ship against.
            'platform_name: "CUDA"\ndnn_version_info { major: 9 minor: 8 }\n'
            f'runtime_version {{ major: 12 minor: 8 patch: 0 }}\ndevice_description_str: "{self.description}"\n')


def _peaks(bf16: float, tf32: float | None, fp32: float, fp16: float | None = None) -> dict[str, float]:
    out = {"bfloat16": bf16, "float16": fp16 or bf16, "tf32": tf32, "float32": fp32}
    return {k: v for k, v in out.items() if v}


_HOPPER = CudaTarget((9, 0), sms=132, fp32_per_sm=128, l2_bytes=50 * 2**20, clock_ghz=1.98, shared_per_sm=228 * 1024,
                     shared_per_block_optin=227 * 1024, threads_per_sm=2048)
_AMPERE = CudaTarget((8, 0), sms=108, fp32_per_sm=64, l2_bytes=40 * 2**20, clock_ghz=1.41, shared_per_sm=164 * 1024,
                     shared_per_block_optin=163 * 1024, threads_per_sm=2048)
_ADA = dict(compute_capability=(8, 9), fp32_per_sm=128, shared_per_sm=100 * 1024, shared_per_block_optin=99 * 1024,
            threads_per_sm=1536)
_BLACKWELL = CudaTarget((10, 0), sms=148, fp32_per_sm=128, l2_bytes=132_644_864, clock_ghz=1.965,
                        shared_per_sm=228 * 1024, shared_per_block_optin=227 * 1024, threads_per_sm=2048)
_RTX_BLACKWELL = CudaTarget((12, 0), sms=170, fp32_per_sm=128, l2_bytes=96 * 2**20, clock_ghz=2.407,
                            shared_per_sm=128 * 1024, shared_per_block_optin=99 * 1024, threads_per_sm=1536)

# Compiler fields and memory of the H100, H200, A100 and B200: XLA's own target specs (openxla/xla
# xla/backends/gpu/target_config/specs/h100_sxm, h200, a100_sxm_40, a100_sxm_80, b200 .txtpb, recorded from the
# devices), which match NVIDIA's datasheets (SMs, bandwidth, L2) and the Hopper / Ampere tuning guides (shared
# memory, threads per SM). L4 and RTX 4090 (not in XLA's specs): NVIDIA's L4 datasheet and the Ada architecture
# whitepaper (SMs, L2, bandwidth, boost clock, peaks), the CUDA programming guide for compute capability 8.9
# (shared memory, threads per SM). RTX 5090: NVIDIA's RTX Blackwell architecture whitepaper (170 SMs, 2,407 MHz
# boost, 96 MB L2, 1,792 GB/s; peaks with float32 accumulation), shared memory and threads per SM of compute
# capability 12.0 as in XLA's rtx6000pro spec (the same GB202 die). Memory of the H100 NVL, V100, L4, RTX 4090
# and RTX 5090: nvidia-smi's total. Peaks: the H100 SXM / H200 / H100 NVL / A100 / L4 / V100 SXM2 / HGX B200
# datasheets (sparse figures halved; B200: the HGX board's figures over its 8 GPUs), the Ada and RTX Blackwell
# whitepapers (RTX 4090, RTX 5090, float32 accumulation), Google Cloud's TPU pages (bfloat16 per chip).
# Measured (measured_matmul, measured_copy) on the H100 SXM and H200 machines the project measured: an 8192^3
# bf16 matrix product on random data, 798 TFLOP/s on the H100 and 769-798 on the H200 (the middle taken); a
# device-to-device copy, about 3.0 TB/s (H100) and 4.3 TB/s (H200) counting bytes read + written. What was run,
# when, and what was not kept: docs/results/measured-rates.md.
# Links, one way per GPU (datasheets): NVLink 5 on B200 1.8 TB/s bidirectional; NVLink 4 on H100/H200 SXM
# 900 GB/s; the H100 NVL's bridge 600 GB/s; NVLink 3 on A100 SXM 600 GB/s; NVLink 2 on V100 SXM2 300 GB/s; L4
# and RTX 4090: PCIe 4.0 x16, 64 GB/s bidirectional; RTX 5090: PCIe 5.0 x16, 128 GB/s bidirectional.
# Host links, one way (datasheets): PCIe 5.0 x16 (H100 SXM and NVL, H200, B200, RTX 5090: 128 GB/s
# bidirectional), PCIe 4.0 x16 (A100 SXM, L4, RTX 4090: 64 GB/s), PCIe 3.0 x16 (V100 SXM2: 32 GB/s).
DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("h100-80gb", "NVIDIA H100 80GB HBM3", "H100", 84_942_979_072, 3_352_320_000_000,
           _peaks(989e12, 494.5e12, 67e12), _HOPPER, measured_matmul=798e12, measured_copy=3.0e12, link=450e9,
           host_link=64e9),
    Device("h100-94gb", "NVIDIA H100 NVL", "H100 NVL", 95_830 * 2**20, 3.9e12, _peaks(835.5e12, 417.5e12, 60e12),
           link=300e9, host_link=64e9),
    Device("h200", "NVIDIA H200 141GB HBM3e", "H200", 151_397_597_184, 4.8e12, _peaks(989e12, 494.5e12, 67e12),
           _HOPPER, measured_matmul=784e12, measured_copy=4.3e12, link=450e9, host_link=64e9),
    Device("b200", "NVIDIA B200", "B200", 191_514_411_008, 7_672_320_000_000, _peaks(2250e12, 1125e12, 75e12),
           _BLACKWELL, link=900e9, host_link=64e9),
    Device("a100-40gb", "NVIDIA A100-SXM4-40GB", "A100", 42_331_013_120, 1_555_200_000_000,
           _peaks(312e12, 156e12, 19.5e12), _AMPERE, link=300e9, host_link=32e9),
    Device("a100-80gb", "NVIDIA A100-SXM4-80GB", "A100", 85_100_068_864, 2_039_040_000_000,
           _peaks(312e12, 156e12, 19.5e12), _AMPERE, link=300e9, host_link=32e9),
    Device("l4", "NVIDIA L4", "L4", 23_034 * 2**20, 300e9, _peaks(121e12, 60e12, 30.3e12),
           CudaTarget(sms=58, l2_bytes=48 * 2**20, clock_ghz=2.04, **_ADA), link=32e9, host_link=32e9),
    Device("rtx4090", "NVIDIA GeForce RTX 4090", "RTX 4090", 24_564 * 2**20, 1_008e9,
           _peaks(165.2e12, 82.6e12, 82.6e12), CudaTarget(sms=128, l2_bytes=72 * 2**20, clock_ghz=2.52, **_ADA),
           link=32e9, host_link=32e9),
    Device("rtx5090", "NVIDIA GeForce RTX 5090", "RTX 5090", 32_607 * 2**20, 1_792e9,
           _peaks(209.5e12, 104.8e12, 104.8e12), _RTX_BLACKWELL, link=64e9, host_link=64e9),
    Device("v100-32gb", "Tesla V100-SXM2-32GB", "V100", 32_768 * 2**20, 900e9, _peaks(None, None, 15.7e12, 125e12),
           link=150e9, host_link=16e9),
    Device("tpu-v4", "TPU v4", "TPU v4", 32 * 2**30, 1.2e12, {"bfloat16": 275e12}),
    Device("tpu-v5e", "TPU v5 lite", "TPU v5 lite", 16 * 2**30, 819e9, {"bfloat16": 197e12}),
    Device("tpu-v5p", "TPU v5p", "TPU v5p", 95 * 2**30, 2.765e12, {"bfloat16": 459e12}),
)}
TARGETS = tuple(name for name, d in DEVICES.items() if d.cuda is not None)  # what --target compiles for

# The one rule for a GPU without measurements: the H100's measured share of its datasheet peak (0.81) and
# bandwidth (0.90), the measured H100 standing in for every other kind.
UNMEASURED_REFERENCE = "h100-80gb"
_H100 = DEVICES[UNMEASURED_REFERENCE]
UNMEASURED_MATMUL_SHARE = _H100.measured_matmul / _H100.peak_flops["bfloat16"]
UNMEASURED_COPY_SHARE = _H100.measured_copy / _H100.bandwidth

# How a kernel runs by its shape (jaxlm.predict.efficiency prices every kernel with these), each beside the
# public document or measurement it comes from. A GEMM computes its output in tiles, one thread block per tile,
# run in waves of one tile per SM, the last wave's idle SMs wasted; a large GEMM runs the largest of the typical
# cuBLAS tiles, and one with fewer tiles than SMs splits its K dimension instead.
GEMM_TILE = Sourced((256, 128), "NVIDIA, Matrix Multiplication Background User's Guide (DU-09799-001): §2.3 typical "
                    "tile dimensions in cuBLAS, 256 x 128 the largest; §3.2 wave quantization")
# Fused attention (cuDNN's fused attention runs the FlashAttention-2 algorithm): one thread block per block of
# queries, stepping over blocks of keys; a causal mask skips the blocks above the diagonal and computes the
# diagonal ones whole. Besides its matmuls each score needs one exponential on the multi-function units.
ATTENTION_BLOCK = Sourced(128, "FlashAttention-2 (Dao 2023), §3.3: blocks of {64, 128} x {64, 128} queries x keys, "
                          "128 at head dimension 128")
EXP_PER_SM_CLOCK = Sourced(16, "CUDA C++ Programming Guide, throughput of native arithmetic instructions: exp2f 16 "
                           "results per clock per SM (compute capability 5.0 to 12.0); FlashAttention-3 (Shah et al. "
                           "2024), §3.1: an H100 SXM5 has 989 TFLOP/s of FP16 matmul but 3.9 TFLOP/s of exponentials "
                           "(132 SMs x 16 x 1.83 GHz)")
# A fixed cost per kernel: the gap between kernels a CUDA graph launches back to back (XLA launches its kernels as
# command buffers, i.e. CUDA graphs) plus the start and drain of a grid. A kernel moving b bytes reaches
# b / (b / bandwidth + KERNEL_LAUNCH_S) of the bandwidth: a few MB never reach peak.
KERNEL_LAUNCH_S = Sourced(2e-6, "an estimate, not measured: about 0.5 us between kernels of a CUDA graph (NVIDIA, "
                          "\"Getting Started with CUDA Graphs\": 3.4 us per kernel doing 2.9 us of work) plus a grid's "
                          "start and drain; the first calibration (jaxlm.predict.calibration) corrects it")
MEASURED = "docs/results/measured-rates.md"  # the record of measured_matmul and measured_copy: what ran, when
SHAPE_CONSTANTS = {"GEMM_TILE": GEMM_TILE, "ATTENTION_BLOCK": ATTENTION_BLOCK, "EXP_PER_SM_CLOCK": EXP_PER_SM_CLOCK,
                   "KERNEL_LAUNCH_S": KERNEL_LAUNCH_S}


def find(device_kind: str) -> Device | None:
    """The row whose `kind` names `device_kind` (e.g. jax.devices()[0].device_kind) as whole words, the longest
    such kind when several do ("NVIDIA H100 NVL" is the H100 NVL's, not the H100 SXM's); None for CPUs."""
    found = [d for d in DEVICES.values()
             if re.search(rf"(?<![\w]){re.escape(d.kind)}(?![\w])", device_kind, flags=re.IGNORECASE)]
    return max(found, key=lambda d: len(d.kind), default=None)
