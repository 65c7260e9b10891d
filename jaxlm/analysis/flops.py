"""Analytic parameter and FLOP counts for the Transformer LM: the one place they are computed.

Conventions (written down because MFU figures depend on them):
- A matmul of (m, k) by (k, n) costs 2 m k n FLOPs; elementwise work (norms,
  softmax, SiLU, RoPE) is not counted, as in the PaLM / Chinchilla MFU convention.
- Attention scores and the weighted sum count the full T x T product even when
  causal (XLA computes all of it unless a fused kernel skips masked blocks); with
  a sliding window the count is the same, since the xla path masks rather than skips.
- Backward costs twice the forward; an AdamW update costs `ADAMW_FLOPS_PER_PARAM`.
  A step's FLOPs (`step_flops`) are model FLOPs: remat recomputation is not
  counted (it costs time, not useful work), so remat lowers MFU.
- XLA's `cost_analysis()['flops']` also counts elementwise work and the softmax;
  for the test model (tests/lib/test_bench.py) the analytic matmul count is within
  10 % of it (measured gap: see docs/benchmarks.md).

Memory (parameters, optimizer state, activations by component) lives in jaxlm.analysis.memory, the devices'
peak FLOP/s in jaxlm.analysis.devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxlm.analysis.devices import find
from jaxlm.core.config import ModelConfig

# One AdamW update (docs/spec.md#optimizer), per parameter, term by term. Scalars that depend only on the
# step (1 - beta, alpha_t with its bias correction, lr * weight_decay) are computed once per step, not counted.
ADAMW_TERMS: tuple[tuple[str, str, int], ...] = (
    ("m <- b1 m + (1 - b1) g", "2 multiplies, 1 add", 3),
    ("v <- b2 v + (1 - b2) g^2", "g^2, 2 multiplies, 1 add", 4),
    ("theta <- theta - alpha_t m / (sqrt(v) + eps)", "square root, add eps, divide, multiply by alpha_t, subtract", 5),
    ("theta <- theta - lr wd theta", "multiply by lr wd, subtract", 2),
)
ADAMW_FLOPS_PER_PARAM = sum(n for _, _, n in ADAMW_TERMS)


def attention_widths(cfg: ModelConfig) -> tuple[int, int]:
    """(N H, K H): the width of the queries (and attention output), and of the keys (and values) with K key/value
    heads; both d_model for multi-head attention with H = d_model / N."""
    return cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per component (docs/spec.md shapes; q and output_proj d x NH, k and v d x KH)."""
    d, f, v, n = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers
    q, kv = attention_widths(cfg)
    norms = 0 if cfg.norm == "none" else 2 * d
    ffn_mats = 3 if cfg.ffn == "swiglu" else 2
    counts = {
        "embedding": v * d,
        "attention": n * 2 * d * (q + kv),
        "ffn": n * ffn_mats * d * f,
        "norms": n * norms + (0 if cfg.norm == "none" else d),
        "lm_head": 0 if cfg.tie_embeddings else v * d,
    }
    counts["total"] = sum(counts.values())
    counts["non_embedding"] = counts["total"] - counts["embedding"]
    return counts


@dataclass(frozen=True)
class ForwardFlops:
    """Forward FLOPs for one sequence of `seq_len` tokens, by component."""

    attention_proj: float  # q, k, v and output projections
    attention_core: float  # Q K^T and softmax(.) V
    ffn: float
    lm_head: float

    @property
    def attention(self) -> float:
        return self.attention_proj + self.attention_core

    @property
    def total(self) -> float:
        return self.attention_proj + self.attention_core + self.ffn + self.lm_head


def forward_flops(cfg: ModelConfig, seq_len: int) -> ForwardFlops:
    """Grouped-query attention shrinks the k and v projections only: every query head still scores T x T keys."""
    d, f, v, n, t = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers, seq_len
    q, kv = attention_widths(cfg)
    ffn_mats = 3 if cfg.ffn == "swiglu" else 2
    return ForwardFlops(
        attention_proj=n * 2 * t * 2 * d * (q + kv),
        attention_core=n * 2 * 2 * t * t * q,
        ffn=n * 2 * t * ffn_mats * d * f,
        lm_head=2 * t * d * v,
    )


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Forward + backward (3x forward) matmul FLOPs per trained token; the MFU numerator."""
    return 3 * forward_flops(cfg, seq_len).total / seq_len


def adamw_flops(cfg: ModelConfig) -> float:
    return ADAMW_FLOPS_PER_PARAM * param_counts(cfg)["total"]


def peak_flops(device_kind: str, dtype: str, override: float | None = None) -> float | None:
    """Dense peak FLOP/s of a device kind (e.g. jax.devices()[0].device_kind) in `dtype`, from the device table
    (jaxlm.analysis.devices), or None when unknown (CPUs)."""
    if override:
        return override
    device = find(device_kind)
    return device.peak_flops.get(dtype) if device else None


def mfu(tokens_per_second: float, cfg: ModelConfig, seq_len: int, device_kind: str, num_devices: int = 1,
        dtype: str = "float32", override: float | None = None) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the devices' peak (None if the peak is unknown)."""
    peak = peak_flops(device_kind, dtype, override)
    if peak is None:
        return None
    return tokens_per_second * train_flops_per_token(cfg, seq_len) / (peak * num_devices)


# --------------------------------------------------------------------------- per step

MODES = ("forward", "forward_backward", "train_step")


def step_flops(cfg: ModelConfig, batch: int, seq_len: int, mode: str) -> float:
    """Model FLOPs of one benchmark step: forward, forward+backward, or a full AdamW train step."""
    fwd = batch * forward_flops(cfg, seq_len).total
    if mode == "forward":
        return fwd
    if mode == "forward_backward":
        return 3 * fwd
    if mode == "train_step":
        return 3 * fwd + adamw_flops(cfg)
    raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
