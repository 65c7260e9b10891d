"""Memory estimator: what one step holds per device, and the largest batch that fits a device.

    python -m jaxlm.memory --preset large --context 1024 --batch 4 --dtype bfloat16 --device h100-80gb
    python -m experiments.memory_validation --target h100-80gb --out docs/memory.md   # vs the GPU compiler's plan
    python -m experiments.memory_validation --out docs/memory.md   # the CPU model vs memory_analysis() on CPU

Peak bytes of a train step = parameters (float32) + gradients (float32) + AdamW
moments m and v (float32) + compute-dtype copies of the weights (bfloat16 only)
+ activations. Activations are what the backward pass needs, by kind of tensor:
D-wide and F-wide (feed-forward hidden) per layer and token, the attention scores
(N x T x T per layer and sequence, none with cuDNN attention), the logits (V per
token; with a chunked loss, ``compute.loss_chunk``, one block's) and the embedding
side (D per token).

Two calibrations, because two compilers keep different tensors:
- "gpu" (the default): bytes per element of each kind, as XLA's GPU compiler plans
  the real train step for an H100 (`GPU_BYTES`, fitted on compiled two-layer probes
  by `python -m experiments.memory_validation --target h100-80gb --calibrate` and validated
  on the presets in docs/memory.md). Under remat full the peak is the last block's
  backward: one layer's working set, the saved block inputs mostly freed by then.
- "cpu": the tensors `jax.grad` saves in jaxlm's forward, less what XLA fuses away,
  calibrated on XLA:CPU's memory_analysis() at float32 without remat (faithful
  there only: XLA:CPU undoes remat and computes bfloat16 through float32).
The remat policy priced is `ComputeConfig.remat_policy`, the one the model applies: with
``compute.scan_layers`` "none" keeps the matmul outputs, as dots_saveable (jaxlm/nn/remat.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

from jaxlm.analysis.flops import attention_widths, param_counts
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.nn.loss import block_positions

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MODES = ("forward", "forward_backward", "train_step")
BACKENDS = ("gpu", "cpu")

# XLA's GPU compiler (H100 target, jax 0.10): bytes at the train step's peak per element of each kind of tensor,
# (compute dtype, remat policy, cuDNN attention) -> ten numbers: kept over all layers at both of the step's moments
# (D-wide per layer and token, F-wide per layer and token, attention scores per layer and N T^2); the same kinds
# back from the host for the backward (offload only: BACK_FROM_HOST); one block's backward (D-wide per token, the
# embedding side included, F-wide per token, scores per N T^2); gradients and weight copies per parameter. Fitted
# on compiled probes (`gpu_features`), so a coefficient can be below what one tensor of that kind would take: the
# compiler fuses, frees and reuses buffers (under remat most gradients are produced after the peak). The logits
# are not fitted: HEAD_BYTES.
GPU_BYTES: dict[tuple[str, str, bool], tuple[float, ...]] = {}

# Policies whose saved tensors leave the device after the forward pass and return for the backward: XLA fetches
# them (and recomputes the attention probabilities from them) several layers ahead, so they count over all layers,
# at the backward's moment only (jax's offload_dot_with_no_batch_dims to pinned host memory; jaxlm/nn/remat.py).
BACK_FROM_HOST = ("offload",)

# The logits' bytes per element at their moment, whatever the blocks keep (the head is outside every block's
# remat): the whole logits keep the compute-dtype logits for the backward and form their float32 gradient;
# a chunked loss (`compute.loss_chunk`) forms one block's float32 logits and their gradient in the forward pass.
HEAD_BYTES = {"whole": lambda a: 4.0 + a, "chunked": lambda a: 8.0}


# Share of device memory a step may plan for: JAX's GPU allocator (XLA's BFC pool) is capped at
# XLA_PYTHON_CLIENT_MEM_FRACTION of the device's memory, 0.75 by default, with or without preallocation
# (openxla/xla gpu_helpers.cc: "XLA backend will use up to ..."); the rest holds the CUDA context, the
# cuBLAS/cuDNN libraries and whatever is outside XLA's pool.
DEFAULT_USABLE = 0.75


def usable_share() -> float:
    """JAX's GPU allocator share in this environment: its variables, else DEFAULT_USABLE."""
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        if os.environ.get(name):
            return float(os.environ[name])
    return DEFAULT_USABLE

# Tensors kept per token for the backward pass, in units of the tensor's width (D, F, or a head's T scores
# times the N heads), on the xla attention path without remat; "t" is the compute dtype, "f32" float32, "u8"
# one byte. jax.grad saves about 12 D-wide tensors per layer (residuals, norm outputs, q, k, v, RoPE halves,
# attention output); XLA fuses the cheap elementwise ones into the backward and keeps about 6, so the
# D-wide counts below are calibrated on memory_analysis() and attributed to the components they come from.
SAVED = {
    "norms": ("D", "t", 1.0),  # RMSNorm output feeding the next matmul
    "residuals": ("D", "t", 1.0),  # the residual stream at the block's input
    "qkv": ("QKV", "t", 1.0),  # q, k (after RoPE), v: N H + 2 K H wide (3 D without grouped-query attention)
    "attention scores/probs": ("HT", "f32", 4.0),  # masked logits, their float32 copy, exp, probabilities
    "attention mask": ("HT", "u8", 1.0),  # the causal mask, broadcast to (B, N, T, T) booleans
    "attention output": ("Q", "t", 1.0),  # softmax(.) V before output_proj, N H wide
    "ffn hidden": ("F", "t", 4.0),  # w1 x, w3 x, silu(w1 x), the gated product (SwiGLU)
}
WORKING: dict = {}  # beyond the saved tensors, the layer being differentiated needs no more at the peak (CPU)
HEAD = {"logits / loss": 2.0}  # per token, x V x 4 bytes: the float32 logits and their gradient


@dataclass(frozen=True)
class Mesh:
    """Devices the step runs on: the batch is split over `devices`; `fsdp` also shards the float32 state."""

    devices: int = 1
    fsdp: bool = False


@dataclass(frozen=True)
class Estimate:
    """Bytes per device: `state` (independent of the batch) and `activations` (linear in it), by component."""

    state: dict[str, float]
    activations: dict[str, float]
    batch_per_device: int

    @property
    def state_total(self) -> float:
        return sum(self.state.values())

    @property
    def activation_total(self) -> float:
        return sum(self.activations.values())

    @property
    def total(self) -> float:
        return self.state_total + self.activation_total


def _width(kind: str, cfg: ModelConfig, seq_len: int) -> int:
    q, kv = attention_widths(cfg)
    return {"D": cfg.d_model, "Q": q, "QKV": q + 2 * kv, "F": cfg.d_ff, "HT": cfg.num_heads * seq_len}[kind]


def d_wide(cfg: ModelConfig) -> float:
    """The mean width of a layer's D-wide tensors (norm output, residual, q, k, v, attention output): d_model,
    unless grouped-query attention or a head_dim apart from d_model / num_heads narrows or widens q, k and v."""
    q, kv = attention_widths(cfg)
    return (2 * cfg.d_model + 2 * q + 2 * kv) / 6


def _bytes(dtype: str, compute_bytes: int) -> int:
    return {"t": compute_bytes, "f32": 4, "u8": 1}[dtype]


def _per_token(table: dict, cfg: ModelConfig, seq_len: int, a: int, fused: bool) -> dict[str, float]:
    """Bytes per token per layer of each component in `table` (the attention rows adjusted for the kernel)."""
    out = {}
    for name, (kind, dtype, count) in table.items():
        if kind == "HT" and fused:  # a fused kernel keeps one float32 log-sum-exp per head and row
            out[name] = 4.0 * cfg.num_heads if name == "attention scores/probs" else 0.0
            continue
        width = _width(kind, cfg, seq_len)
        if kind == "F" and cfg.ffn == "silu":
            count /= 2  # no w3 branch
        out[name] = count * width * _bytes(dtype, a)
    return out


def _remat_saved(per_layer: dict[str, float], cfg: ModelConfig, seq_len: int, a: int, fused: bool,
                 remat: str) -> dict[str, float]:
    """What each layer keeps under a remat policy (per token): the block input always; dots_saveable also
    the matmul outputs (q, k, v, attention scores unless fused, output_proj, w1, w3, w2); full nothing else."""
    if remat == "none":
        return per_layer
    kept = {name: 0.0 for name in per_layer}
    kept["residuals"] = a * cfg.d_model
    if remat == "dots_saveable":
        kept["qkv"] = a * _width("QKV", cfg, seq_len)
        kept["attention output"] = a * _width("Q", cfg, seq_len)
        if not fused:
            kept["attention scores/probs"] = 4.0 * cfg.num_heads * seq_len
        gated = 2 if cfg.ffn == "swiglu" else 1
        kept["ffn hidden"] = a * (gated * cfg.d_ff + cfg.d_model)
    return kept


def gpu_features(cfg: ModelConfig, batch: int, seq_len: int, fused: bool = False, remat: str = "none") -> list[float]:
    """The element counts GPU_BYTES multiplies (but the last, the parameters): D (`d_wide`), F per layer and token
    and N T^2 per layer and sequence over all layers, kept; the same back from the host (BACK_FROM_HOST policies,
    else zeros); then one block's (no T x T tensor with a fused kernel)."""
    tokens = batch * seq_len
    d_ff = cfg.d_ff / 2 if cfg.ffn == "silu" else cfg.d_ff  # the coefficients are SwiGLU's (two hidden branches)
    one = [tokens * d_wide(cfg), tokens * d_ff, 0.0 if fused else batch * cfg.num_heads * seq_len**2]
    layers = [cfg.num_layers * n for n in one]
    return layers + (layers if remat in BACK_FROM_HOST else [0.0] * 3) + one


def head_tokens(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig, devices: int = 1) -> int:
    """Tokens whose logits live at once: all `batch` x `seq_len`, or one block's under a chunked loss (the same
    positions of every row, the rows split over `devices`; `batch` is one device's part)."""
    return batch * block_positions(compute, cfg.vocab_size, batch * devices, seq_len)


def head_bytes(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig, devices: int = 1) -> float:
    """The logits at their moment (HEAD_BYTES) on the GPU."""
    tokens = head_tokens(cfg, batch, seq_len, compute, devices)
    kind = "whole" if tokens == batch * seq_len else "chunked"
    return HEAD_BYTES[kind](DTYPE_BYTES[compute.dtype]) * tokens * cfg.vocab_size


def _gpu_coefficients(compute: ComputeConfig, fused: bool | None) -> tuple[float, ...]:
    """GPU_BYTES of this setting; a fused kernel without its own row (torch's at float32) takes the XLA row."""
    remat = compute.remat_policy
    fused = compute.attention == "cudnn" if fused is None else fused
    return GPU_BYTES.get((compute.dtype, remat, fused)) or GPU_BYTES[(compute.dtype, remat, False)]


def _gpu_activations(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig, fused: bool,
                     devices: int) -> dict[str, float]:
    """What the blocks keep, plus the larger of the step's two moments: the logits' (the head's backward, or the
    chunked loss's block in the forward pass) and the backward's (one block's backward, and what returns from
    the host), the latter counted as its excess over the logits."""
    features = gpu_features(cfg, batch, seq_len, fused, compute.remat_policy)
    values = [n * c for n, c in zip(features, _gpu_coefficients(compute, fused))]
    head = head_bytes(cfg, batch, seq_len, compute, devices)
    return {"layers: D-wide tensors": values[0], "layers: feed-forward hidden": values[1],
            "layers: attention scores": values[2], "logits / loss": head,
            "backward beyond the logits": max(0.0, sum(values[3:9]) - head)}


def activations(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig = ComputeConfig(),
                mode: str = "train_step", fused: bool | None = None, backend: str = "gpu",
                devices: int = 1) -> dict[str, float]:
    """Activation bytes at the step's peak, by component, all layers (see the module docstring).

    fused: attention is a fused kernel keeping no T x T tensor (default: compute.attention == "cudnn").
    devices: how many share the global batch (`batch` is each one's part; a chunked loss's block is split too).
    forward keeps nothing for a backward pass: one layer's tensors and the logits.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    a = DTYPE_BYTES[compute.dtype]
    fused = compute.attention == "cudnn" if fused is None else fused
    if backend == "gpu" and mode != "forward":
        return _gpu_activations(cfg, batch, seq_len, compute, fused, devices)
    # the loss holds one block of the global batch's positions at a time (all of them: whole logits), split like
    # the batch over the devices
    tokens = batch * seq_len
    head = tokens if mode == "forward" else head_tokens(cfg, batch, seq_len, compute, devices)
    per_layer = _per_token(SAVED, cfg, seq_len, a, fused)
    if cfg.norm == "none":
        per_layer["norms"] = 0.0
    working = _per_token(WORKING, cfg, seq_len, a, fused)
    logits = head * cfg.vocab_size * (a if mode == "forward" else 4.0 * HEAD["logits / loss"])
    if mode == "forward":  # one layer live at a time, then the logits (the output)
        return {"one layer": tokens * sum(per_layer.values()), "logits / loss": logits}
    remat = compute.remat_policy  # what the model applies: "none" is dots_saveable under scanned layers
    kept = _remat_saved(per_layer, cfg, seq_len, a, fused, remat)
    if remat == "offload":  # the saved matmul outputs live in host memory
        kept = {name: (a * cfg.d_model if name == "residuals" else 0.0) for name in kept}
    out = {"embedding": tokens * a * cfg.d_model}
    out.update({name: tokens * cfg.num_layers * value for name, value in kept.items()})
    if remat != "none":  # the backward rebuilds one block at a time
        working = {k: working.get(k, 0.0) + per_layer[k] for k in per_layer}
    out["backward working set (one layer)"] = tokens * sum(working.values())
    out["logits / loss"] = logits
    return out


def estimate(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig = ComputeConfig(),
             mode: str = "train_step", mesh: Mesh = Mesh(), fused: bool | None = None,
             backend: str = "gpu") -> Estimate:
    """Predicted peak bytes per device of one step; `batch` is the global batch, split over mesh.devices."""
    p = param_counts(cfg)["total"]
    shard = mesh.devices if mesh.fsdp else 1
    state = {"parameters (float32)": 4.0 * p / shard}
    if backend == "gpu" and mode != "forward":  # what the compiler keeps at the peak, fitted (GPU_BYTES)
        state["gradients and weight copies at the peak"] = _gpu_coefficients(compute, fused)[9] * p / shard
    else:
        if compute.dtype != "float32":
            state[f"{compute.dtype} weight copies"] = DTYPE_BYTES[compute.dtype] * p / shard
        if mode != "forward":
            state["gradients (float32)"] = 4.0 * p / shard
    if mode == "train_step":
        state["AdamW moments m, v (float32)"] = 8.0 * p / shard
    if mesh.fsdp and mesh.devices > 1:  # one layer's parameters gathered at a time
        state["FSDP gathered layer"] = DTYPE_BYTES[compute.dtype] * (p - cfg.vocab_size * cfg.d_model) / cfg.num_layers
    per_device = math.ceil(batch / mesh.devices)
    return Estimate(state, activations(cfg, per_device, seq_len, compute, mode, fused, backend, mesh.devices),
                    per_device)


def largest_batch(cfg: ModelConfig, seq_len: int, capacity: float, compute: ComputeConfig = ComputeConfig(),
                  mode: str = "train_step", mesh: Mesh = Mesh(), fused: bool | None = None, backend: str = "gpu",
                  limit: int = 1 << 24) -> int:
    """The largest global batch whose estimate fits `capacity` bytes per device (0 if none does), by
    `search_largest` over the per-device batch (the estimate grows with it)."""
    def fits(per_device: int) -> bool:
        return estimate(cfg, per_device * mesh.devices, seq_len, compute, mode, mesh, fused, backend).total <= capacity

    return search_largest(fits, limit) * mesh.devices


def search_largest(fits: Callable[[int], bool], limit: int, guess: int = 1) -> int:
    """The largest k in [1, limit] with fits(k), for a monotone `fits` (true up to some k, false beyond); 0 when
    fits(1) is false. Every largest-batch search of jaxlm and its lab runs on this one: by estimate, by
    compiling, by running a step. After k = 1 it probes `guess` (an estimate, when the caller has one), gallops
    away from it in steps of 1, 2, 4, ... until the answer is bracketed, then bisects: about
    2 log2 |answer - guess| probes, so a good guess saves compiles or runs."""
    if limit < 1 or not fits(1):
        return 0
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


@dataclass(frozen=True)
class CompiledMemory:
    """Bytes per device of a compiled program, as XLA's buffer assignment planned them (`memory_analysis()`):
    its arguments, outputs, the outputs aliased to (donated) arguments, and temporaries."""

    argument: int
    output: int
    alias: int
    temp: int

    @property
    def total(self) -> int:
        """What the program holds at once: aliased outputs reuse their arguments' buffers."""
        return self.argument + self.output + self.temp - self.alias


def compiled_memory(compiled) -> CompiledMemory | None:
    """The one reader of a compiled program's memory: `compiled` is a compiled executable or its
    `memory_analysis()`; None where the backend gives none."""
    try:
        m = compiled.memory_analysis() if hasattr(compiled, "memory_analysis") else compiled
    except Exception:  # some backends have none
        return None
    if m is None:
        return None
    return CompiledMemory(int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.alias_size_in_bytes),
                          int(m.temp_size_in_bytes))
