"""transformer_accounting and adamwAccounting, from `jaxlm.analysis` and the compiled store (docs/report.md)."""

from __future__ import annotations

import math
from pathlib import Path

from deliverables.answers import prose
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
LARGEST_COMMAND = "python -m deliverables.compiled_memory --target h100-80gb --only largest-batch"
SETTINGS = {  # how the AdamW memory question is answered: the course's float32, and the project's fast path,
    # both holding the whole logits (loss_chunk 0) as the course's accounting does, so memory is linear in the batch
    "float32, xla attention": ComputeConfig(loss_chunk=0),
    "bfloat16, fused (cuDNN) attention": ComputeConfig(dtype="bfloat16", attention="cudnn", loss_chunk=0),
}


def model(name: str, context: int = 1024) -> ModelConfig:
    return ModelConfig.from_name(name, context_length=context)


def parameters_section(names: list[str]) -> list[str]:
    rows = []
    for n in names:
        c, m = flops.param_counts(model(n)), model(n)
        rows.append([f"`{n}`", str(m.d_model), str(m.num_layers), str(m.num_heads), str(m.d_ff), str(m.vocab_size),
                     count(c["attention"]), count(c["ffn"]), count(c["embedding"] + c["lm_head"]), count(c["total"]),
                     si(4 * c["total"], "B")])
    return prose("parameters", table=table(["model", "d", "layers", "heads", "d_ff", "V", "attention", "ffn",
                                            "embed + head", "total", "float32"], rows, "lr"))


def matmul_rows(m: ModelConfig, t: int) -> list[list[str]]:
    """The matrix multiplies of one forward, with shapes, for one sequence of t tokens."""
    d, f, v, n = m.d_model, m.d_ff, m.vocab_size, m.num_layers
    return [["q, k, v projections", f"({t}, {d}) x ({d}, {d}), 3 per layer", count(n * 3 * 2 * t * d * d)],
            ["attention scores Q Kᵀ", f"({t}, {d // m.num_heads}) x ({d // m.num_heads}, {t}) per head",
             count(n * 2 * t * t * d)],
            ["weighted sum softmax(.) V", f"({t}, {t}) x ({t}, {d // m.num_heads}) per head", count(n * 2 * t * t * d)],
            ["output projection", f"({t}, {d}) x ({d}, {d})", count(n * 2 * t * d * d)],
            ["W1 and W3 (gate, up)", f"({t}, {d}) x ({d}, {f}), 2 per layer", count(n * 2 * 2 * t * d * f)],
            ["W2 (down)", f"({t}, {f}) x ({f}, {d})", count(n * 2 * t * f * d)],
            ["output head", f"({t}, {d}) x ({d}, {v}), once", count(2 * t * d * v)]]


SHARES = {"proj": "attention projections", "core": "attention core (QKᵀ, AV)", "ffn": "feed-forward",
          "head": "output head"}  # the forward's parts, by the names the template uses


def shares(name: str, t: int = 1024) -> dict[str, float]:
    f = flops.forward_flops(model(name, t), t)
    return {"proj": f.attention_proj / f.total, "core": f.attention_core / f.total, "ffn": f.ffn / f.total,
            "head": f.lm_head / f.total}


def flops_section(names: list[str]) -> list[str]:
    """(c)-(e) the forward's FLOPs by component at each context, (b) `gpt2-xl`'s matmuls, and what they say."""
    tables = []
    for t in CONTEXTS:
        rows = [[f"`{n}`", si(flops.forward_flops(model(n, t), t).total, "FLOP"),
                 *(f"{100 * s:.1f}%" for s in shares(n, t).values()),
                 si(flops.train_flops_per_token(model(n, t), t), "FLOP")] for n in names]
        tables += [f"##### Context {t}", "", table(["model", "forward", *SHARES.values(), "train FLOPs/token"],
                                                   rows, "lr"), ""]
    largest = []
    for n in GPT2:
        s = shares(n)
        top = max(s, key=s.get)
        largest.append(f"- `{n}` at context 1024: the {SHARES[top]} takes the largest share ({100 * s[top]:.1f}%); "
                       f"the attention core {100 * s['core']:.1f}%, the output head {100 * s['head']:.1f}%.")
    f1, f16 = (flops.forward_flops(model("gpt2-xl", t), t) for t in CONTEXTS)
    xl = model("gpt2-xl")
    matmuls = table(["matmul", "shape", f"FLOPs ({xl.num_layers} layers)"], matmul_rows(xl, 1024), "lr")
    return prose("flops", tables=tables, matmuls=matmuls, total=count(f1.total),
                 total_si=si(f1.total, "FLOP"), largest=largest, small=shares("gpt2-small"),
                 xl=shares("gpt2-xl"), xl_long=shares("gpt2-xl", 16384), growth=f16.total / f1.total,
                 long_si=si(f16.total, "FLOP"))


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
    """adamwAccounting (a)-(c); the training time, (d), is time_section."""
    m = model("gpt2-xl")
    a, b = peak_terms(m, m.context_length)
    rows = [[k, count(v), si(FLOAT32 * v, "B")] for k, v in activation_floats(m, m.context_length).items()]
    terms = [[f"`{term}`", ops, str(n)] for term, ops, n in flops.ADAMW_TERMS]
    total = flops.ADAMW_FLOPS_PER_PARAM
    return prose("adamw", m=m, activations=table(["activation", "floats per sequence", "float32 bytes"], rows, "lr"),
                 a=a / 1e9, b=b / 1e9, params=count(b // 16), memory=COURSE_MEMORY / 1e9,
                 batch=max_batch(b, a, COURSE_MEMORY), terms=table(["update", "operations", "FLOPs"], terms, "lr"),
                 total=total, xl_flops=si(total * flops.param_counts(m)["total"], "FLOP"),
                 adam=total - flops.ADAMW_TERMS[-1][2])


def memory_terms(m: ModelConfig, t: int, compute: ComputeConfig) -> tuple[dict[str, float], float]:
    """(state bytes by part, activation bytes per sequence) by the tensor-counting model (calibration "cpu"), the
    curriculum's accounting: 16P of state plus what jax.grad saves, linear in the batch (docs/memory.md)."""
    est = memory.estimate(m, 1, t, compute, backend="cpu")
    return dict(est.state), est.activation_total


def max_batch(fixed: float, per_seq: float, memory: float) -> int:
    return max(int(math.floor((memory - fixed) / per_seq)), 0)


def memory_section(names: list[str], root: Path) -> list[str]:
    """The largest batch of `small` on an H100 by compiling, then the cross-check by jaxlm's activation model."""
    tables = []
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
        tables += [f"##### {label}", "", table(head, rows, "lr"), ""]
    fixed, per_seq = memory_terms(model("gpt2-xl"), 1024, SETTINGS["float32, xla attention"])
    return compiled_largest_section(root) + prose(
        "cross_check", memory=COURSE_MEMORY / 1e9, tables=tables, per_seq=per_seq / 1e9,
        state=sum(fixed.values()) / 1e9, parts=", ".join(f"{k} {v / 1e9:.4g} GB" for k, v in fixed.items()))


def analytic_largest(compute: ComputeConfig) -> int:
    """The same question by jaxlm.memory's GPU-calibrated estimate at the same usable share: the cross-check."""
    usable = DEVICES["h100-80gb"].memory_bytes * memory.DEFAULT_USABLE
    return memory.largest_batch(model("small"), 1024, usable, compute)


def compiled_largest_section(root: Path) -> list[str]:
    """The largest batch of `small` at context 1024 on an H100, by compiling; jaxlm.memory's estimate beside it."""
    got = cached_at_largest("largest-batch", "h100-80gb", root / "compiled")
    at8 = cached("largest-batch", "h100-80gb", root / "compiled")
    rows, cloned_at = [], []
    for label, (n, at) in got.items():
        base = (at8.get(label) or {}).get("matmuls")
        cloned = at.get("rematerialised") if at else None
        rows.append([label, f"**{n}**", f"{at['total_bytes'] / 2**30:.1f}" if at else "–",
                     f"{at['matmuls']} ({base} at batch 8)" if at and base else "–",
                     "–" if cloned is None else str(cloned), str(analytic_largest(compute_of(label)))])
        if cloned:
            cloned_at.append(f"{label} at batch {n} ({cloned} instructions)")
    head = ["setting", "largest batch (compiled)", "its total GiB", "its matmuls",
            "its instructions XLA rematerialised", "cross-check: jaxlm.memory estimate"]
    found = table(head, rows, "lr") if got else prose("not_compiled", command=LARGEST_COMMAND, does="stores it")
    remat = prose("remat", cloned="; ".join(cloned_at)) if cloned_at else []
    usable = DEVICES["h100-80gb"].memory_bytes * memory.DEFAULT_USABLE
    return prose("largest_batch", share=memory.DEFAULT_USABLE, memory=DEVICES["h100-80gb"].memory_bytes / 2**30,
                 usable=usable / 2**30, table=found, remat=remat)


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
    fwd_bwd, update = 3 * TRAIN_BATCH * flops.forward_flops(m, TRAIN_CONTEXT).total, flops.adamw_flops(m)
    a100_peak, a100_days = training_days("A100", "float32")
    rows = [[kind, dtype, si(found[0], "FLOP/s"), f"{found[1]:,.1f}"] for kind in dict.fromkeys(("A100", device.kind))
            for dtype in ("float32", "bfloat16") if (found := training_days(kind, dtype)) is not None]
    return prose("time", steps=TRAIN_STEPS, batch=TRAIN_BATCH, context=TRAIN_CONTEXT, model_flops=si(fwd_bwd, "FLOP"),
                 adamw_flops=si(update, "FLOP"), step_flops=si(fwd_bwd + update, "FLOP"),
                 total=TRAIN_STEPS * (fwd_bwd + update), mfu=MFU, a100_peak=si(a100_peak, "FLOP/s"),
                 a100_days=a100_days, a100_years=a100_days / 365.25,
                 table=table(["device", "dtype", "dense peak", "days"], rows, "lr"))
