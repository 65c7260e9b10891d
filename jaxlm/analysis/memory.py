"""Memory estimator: what one step holds per device, and the largest batch that fits a device.

    python -m jaxlm.memory --preset large --context 1024 --batch 4 --dtype bfloat16 --device h100-80gb
    python -m jaxlm.memory validate --out docs/memory.md   # estimate vs XLA's memory_analysis() on CPU

Peak bytes of a train step = parameters (float32) + gradients (float32) + AdamW
moments m and v (float32) + compute-dtype copies of the weights (bfloat16 only)
+ activations. Activations are, per layer, the tensors the backward pass needs
(counted below by component), the output head's logits (with a chunked loss,
``compute.loss_chunk``, one block's: chunk x V instead of B x T x V), and under remat
the working set of the one block being rebuilt.

The per-component tensor counts are those of jaxlm's own forward (jaxlm.model,
jaxlm.attention "xla"): which tensors `jax.grad` saves, less what XLA fuses away,
calibrated against `compiled.memory_analysis()` of the real train step on CPU at
float32 without remat (the table in docs/memory.md gives the error of each row).
The CPU backend is faithful there, but not for remat (XLA:CPU's compiled memory
barely moves under it) nor for bfloat16 (it computes through float32): those settings
follow the policies' definitions and are estimates to check against a GPU's
measured peak. cudnn attention keeps no T x T tensor, only a log-sum-exp per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jaxlm.analysis.flops import param_counts
from jaxlm.core.config import ComputeConfig, ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MODES = ("forward", "forward_backward", "train_step")

# Device memory as the driver reports it (nvidia-smi's total; bytes). Marketed sizes in the names.
GIB = 2**30
DEVICES: dict[str, float] = {
    "h100-80gb": 81559 * 2**20,
    "h100-94gb": 95830 * 2**20,
    "h200": 143771 * 2**20,
    "a100-40gb": 40960 * 2**20,
    "a100-80gb": 81920 * 2**20,
    "l4": 23034 * 2**20,
    "rtx4090": 24564 * 2**20,
    "v100-32gb": 32768 * 2**20,
}
DEFAULT_USABLE = 0.9  # share of device memory a step may plan for: CUDA context, library workspaces, fragmentation

# Tensors kept per token for the backward pass, in units of the tensor's width (D, F, or a head's T scores
# times the N heads), on the xla attention path without remat; "t" is the compute dtype, "f32" float32, "u8"
# one byte. jax.grad saves about 12 D-wide tensors per layer (residuals, norm outputs, q, k, v, RoPE halves,
# attention output); XLA fuses the cheap elementwise ones into the backward and keeps about 6, so the
# D-wide counts below are calibrated on memory_analysis() and attributed to the components they come from.
SAVED = {
    "norms": ("D", "t", 1.0),  # RMSNorm output feeding the next matmul
    "residuals": ("D", "t", 1.0),  # the residual stream at the block's input
    "qkv": ("D", "t", 3.0),  # q, k (after RoPE), v
    "attention scores/probs": ("HT", "f32", 4.0),  # masked logits, their float32 copy, exp, probabilities
    "attention mask": ("HT", "u8", 1.0),  # the causal mask, broadcast to (B, N, T, T) booleans
    "attention output": ("D", "t", 1.0),  # softmax(.) V before output_proj
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
    return {"D": cfg.d_model, "F": cfg.d_ff, "HT": cfg.num_heads * seq_len}[kind]


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
        kept["qkv"] = 3.0 * a * cfg.d_model
        kept["attention output"] = a * cfg.d_model
        if not fused:
            kept["attention scores/probs"] = 4.0 * cfg.num_heads * seq_len
        gated = 2 if cfg.ffn == "swiglu" else 1
        kept["ffn hidden"] = a * (gated * cfg.d_ff + cfg.d_model)
    return kept


def activations(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig = ComputeConfig(),
                mode: str = "train_step", fused: bool | None = None, devices: int = 1) -> dict[str, float]:
    """Activation bytes at the step's peak, by component, all layers (see the module docstring).

    fused: attention is a fused kernel keeping no T x T tensor (default: compute.attention == "cudnn").
    devices: how many share the global batch (`batch` is each one's part; a chunked loss's block is split too).
    forward keeps nothing for a backward pass: one layer's tensors and the logits.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    a = DTYPE_BYTES[compute.dtype]
    fused = compute.attention == "cudnn" if fused is None else fused
    tokens = batch * seq_len
    per_layer = _per_token(SAVED, cfg, seq_len, a, fused)
    if cfg.norm == "none":
        per_layer["norms"] = 0.0
    working = _per_token(WORKING, cfg, seq_len, a, fused)
    chunk = compute.loss_chunk_for(cfg.vocab_size) / devices  # a chunked loss holds one block: at most this many tokens
    head_tokens = tokens if mode == "forward" or not chunk else min(tokens, max(chunk, batch))
    logits = head_tokens * cfg.vocab_size * (a if mode == "forward" else 4.0 * HEAD["logits / loss"])
    if mode == "forward":  # one layer live at a time, then the logits (the output)
        return {"one layer": tokens * sum(per_layer.values()), "logits / loss": logits}
    kept = _remat_saved(per_layer, cfg, seq_len, a, fused, compute.remat)
    if compute.remat == "offload":  # the saved matmul outputs live in host memory
        kept = {name: (a * cfg.d_model if name == "residuals" else 0.0) for name in kept}
    out = {"embedding": tokens * a * cfg.d_model}
    out.update({name: tokens * cfg.num_layers * value for name, value in kept.items()})
    if compute.remat != "none":  # the backward rebuilds one block at a time
        working = {k: working.get(k, 0.0) + per_layer[k] for k in per_layer}
    out["backward working set (one layer)"] = tokens * sum(working.values())
    out["logits / loss"] = logits
    return out


def estimate(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig = ComputeConfig(),
             mode: str = "train_step", mesh: Mesh = Mesh(), fused: bool | None = None) -> Estimate:
    """Predicted peak bytes per device of one step; `batch` is the global batch, split over mesh.devices."""
    p = param_counts(cfg)["total"]
    shard = mesh.devices if mesh.fsdp else 1
    state = {"parameters (float32)": 4.0 * p / shard}
    if compute.dtype != "float32":
        state[f"{compute.dtype} weight copies"] = DTYPE_BYTES[compute.dtype] * p / shard
    if mode != "forward":
        state["gradients (float32)"] = 4.0 * p / shard
    if mode == "train_step":
        state["AdamW moments m, v (float32)"] = 8.0 * p / shard
    if mesh.fsdp and mesh.devices > 1:  # one layer's parameters gathered at a time
        state["FSDP gathered layer"] = DTYPE_BYTES[compute.dtype] * (p - cfg.vocab_size * cfg.d_model) / cfg.num_layers
    per_device = math.ceil(batch / mesh.devices)
    return Estimate(state, activations(cfg, per_device, seq_len, compute, mode, fused, mesh.devices), per_device)


def largest_batch(cfg: ModelConfig, seq_len: int, capacity: float, compute: ComputeConfig = ComputeConfig(),
                  mode: str = "train_step", mesh: Mesh = Mesh(), fused: bool | None = None) -> int:
    """The largest global batch whose estimate fits `capacity` bytes per device (0 if none does).

    The estimate grows with the per-device batch (affine in it, but for a chunked loss's one block of
    logits), so a doubling then a bisection finds it.
    """
    def fits(per_device: int) -> bool:
        return estimate(cfg, per_device * mesh.devices, seq_len, compute, mode, mesh, fused).total <= capacity

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * mesh.devices
