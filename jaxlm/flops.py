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
  for the test model (tests/test_bench.py) the analytic matmul count is within
  10 % of it (measured gap: see docs/benchmarks.md).

Activation memory (`activation_memory`, `memory_estimate`) is a first-order model
in the style of Korthikanti et al. (2022), "Reducing activation recomputation":
the tensors each component keeps for its backward pass, per layer, counted at the
compute dtype (2 bytes bfloat16, 4 float32) except what the model computes in
float32 (attention probabilities on the xla path, the loss logits). It ignores
allocator slack, fusion and XLA's buffer reuse, so it is an estimate to within a
factor of about 2 (tests check the ordering and the order of magnitude against
`memory_analysis()`), good for comparing settings and choosing a batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxlm.config import ComputeConfig, ModelConfig

ADAMW_FLOPS_PER_PARAM = 12  # two moment updates, bias correction, sqrt, divide, decay, step

# Dense peak FLOP/s per device by (device kind substring, dtype). Datasheet figures, no sparsity.
PEAK_FLOPS: dict[tuple[str, str], float] = {
    ("H200", "bfloat16"): 989e12,
    ("H200", "float32"): 67e12,
    ("H100", "bfloat16"): 989e12,
    ("H100", "float32"): 67e12,
    ("A100", "bfloat16"): 312e12,
    ("A100", "float32"): 19.5e12,
    ("L4", "bfloat16"): 121e12,
    ("L4", "float32"): 30.3e12,
    ("TPU v4", "bfloat16"): 275e12,
    ("TPU v5 lite", "bfloat16"): 197e12,
    ("TPU v5p", "bfloat16"): 459e12,
}


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters per component (docs/spec.md shapes)."""
    d, f, v, n = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers
    norms = 0 if cfg.norm == "none" else 2 * d
    ffn_mats = 3 if cfg.ffn == "swiglu" else 2
    counts = {
        "embedding": v * d,
        "attention": n * 4 * d * d,
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
    d, f, v, n, t = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers, seq_len
    ffn_mats = 3 if cfg.ffn == "swiglu" else 2
    return ForwardFlops(
        attention_proj=n * 2 * t * 4 * d * d,
        attention_core=n * 2 * 2 * t * t * d,
        ffn=n * 2 * t * ffn_mats * d * f,
        lm_head=2 * t * d * v,
    )


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Forward + backward (3x forward) matmul FLOPs per trained token; the MFU numerator."""
    return 3 * forward_flops(cfg, seq_len).total / seq_len


def adamw_flops(cfg: ModelConfig) -> float:
    return ADAMW_FLOPS_PER_PARAM * param_counts(cfg)["total"]


def peak_flops(device_kind: str, dtype: str, override: float | None = None) -> float | None:
    """Peak FLOP/s for a device kind (e.g. jax.devices()[0].device_kind), or None when unknown (CPUs)."""
    if override:
        return override
    for (kind, dt), value in PEAK_FLOPS.items():
        if kind.lower() in device_kind.lower() and dt == dtype:
            return value
    return None


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


# --------------------------------------------------------------------------- memory

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ActivationMemory:
    """Bytes kept for the backward pass at the end of a forward, by component (all layers)."""

    embedding: float  # embedding output: the first residual
    attention: float  # ln1 in/out, q k v (pre and post RoPE), probabilities, attention output
    ffn: float  # ln2 in/out, w1 and w3 outputs, silu, gated product
    lm_head: float  # ln_final in/out, logits and their float32 copy for the loss

    @property
    def total(self) -> float:
        return self.embedding + self.attention + self.ffn + self.lm_head


def activation_memory(
    cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig = ComputeConfig(), *,
    fused_attention: bool | None = None,
) -> ActivationMemory:
    """Activation bytes saved for backward (see the module docstring for the model).

    fused_attention: whether attention is a fused kernel that keeps no T x T
    probabilities (cudnn; torch's SDPA). Default: compute.attention == "cudnn".
    remat "full" keeps each block's input plus one block's working set;
    "dots_saveable" / "offload" keep the matmul outputs only.
    """
    a = DTYPE_BYTES[compute.dtype]
    d, f, v, n, h, t = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.num_layers, cfg.num_heads, seq_len
    tokens = batch * t
    if fused_attention is None:
        fused_attention = compute.attention == "cudnn"
    probs = h * 4 if fused_attention else h * t * 4  # per token: log-sum-exp only, or f32 probabilities
    gated = cfg.ffn == "swiglu"
    norm = 2 * d if cfg.norm != "none" else 0  # norm input and output
    attn_tok = a * (norm + 3 * d + (2 * d if cfg.rope else 0) + d) + probs
    ffn_tok = a * (norm + (4 * f if gated else 2 * f))
    if compute.remat == "full":
        # Only each block's input survives; the backward rebuilds one block at a time.
        attn_all = tokens * (n * a * d + attn_tok)
        ffn_all = tokens * ffn_tok
    elif compute.remat in ("dots_saveable", "offload"):
        # Matmul outputs: q, k, v, scores (f32), attention @ v, output_proj; w1, w3, w2.
        scores = 0 if fused_attention else h * t * 4
        attn_dots = a * 5 * d + scores
        ffn_dots = a * ((2 if gated else 1) * f + d)
        scale = 0.0 if compute.remat == "offload" else 1.0  # offload moves them to host memory
        attn_all = tokens * (n * (a * d + scale * attn_dots))
        ffn_all = tokens * n * scale * ffn_dots
    else:
        attn_all = tokens * n * attn_tok
        ffn_all = tokens * n * ffn_tok
    head = tokens * (a * (norm // 2 if cfg.norm != "none" else 0) + a * d + a * v + 4 * v)
    return ActivationMemory(embedding=tokens * a * d, attention=attn_all, ffn=ffn_all, lm_head=head)


def memory_estimate(cfg: ModelConfig, batch: int, seq_len: int, mode: str, compute: ComputeConfig = ComputeConfig(), *,
                    fused_attention: bool | None = None) -> dict[str, float]:
    """Estimated peak bytes of one step: parameters (float32), gradients, AdamW moments, activations.

    forward keeps no activations for backward: its working set is one layer's
    plus the logits.
    """
    p = param_counts(cfg)["total"]
    est = {"params": 4.0 * p, "grads": 0.0, "optimizer": 0.0, "activations": 0.0}
    act = activation_memory(cfg, batch, seq_len, compute, fused_attention=fused_attention)
    if mode == "forward":
        one_layer = (act.attention + act.ffn) / max(cfg.num_layers, 1) if compute.remat == "none" else 0.0
        est["activations"] = act.lm_head + one_layer
    else:
        est["activations"] = act.total
        est["grads"] = 4.0 * p
        if mode == "train_step":
            est["optimizer"] = 8.0 * p
    est["total"] = sum(est.values())
    return est
