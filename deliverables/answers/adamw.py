"""adamwAccounting: the peak memory of an AdamW train step by component, GPT-2 XL's instance of it, and the
FLOPs of one AdamW update term by term (the training time, (d), is accounting.time_section)."""

from __future__ import annotations

from deliverables.answers.accounting import max_batch, model
from deliverables.common import COURSE_MEMORY, table
from jaxlm.analysis import flops
from jaxlm.core.config import ModelConfig
from jaxlm.core.units import count, si

FLOAT32 = 4  # bytes


def activation_floats(m: ModelConfig, t: int) -> dict[str, int]:
    """Floats one sequence of t tokens keeps for the backward pass, by the components the question lists
    (a W1 -> SiLU -> W2 feed-forward of width d_ff)."""
    d, h, f, v, n = m.d_model, m.num_heads, m.d_ff, m.vocab_size, m.num_layers
    per_layer = {"RMSNorm inputs (2 per block)": 2 * t * d, "Q, K, V projections": 3 * t * d,
                 "Q Kᵀ (scores)": h * t * t, "softmax (probabilities)": h * t * t,
                 "weighted sum of values": t * d, "output projection": t * d,
                 "W1 output": t * f, "SiLU output": t * f, "W2 output": t * d}
    out = {f"{k}, x {n} blocks": n * x for k, x in per_layer.items()}
    return out | {"final RMSNorm": t * d, "output embedding (logits)": t * v,
                  "cross-entropy (softmax of the logits)": t * v}


def peak_terms(m: ModelConfig, t: int) -> tuple[float, float]:
    """(bytes per sequence a, fixed bytes b) of peak = a * batch_size + b: float32 activations, and
    parameters + gradients + AdamW's two moments = 16 bytes per parameter."""
    return FLOAT32 * sum(activation_floats(m, t).values()), 16 * flops.param_counts(m)["total"]


def formula_section() -> list[str]:
    return ["#### (a) Peak memory, by component", "",
            "With vocabulary V, context T, n blocks, width d, h heads, d_ff = 4d and batch B, everything in float32 "
            "(4 bytes):", "",
            "- parameters: 4P bytes, with P = 2Vd + n(4d² + 3 d d_ff + 2d) + d (embedding and untied head, attention, "
            "SwiGLU, two RMSNorm gains per block, the final gain);",
            "- gradients: 4P bytes, one per parameter;",
            "- AdamW state: 8P bytes, the first and second moments m and v;",
            "- activations kept for the backward pass, per sequence, by component: per block the two RMSNorms' inputs "
            "2Td, the Q, K, V projections 3Td, the scores Q Kᵀ hT², their softmax hT², the weighted sum of values Td, "
            "the output projection Td, the W1 output T d_ff, the SiLU output T d_ff and the W2 output Td; then the "
            "final RMSNorm Td, the logits TV and the cross-entropy's softmax TV.", "",
            "Summed: activations = 4B [n(8Td + 2T d_ff + 2hT²) + Td + 2TV] = **4B [n(16Td + 2hT²) + Td + 2TV]** bytes "
            "with d_ff = 4d, and **peak = 16P + 4B [n(16Td + 2hT²) + Td + 2TV]**. The hT² terms are the attention "
            "matrices that make memory grow with the square of the context.", ""]


def gpt2_xl_section() -> list[str]:
    m = model("gpt2-xl")
    t = m.context_length
    a, b = peak_terms(m, t)
    parts = activation_floats(m, t)
    rows = [[k, count(v), si(FLOAT32 * v, "B")] for k, v in parts.items()]
    return (["#### (b) GPT-2 XL", "",
             f"`gpt2-xl` (V {m.vocab_size:,}, T {t}, n {m.num_layers}, d {m.d_model}, h {m.num_heads}, d_ff "
             f"{m.d_ff} = 4d): one sequence keeps", ""]
            + [table(["activation", "floats per sequence", "float32 bytes"], rows, "lr"), ""]
            + [f"so **peak = {a / 1e9:.4g} GB · batch_size + {b / 1e9:.4g} GB** (P = {count(b // 16)}). The "
               f"largest batch in {COURSE_MEMORY / 1e9:g} GB: floor(({COURSE_MEMORY / 1e9:g} - {b / 1e9:.4g}) / "
               f"{a / 1e9:.4g}) = **{max_batch(b, a, COURSE_MEMORY)}**.", ""])


def adamw_flops_section() -> list[str]:
    m = model("gpt2-xl")
    rows = [[f"`{term}`", ops, str(n)] for term, ops, n in flops.ADAMW_TERMS]
    total = flops.ADAMW_FLOPS_PER_PARAM
    return (["#### (c) FLOPs of one AdamW step", "",
             "Per parameter, term by term (the square root counted as one FLOP; 1 - β, the bias-corrected "
             "α_t and lr·λ depend only on the step, so they are computed once per step, not per parameter):", ""]
            + [table(["update", "operations", "FLOPs"], rows, "lr"), ""]
            + [f"Total **{total} FLOPs per parameter**, {total}P per step: "
               f"{si(total * flops.param_counts(m)['total'], 'FLOP')} for `gpt2-xl`. Adam without the decoupled "
               f"weight decay needs {total - flops.ADAMW_TERMS[-1][2]}, the figure often quoted for AdamW; the "
               "decay's multiply and subtract add the rest. Next to the forward and backward passes (about 6 "
               "FLOPs per parameter per token, so 6P x tokens per step) this is negligible.", ""])
