"""transformer_accounting and adamwAccounting: parameters, FLOPs, memory and training days from `jaxlm.analysis`,
so the answers share one convention with the benchmarks' MFU and memory; adamwAccounting's own formula and AdamW's
FLOPs term by term are written out as the question asks."""

from __future__ import annotations

import math
from pathlib import Path

from deliverables.common import COURSE_MEMORY, table
from deliverables.compiled_memory import cached, cached_at_largest
from jaxlm.analysis import flops, memory
from jaxlm.analysis.devices import DEVICES, Device
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.core.units import count, si

GPT2 = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")
CONTEXTS = (1024, 16384)
MFU = 0.5
FLOAT32 = 4  # bytes
TRAIN_STEPS, TRAIN_BATCH, TRAIN_CONTEXT = 400_000, 1024, 1024  # the course's GPT-2 XL training run
SETTINGS = {  # how the AdamW memory question is answered: the course's float32, and the project's fast path,
    # both holding the whole logits (loss_chunk 0) as the course's accounting does, so memory is linear in the batch
    "float32, xla attention": ComputeConfig(loss_chunk=0),
    "bfloat16, fused (cuDNN) attention": ComputeConfig(dtype="bfloat16", attention="cudnn", loss_chunk=0),
}


def model(name: str, context: int = 1024) -> ModelConfig:
    return ModelConfig.from_name(name, context_length=context)


# --------------------------------------------------------------------------- parameters and FLOPs


def parameters_section(names: list[str]) -> list[str]:
    out = ["#### (a) Parameters, and the memory to load them", "",
           "Per layer: attention 4 d² (W_q, W_k, W_v, W_o), SwiGLU feed-forward 3 d d_ff, two RMSNorm gains 2 d; "
           "plus the embedding V d, the final norm d and the untied output head V d. "
           "Loading them in float32 takes 4 bytes each.", ""]
    rows = []
    for n in names:
        c, m = flops.param_counts(model(n)), model(n)
        rows.append([f"`{n}`", str(m.d_model), str(m.num_layers), str(m.num_heads), str(m.d_ff), str(m.vocab_size),
                     count(c["attention"]), count(c["ffn"]), count(c["embedding"] + c["lm_head"]), count(c["total"]),
                     si(4 * c["total"], "B")])
    return out + [table(["model", "d", "layers", "heads", "d_ff", "V", "attention", "ffn", "embed + head", "total",
                         "float32"], rows, "lr"), ""]


def matmuls_section(name: str, t: int) -> list[str]:
    """The matrix multiplies of one forward, with shapes, for one sequence of t tokens."""
    m = model(name, t)
    d, f, v, n = m.d_model, m.d_ff, m.vocab_size, m.num_layers
    rows = [["q, k, v projections", f"({t}, {d}) x ({d}, {d}), 3 per layer", count(n * 3 * 2 * t * d * d)],
            ["attention scores Q Kᵀ", f"({t}, {d // m.num_heads}) x ({d // m.num_heads}, {t}) per head",
             count(n * 2 * t * t * d)],
            ["weighted sum softmax(.) V", f"({t}, {t}) x ({t}, {d // m.num_heads}) per head", count(n * 2 * t * t * d)],
            ["output projection", f"({t}, {d}) x ({d}, {d})", count(n * 2 * t * d * d)],
            ["W1 and W3 (gate, up)", f"({t}, {d}) x ({d}, {f}), 2 per layer", count(n * 2 * 2 * t * d * f)],
            ["W2 (down)", f"({t}, {f}) x ({f}, {d})", count(n * 2 * t * f * d)],
            ["output head", f"({t}, {d}) x ({d}, {v}), once", count(2 * t * d * v)]]
    total = flops.forward_flops(m, t).total
    return ([f"#### (b) The matrix multiplies of `{name}` (one sequence, context {t})", "",
             "A (m, k) x (k, n) product costs 2 m k n FLOPs; norms, softmax, SiLU and RoPE are not counted.", ""]
            + [table(["matmul", "shape", f"FLOPs ({n} layers)"], rows, "lr"), ""]
            + [f"Total: **{count(total)}** FLOPs ({si(total, 'FLOP')}) per forward.", ""])


def shares(m: ModelConfig, t: int) -> dict[str, float]:
    f = flops.forward_flops(m, t)
    return {"attention projections": f.attention_proj / f.total, "attention core (QKᵀ, AV)": f.attention_core / f.total,
            "feed-forward": f.ffn / f.total, "output head": f.lm_head / f.total}


def flops_section(names: list[str]) -> list[str]:
    out = ["#### (c)-(e) Forward FLOPs per component", "",
           "Per sequence of T tokens: attention projections n 8 T d², attention core n 4 T² d, "
           "SwiGLU n 6 T d d_ff, output head 2 T d V (n layers). Training costs 3x the forward (backward = 2x).", ""]
    for t in CONTEXTS:
        rows = []
        for n in names:
            m = model(n, t)
            f = flops.forward_flops(m, t)
            rows.append([f"`{n}`", si(f.total, "FLOP"), *(f"{100 * s:.1f}%" for s in shares(m, t).values()),
                         si(flops.train_flops_per_token(m, t), "FLOP")])
        out += [f"##### Context {t}", ""]
        out += [table(["model", "forward", *shares(model(names[0]), t), "train FLOPs/token"], rows, "lr"), ""]
    return out + matmuls_section("gpt2-xl", 1024) + flops_observations()


def flops_observations() -> list[str]:
    out = ["##### What the numbers say", ""]
    for n in GPT2:
        s = shares(model(n), 1024)
        top = max(s, key=s.get)
        out.append(f"- `{n}` at context 1024: the {top} takes the largest share ({100 * s[top]:.1f}%); the attention "
                   f"core {100 * s['attention core (QKᵀ, AV)']:.1f}%, the output head {100 * s['output head']:.1f}%.")
    small, xl = shares(model("gpt2-small"), 1024), shares(model("gpt2-xl"), 1024)
    out.append(f"- From small to XL the output head's share falls from {100 * small['output head']:.1f}% to "
               f"{100 * xl['output head']:.1f}% and the feed-forward's rises from {100 * small['feed-forward']:.1f}% "
               f"to {100 * xl['feed-forward']:.1f}%: per-layer work grows with d² while the head grows with d only.")
    f1, f16 = (flops.forward_flops(model("gpt2-xl", t), t) for t in CONTEXTS)
    long = shares(model("gpt2-xl", 16384), 16384)
    out += [f"- `gpt2-xl` from context 1024 to 16384 (16x the tokens): one forward grows {f16.total / f1.total:.1f}x "
            f"({si(f1.total, 'FLOP')} to {si(f16.total, 'FLOP')}); the T² attention core grows 256x and its share goes "
            f"from {100 * xl['attention core (QKᵀ, AV)']:.1f}% to {100 * long['attention core (QKᵀ, AV)']:.1f}%.", ""]
    return out


# --------------------------------------------------------------------------- adamwAccounting (a)-(c)


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


def adamw_section() -> list[str]:
    """(a) the peak memory of an AdamW train step by component, (b) GPT-2 XL's instance of it, (c) the FLOPs of one
    AdamW update term by term; the training time, (d), is time_section."""
    m = model("gpt2-xl")
    t = m.context_length
    a, b = peak_terms(m, t)
    rows = [[k, count(v), si(FLOAT32 * v, "B")] for k, v in activation_floats(m, t).items()]
    terms = [[f"`{term}`", ops, str(n)] for term, ops, n in flops.ADAMW_TERMS]
    total = flops.ADAMW_FLOPS_PER_PARAM
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
            "matrices that make memory grow with the square of the context.", "",
            "#### (b) GPT-2 XL", "",
            f"`gpt2-xl` (V {m.vocab_size:,}, T {t}, n {m.num_layers}, d {m.d_model}, h {m.num_heads}, d_ff "
            f"{m.d_ff} = 4d): one sequence keeps", "",
            table(["activation", "floats per sequence", "float32 bytes"], rows, "lr"), "",
            f"so **peak = {a / 1e9:.4g} GB · batch_size + {b / 1e9:.4g} GB** (P = {count(b // 16)}). The "
            f"largest batch in {COURSE_MEMORY / 1e9:g} GB: floor(({COURSE_MEMORY / 1e9:g} - {b / 1e9:.4g}) / "
            f"{a / 1e9:.4g}) = **{max_batch(b, a, COURSE_MEMORY)}**.", "",
            "#### (c) FLOPs of one AdamW step", "",
            "Per parameter, term by term (the square root counted as one FLOP; 1 - β, the bias-corrected "
            "α_t and lr·λ depend only on the step, so they are computed once per step, not per parameter):", "",
            table(["update", "operations", "FLOPs"], terms, "lr"), "",
            f"Total **{total} FLOPs per parameter**, {total}P per step: "
            f"{si(total * flops.param_counts(m)['total'], 'FLOP')} for `gpt2-xl`. Adam without the decoupled "
            f"weight decay needs {total - flops.ADAMW_TERMS[-1][2]}, the figure often quoted for AdamW; the "
            "decay's multiply and subtract add the rest. Next to the forward and backward passes (about 6 "
            "FLOPs per parameter per token, so 6P x tokens per step) this is negligible.", ""]


# --------------------------------------------------------------------------- memory and time


def memory_terms(m: ModelConfig, t: int, compute: ComputeConfig) -> tuple[dict[str, float], float]:
    """(state bytes by part, activation bytes per sequence) by the tensor-counting model (calibration "cpu"), the
    curriculum's accounting: 16P of state plus what jax.grad saves, linear in the batch (docs/memory.md)."""
    est = memory.estimate(m, 1, t, compute, backend="cpu")
    return dict(est.state), est.activation_total


def max_batch(fixed: float, per_seq: float, memory: float) -> int:
    return max(int(math.floor((memory - fixed) / per_seq)), 0)


def memory_section(names: list[str], root: Path) -> list[str]:
    out = compiled_largest_section(root)
    out += ["#### Cross-check: the same question under jaxlm's own activation model", "",
           f"Not the answer to (b), which uses the question's own formula above: a second model, for comparison. "
           f"Peak bytes of a train step = parameters 4P + gradients 4P + AdamW moments (m, v) 8P + activations a·B, "
           f"with P parameters, batch B and a the bytes each sequence keeps for the backward pass (jaxlm.memory's "
           f"activation model: per layer the norm output, the residual, q, k, v, the attention scores and "
           f"probabilities, the attention output, the feed-forward's hidden activations; then the float32 logits "
           f"and their gradient). In bfloat16 the weights' bfloat16 copies add 2P. "
           f"Largest batch in {COURSE_MEMORY / 1e9:g} GB (the question's) = floor((memory - state) / a).", ""]
    for label, compute in SETTINGS.items():
        rows = []
        for n in names:
            m = model(n)
            fixed, per_seq = memory_terms(m, m.context_length, compute)
            state = sum(fixed.values())
            rows.append([f"`{n}`", str(m.context_length), si(state, "B"), f"{si(per_seq, 'B')} · B + {si(state, 'B')}",
                         str(max_batch(state, per_seq, COURSE_MEMORY))])
        head = ["model", "context", "state (16P, or 18P in bfloat16)", "peak memory",
                f"largest B in {COURSE_MEMORY / 1e9:g} GB"]
        out += [f"##### {label}", "", table(head, rows, "lr"), ""]
    m = model("gpt2-xl")
    fixed, per_seq = memory_terms(m, 1024, SETTINGS["float32, xla attention"])
    out += [f"For `gpt2-xl` in float32 this model gives {per_seq / 1e9:.4g} GB · batch_size + "
            f"{sum(fixed.values()) / 1e9:.4g} GB ("
            + ", ".join(f"{k} {v / 1e9:.4g} GB" for k, v in fixed.items()) + "): it keeps more per sequence than the "
            "question's formula (the float32 copies of masked scores and the softmax's intermediates), hence a "
            "smaller batch than (b)'s answer.", ""]
    return out


def analytic_largest(compute: ComputeConfig) -> int:
    """The same question by jaxlm.memory's GPU-calibrated estimate at the same usable share: the cross-check."""
    usable = DEVICES["h100-80gb"].memory_bytes * memory.DEFAULT_USABLE
    return memory.largest_batch(model("small"), 1024, usable, compute)


def compiled_largest_section(root: Path) -> list[str]:
    """The one answer to 'the largest batch of `small` at context 1024 on an H100': the compiled plan at the
    allocator's usable share; the compiled figures at that batch and the analytic model beside it."""
    got = cached_at_largest("largest-batch", "h100-80gb", root / "compiled")
    at8 = cached("largest-batch", "h100-80gb", root / "compiled")
    usable = DEVICES["h100-80gb"].memory_bytes * memory.DEFAULT_USABLE
    head = ["#### The largest batch on one H100, by compiling", "",
            f"`small` (vocabulary 10,000) at context 1024, the AdamW train step compiled for an 80 GB H100 by XLA's "
            f"GPU compiler (the compiler's plan, not a measurement), fitting JAX's allocator share "
            f"({memory.DEFAULT_USABLE:.0%} of {DEVICES['h100-80gb'].memory_bytes / 2**30:.1f} GiB = "
            f"{usable / 2**30:.1f} GiB). This is the project's one answer to the question; beside it, the compiled "
            "plan at that batch and the analytic estimate at the same share as a cross-check.", ""]
    if not got:
        return head + ["**Not compiled yet**: `python -m deliverables.compiled_memory --target h100-80gb --only "
                       "largest-batch` (the `gpu-compile` extra) stores it.", ""]
    rows, remat = [], []
    for label, (n, at) in got.items():
        base = (at8.get(label) or {}).get("matmuls")
        cloned = at.get("rematerialised") if at else None
        rows.append([label, f"**{n}**", f"{at['total_bytes'] / 2**30:.1f}" if at else "–",
                     f"{at['matmuls']} ({base} at batch 8)" if at and base else "–",
                     "–" if cloned is None else str(cloned), str(analytic_largest(compute_of(label)))])
        if cloned:
            remat.append(f"{label} at batch {n} ({cloned} instructions)")
    out = head + [table(["setting", "largest batch (compiled)", "its total GiB", "its matmuls",
                         "its instructions XLA rematerialised", "cross-check: jaxlm.memory estimate"], rows, "lr"), ""]
    if remat:
        out += ["Near the memory limit the compiler makes room itself: XLA's rematerialisation pass clones "
                "instructions to recompute their values instead of keeping them (jaxlm asked for no remat in "
                "these rows) in " + "; ".join(remat) + ". The analytic estimate keeps every activation, so it "
                "stops earlier, and the step at the compiled batch pays the recomputation in time. The matmul count "
                "alone does not show it: XLA also splits matmuls differently at other shapes.", ""]
    return out


def compute_of(label: str) -> ComputeConfig:
    """The compute settings a largest-batch row's label names ('bfloat16 + cuDNN + remat full')."""
    kw = {"dtype": "bfloat16" if "bfloat16" in label else "float32",
          "attention": "cudnn" if "cuDNN" in label else "xla"}
    if "remat" in label or "dots_saveable" in label:
        kw["remat"] = label.rsplit(" ", 1)[-1]
    return ComputeConfig(**kw)


def training_days(device_kind: str, dtype: str) -> tuple[float, float] | None:
    """(dense peak FLOP/s, days) to train `gpt2-xl` for the course's run at MFU on one device, or None."""
    m = model("gpt2-xl")
    total = TRAIN_STEPS * (3 * TRAIN_BATCH * flops.forward_flops(m, TRAIN_CONTEXT).total + flops.adamw_flops(m))
    peak = flops.peak_flops(device_kind, dtype)
    return None if peak is None else (peak, total / (MFU * peak) / 86400)


def time_section(device: Device) -> list[str]:
    m = model("gpt2-xl")
    per_step_model = 3 * TRAIN_BATCH * flops.forward_flops(m, TRAIN_CONTEXT).total
    per_step = per_step_model + flops.adamw_flops(m)
    total = TRAIN_STEPS * per_step
    a100 = training_days("A100", "float32")
    out = ["#### (d) Training time at 50 % MFU", "",
           f"`gpt2-xl` for {TRAIN_STEPS:,} steps at batch {TRAIN_BATCH}, context {TRAIN_CONTEXT}: a step is forward + "
           f"backward (backward = 2x forward, so 3 x batch x forward = {si(per_step_model, 'FLOP')}) plus one AdamW "
           f"update ({si(flops.adamw_flops(m), 'FLOP')}, (c)), {si(per_step, 'FLOP')} in all; {TRAIN_STEPS:,} steps "
           f"make {total:.4g} FLOPs. Days = FLOPs / ({MFU:g} x peak FLOP/s) / 86,400.", "",
           f"**On one A100 (the question's device) at its float32 peak of {si(a100[0], 'FLOP/s')} (no tensor cores), "
           f"training takes {a100[1]:,.0f} days** ({a100[1] / 365.25:.1f} years). Other devices and dtypes, for "
           "comparison:", ""]
    rows = [[kind, dtype, si(found[0], "FLOP/s"), f"{found[1]:,.1f}"] for kind in dict.fromkeys(("A100", device.kind))
            for dtype in ("float32", "bfloat16") if (found := training_days(kind, dtype)) is not None]
    return out + [table(["device", "dtype", "dense peak", "days"], rows, "lr"), ""]
