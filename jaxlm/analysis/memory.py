"""Memory estimator: what one step holds per device, and the largest batch that fits a device.

    python -m jaxlm.memory --preset large --context 1024 --batch 4 --dtype bfloat16 --device h100-80gb
    python -m deliverables.memory_validation --target h100-80gb --out docs/results/compiled/h100-80gb-validation.md \
        --cache docs/results/compiled/h100-80gb.json   # vs the GPU compiler's plan
    python -m deliverables.memory_validation --out docs/results/compiled/h100-80gb-validation.md  # vs XLA:CPU

Peak bytes of a train step = parameters (float32) + gradients (float32) + AdamW
moments m and v (float32) + compute-dtype copies of the weights (bfloat16 only)
+ activations. Activations are what the backward pass needs, by kind of tensor:
D-wide and F-wide (feed-forward hidden) per layer and token, the attention scores
(N x T x T per layer and sequence, none with cuDNN attention), the logits (V per
token; with a chunked loss, ``compute.loss_chunk``, one block's) and the embedding
side (D per token).

Two calibrations, because two compilers keep different tensors:
- "gpu" (the default): XLA's GPU compiler's plan of the real train step for an H100,
  the larger of two moments. The blocks' backward: bytes per element of each kind
  (`GPU_BYTES`, fitted on compiled two-layer probes by `python -m
  deliverables.memory_validation --target h100-80gb --calibrate`; under remat full
  one layer's working set, the saved block inputs mostly freed by then; under offload
  also what comes back from the host, `from_host`). The loss's backward: what the
  blocks keep and the logits with their float32 gradient (`HEAD_BYTES`, not fitted),
  the peak under remat at a large vocabulary. Validated in
  docs/results/compiled/h100-80gb-validation.md.
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

from jaxlm.analysis.flops import MODES, attention_widths, param_counts
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.nn.loss import block_positions

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BACKENDS = ("gpu", "cpu")

# XLA's GPU compiler (H100 target, jax 0.10): bytes at the train step's peak per element of each kind of tensor,
# (compute dtype, remat, cuDNN attention) -> (D-wide per layer and token, F-wide per layer and token, attention
# scores per layer and N T^2, logits per token and V, embedding side per token and D, gradients and weight
# copies per parameter). "full" counts one layer, its D-wide term including the embedding side. Fitted, so a
# coefficient can be below what one tensor of that kind would take: the compiler frees and reuses buffers
# (under remat, most gradients are produced after the peak).
GPU_BYTES: dict[tuple[str, str, bool], tuple[float, ...]] = {
    ("float32", "none", False): (26.48, 12.88, 8.25, 7.5, 4.21, 2.03),
    ("float32", "full", False): (36.07, 19.82, 7.9, 0.0, 0.0, 3.42),
    ("float32", "dots_saveable", False): (0.0, 11.19, 5.45, 6.46, 42.37, 1.25),
    ("bfloat16", "none", False): (19.21, 6.01, 6.09, 5.61, 0.0, 1.8),
    ("bfloat16", "none", True): (17.74, 5.99, 0.0, 5.75, 4.56, 1.51),
    ("bfloat16", "full", False): (27.13, 8.01, 6.23, 1.08, 0.0, 1.84),
    ("bfloat16", "full", True): (29.42, 7.43, 0.0, 2.54, 0.0, 1.3),
    ("bfloat16", "dots_saveable", False): (0.0, 5.31, 5.15, 4.52, 27.28, 1.02),
    ("bfloat16", "dots_saveable", True): (9.6, 4.9, 0.0, 4.42, 15.98, 1.23),
}

# The logits' moment, not fitted: the head is outside every block's remat, so when the loss's backward runs
# the blocks still hold what they keep for their own backward, and the head holds its logits (compute dtype,
# kept for the backward) and their float32 gradient; a chunked loss (`compute.loss_chunk`) holds one block's
# float32 logits and gradient at a time. Bytes per element of the logits that live at once.
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


def gpu_features(cfg: ModelConfig, batch: int, seq_len: int, remat: str) -> list[float]:
    """The element counts GPU_BYTES multiplies: D (`d_wide`) and F per layer and token, N T^2 per layer and sequence,
    V and D per token; one layer under remat full (and offload: its saved tensors go to the host), where
    the embedding side is one more D per token and falls in the first term."""
    tokens = batch * seq_len
    one = remat in ("full", "offload")
    layers = 1 if one else cfg.num_layers
    d_ff = cfg.d_ff / 2 if cfg.ffn == "silu" else cfg.d_ff  # the coefficients are SwiGLU's (two hidden branches)
    return [tokens * layers * d_wide(cfg), tokens * layers * d_ff, layers * batch * cfg.num_heads * seq_len**2,
            tokens * cfg.vocab_size, 0.0 if one else tokens * cfg.d_model]


def head_tokens(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig, devices: int = 1) -> int:
    """Tokens whose logits live at once: all `batch` x `seq_len`, or one block's under a chunked loss (the same
    positions of every row, the rows split over `devices`; `batch` is one device's part)."""
    return batch * block_positions(compute, cfg.vocab_size, batch * devices, seq_len)


def head_bytes(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig, devices: int = 1) -> float:
    """The logits and their gradient at the logits' moment (HEAD_BYTES)."""
    tokens = head_tokens(cfg, batch, seq_len, compute, devices)
    kind = "whole" if tokens == batch * seq_len else "chunked"
    return HEAD_BYTES[kind](DTYPE_BYTES[compute.dtype]) * tokens * cfg.vocab_size


def _gpu_remat(compute: ComputeConfig) -> str:
    """The GPU_BYTES row's remat policy: offload is priced as full, plus what comes back from the host (`from_host`)."""
    return "full" if compute.remat_policy == "offload" else compute.remat_policy


def _gpu_coefficients(compute: ComputeConfig, fused: bool | None) -> tuple[float, ...]:
    """GPU_BYTES of this setting; a fused kernel without its own row (torch's at float32) takes the XLA row."""
    remat = _gpu_remat(compute)
    fused = compute.attention == "cudnn" if fused is None else fused
    return GPU_BYTES.get((compute.dtype, remat, fused)) or GPU_BYTES[(compute.dtype, remat, False)]


def from_host(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig, fused: bool) -> float:
    """What remat offload has on the device again for the backward, not fitted: XLA brings the layers' offloaded
    matmul outputs (q, k, v, the attention's output projection, the feed-forward's matmuls) back from the host
    and recomputes their attention probabilities from them (no T x T tensor with a fused kernel) ahead of the
    blocks' backward, in the compute dtype; every layer but the one being differentiated, whose tensors are in
    the one-layer working set already."""
    gated = 2 if cfg.ffn == "swiglu" else 1
    width = _width("QKV", cfg, seq_len) + 2 * cfg.d_model + gated * cfg.d_ff
    scores = 0.0 if fused else cfg.num_heads * seq_len
    return DTYPE_BYTES[compute.dtype] * batch * seq_len * (cfg.num_layers - 1) * (width + scores)


def _gpu_activations(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig, fused: bool,
                     devices: int) -> dict[str, float]:
    """The larger of the step's two moments. The backward's: GPU_BYTES times gpu_features (fitted; its logits
    term is their share still live then), and under offload what is back from the host (`from_host`). The
    logits': what the blocks keep (under remat full or offload their inputs, the residual stream of every
    layer, else the same fitted layer terms) and the logits with their gradient (`head_bytes`, not fitted)."""
    remat = _gpu_remat(compute)
    values = [n * c for n, c in zip(gpu_features(cfg, batch, seq_len, remat), _gpu_coefficients(compute, fused))]
    head = head_tokens(cfg, batch, seq_len, compute, devices)
    values[3] *= head / (batch * seq_len)
    if fused:
        values[2] = 0.0  # a fused kernel keeps no T x T tensor
    where = "one layer (remat)" if remat == "full" else "layers"
    names = (f"{where}: D-wide tensors", f"{where}: feed-forward hidden", f"{where}: attention scores",
             "logits / loss", "embedding side")
    backward = dict(zip(names, values))
    if compute.remat_policy == "offload":
        backward["back from the host (offload)"] = from_host(cfg, batch, seq_len, compute, fused)
    if remat == "full":
        kept = {"layers: block inputs (remat)": DTYPE_BYTES[compute.dtype] * batch * seq_len * cfg.num_layers
                * cfg.d_model}
    else:
        kept = {k: v for k, v in backward.items() if k != "logits / loss"}
    at_logits = {**kept, "logits / loss": head_bytes(cfg, batch, seq_len, compute, devices)}
    return at_logits if sum(at_logits.values()) > sum(backward.values()) else backward


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
        state["gradients and weight copies at the peak"] = _gpu_coefficients(compute, fused)[5] * p / shard
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
