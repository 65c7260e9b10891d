"""The curriculum's resource-accounting questions, answered: `python -m experiments.answers --out docs/answers.md`.

Every number comes from `jaxlm.analysis.flops` (parameters, matmul FLOPs, peak FLOP/s)
and `jaxlm.analysis.memory` (the activation model), so the answers and the MFU and memory
the benchmarks report share one convention. It lives in the lab, not the library: it is a
curriculum deliverable built on the library's analysis modules. With `--bench` the measured questions (forward / backward time with
mean and std, feed-forward vs attention time against their FLOP ratio) are read
from a `python -m jaxlm.bench model --json` result instead of being left open.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from jaxlm import cli
from jaxlm.analysis import flops, memory
from jaxlm.core.config import PRESETS, ComputeConfig, ModelConfig
from jaxlm.core.errors import DataError
from jaxlm.core.files import atomic_write, read_json

GPT2 = ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl")
CONTEXTS = (1024, 16384)
MFU = 0.5
TRAIN_STEPS, TRAIN_BATCH, TRAIN_CONTEXT = 400_000, 1024, 1024  # the course's GPT-2 XL training run


@dataclass(frozen=True)
class Device:
    name: str
    kind: str  # matched against flops.PEAK_FLOPS
    memory_bytes: float


DEVICES = {d.name: d for d in (
    Device("h100-80gb", "H100", 80e9),
    Device("h200-141gb", "H200", 141e9),
    Device("a100-80gb", "A100", 80e9),
    Device("a100-40gb", "A100", 40e9),
)}
SETTINGS = {  # how the AdamW memory question is answered: the course's float32, and the project's fast path,
    # both holding the whole logits (loss_chunk 0) as the course's accounting does, so memory is linear in the batch
    "float32, xla attention": ComputeConfig(loss_chunk=0),
    "bfloat16, fused (cuDNN) attention": ComputeConfig(dtype="bfloat16", attention="cudnn", loss_chunk=0),
}


def model(name: str, context: int = 1024) -> ModelConfig:
    return ModelConfig.from_name(name, context_length=context)


def count(n: float) -> str:
    return f"{n:,.0f}"


def si(n: float, unit: str = "") -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".strip()


def ms(v: float) -> str:
    """Milliseconds without exponents: 3 significant digits below 100, whole numbers above."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|---|" + "|".join("---:" for _ in headers[1:]) + "|",
            *("| " + " | ".join(r) + " |" for r in rows), ""]


# --------------------------------------------------------------------------- parameters and FLOPs


def parameters_section(names: list[str]) -> list[str]:
    out = ["## 1. Parameters", "",
           "Per layer: attention 4 d² (W_q, W_k, W_v, W_o), SwiGLU feed-forward 3 d d_ff, two RMSNorm gains 2 d; "
           "plus the embedding V d, the final norm d and the untied output head V d. "
           "Loading them in float32 takes 4 bytes each.", ""]
    rows = []
    for n in names:
        c, m = flops.param_counts(model(n)), model(n)
        rows.append([f"`{n}`", str(m.d_model), str(m.num_layers), str(m.num_heads), str(m.d_ff), str(m.vocab_size),
                     count(c["attention"]), count(c["ffn"]), count(c["embedding"] + c["lm_head"]), count(c["total"]),
                     si(4 * c["total"], "B")])
    return out + table(["model", "d", "layers", "heads", "d_ff", "V", "attention", "ffn", "embed + head", "total",
                        "float32"], rows)


def matmuls_section(name: str, t: int) -> list[str]:
    """The matrix multiplies of one forward, with shapes, for one sequence of t tokens."""
    m = model(name, t)
    d, f, v, n = m.d_model, m.d_ff, m.vocab_size, m.num_layers
    rows = [["q, k, v projections", f"({t}, {d}) x ({d}, {d}), 3 per layer", count(n * 3 * 2 * t * d * d)],
            ["attention scores Q Kᵀ", f"({t}, {d // m.num_heads}) x ({d // m.num_heads}, {t}) per head", count(n * 2 * t * t * d)],
            ["weighted sum softmax(.) V", f"({t}, {t}) x ({t}, {d // m.num_heads}) per head", count(n * 2 * t * t * d)],
            ["output projection", f"({t}, {d}) x ({d}, {d})", count(n * 2 * t * d * d)],
            ["W1 and W3 (gate, up)", f"({t}, {d}) x ({d}, {f}), 2 per layer", count(n * 2 * 2 * t * d * f)],
            ["W2 (down)", f"({t}, {f}) x ({f}, {d})", count(n * 2 * t * f * d)],
            ["output head", f"({t}, {d}) x ({d}, {v}), once", count(2 * t * d * v)]]
    total = flops.forward_flops(m, t).total
    return ([f"### The matrix multiplies of `{name}` (one sequence, context {t})", "",
             "A (m, k) x (k, n) product costs 2 m k n FLOPs; norms, softmax, SiLU and RoPE are not counted.", ""]
            + table(["matmul", "shape", f"FLOPs ({n} layers)"], rows)
            + [f"Total: **{count(total)}** FLOPs ({si(total, 'FLOP')}) per forward.", ""])


def shares(m: ModelConfig, t: int) -> dict[str, float]:
    f = flops.forward_flops(m, t)
    return {"attention projections": f.attention_proj / f.total, "attention core (QKᵀ, AV)": f.attention_core / f.total,
            "feed-forward": f.ffn / f.total, "output head": f.lm_head / f.total}


def flops_section(names: list[str]) -> list[str]:
    out = ["## 2. Forward FLOPs per component", "",
           "Per sequence of T tokens: attention projections n 8 T d², attention core n 4 T² d, "
           "SwiGLU n 6 T d d_ff, output head 2 T d V (n layers). Training costs 3x the forward (backward = 2x).", ""]
    for t in CONTEXTS:
        rows = []
        for n in names:
            m = model(n, t)
            f = flops.forward_flops(m, t)
            rows.append([f"`{n}`", si(f.total, "FLOP"), *(f"{100 * s:.1f}%" for s in shares(m, t).values()),
                         si(flops.train_flops_per_token(m, t), "FLOP")])
        out += [f"### Context {t}", ""]
        out += table(["model", "forward", *shares(model(names[0]), t), "train FLOPs/token"], rows)
    return out + matmuls_section("gpt2-xl", 1024) + flops_observations()


def flops_observations() -> list[str]:
    out = ["### What the numbers say", ""]
    for n in GPT2:
        s = shares(model(n), 1024)
        top = max(s, key=s.get)
        out.append(f"- `{n}` at context 1024: the {top} takes the largest share ({100 * s[top]:.1f}%); "
                   f"the attention core {100 * s['attention core (QKᵀ, AV)']:.1f}%, the output head {100 * s['output head']:.1f}%.")
    small, xl = shares(model("gpt2-small"), 1024), shares(model("gpt2-xl"), 1024)
    out.append(f"- From small to XL the output head's share falls from {100 * small['output head']:.1f}% to "
               f"{100 * xl['output head']:.1f}% and the feed-forward's rises from {100 * small['feed-forward']:.1f}% to "
               f"{100 * xl['feed-forward']:.1f}%: per-layer work grows with d² while the head grows with d only.")
    f1, f16 = (flops.forward_flops(model("gpt2-xl", t), t) for t in CONTEXTS)
    long = shares(model("gpt2-xl", 16384), 16384)
    out += [f"- `gpt2-xl` from context 1024 to 16384 (16x the tokens): one forward grows {f16.total / f1.total:.1f}x "
            f"({si(f1.total, 'FLOP')} to {si(f16.total, 'FLOP')}); the T² attention core grows 256x and its share goes "
            f"from {100 * xl['attention core (QKᵀ, AV)']:.1f}% to {100 * long['attention core (QKᵀ, AV)']:.1f}%.", ""]
    return out


# --------------------------------------------------------------------------- memory and time


def memory_terms(m: ModelConfig, t: int, compute: ComputeConfig) -> tuple[dict[str, float], float]:
    """(bytes that do not depend on the batch, by part; activation bytes per sequence). The estimate is linear in B."""
    est = memory.estimate(m, 1, t, compute)
    return dict(est.state), est.activation_total


def max_batch(fixed: float, per_seq: float, memory: float) -> int:
    return max(int(math.floor((memory - fixed) / per_seq)), 0)


def memory_section(names: list[str], device: Device) -> list[str]:
    out = ["## 3. AdamW memory and the largest batch", "",
           f"Peak bytes of a train step = parameters 4P + gradients 4P + AdamW moments (m, v) 8P + activations a·B, "
           f"with P parameters, batch B and a the bytes each sequence keeps for the backward pass (jaxlm.memory's "
           f"activation model: per layer the norm output, the residual, q, k, v, the attention scores and "
           f"probabilities, the attention output, the feed-forward's hidden activations; then the float32 logits and their gradient). "
           f"In bfloat16 the weights' bfloat16 copies add 2P. "
           f"Largest batch in {device.memory_bytes / 1e9:g} GB ({device.name}) = floor((memory - state) / a).", ""]
    for label, compute in SETTINGS.items():
        rows = []
        for n in names:
            m = model(n)
            fixed, per_seq = memory_terms(m, m.context_length, compute)
            rows.append([f"`{n}`", str(m.context_length), si(sum(fixed.values()), "B"),
                         f"{si(per_seq, 'B')} · B + {si(sum(fixed.values()), 'B')}",
                         str(max_batch(sum(fixed.values()), per_seq, device.memory_bytes))])
        out += [f"### {label}", ""] + table(["model", "context", "state (16P, or 18P in bfloat16)", "peak memory",
                                              f"largest B in {device.memory_bytes / 1e9:g} GB"], rows)
    m = model("gpt2-xl")
    fixed, per_seq = memory_terms(m, 1024, SETTINGS["float32, xla attention"])
    out += [f"For `gpt2-xl` in float32 the expression is **{per_seq / 1e9:.4g} GB · batch_size + "
            f"{sum(fixed.values()) / 1e9:.4g} GB**: " + ", ".join(f"{k} {v / 1e9:.4g} GB" for k, v in fixed.items()) + ".", ""]
    return out


def time_section(device: Device) -> list[str]:
    m = model("gpt2-xl")
    per_step_model = 3 * TRAIN_BATCH * flops.forward_flops(m, TRAIN_CONTEXT).total
    per_step = per_step_model + flops.adamw_flops(m)
    total = TRAIN_STEPS * per_step
    out = ["## 4. Training time at 50 % MFU", "",
           f"One AdamW step costs {flops.ADAMW_FLOPS_PER_PARAM} FLOPs per parameter "
           f"({si(flops.adamw_flops(m), 'FLOP')} for `gpt2-xl`), negligible next to forward + backward "
           f"(3 x batch x forward = {si(per_step_model, 'FLOP')} at batch {TRAIN_BATCH}, context {TRAIN_CONTEXT}).",
           f"`gpt2-xl` for {TRAIN_STEPS:,} steps at batch {TRAIN_BATCH}: {TRAIN_STEPS:,} x {si(per_step, 'FLOP')} = "
           f"{total:.4g} FLOPs. Days = FLOPs / ({MFU:g} x peak FLOP/s) / 86,400 on one {device.name}:", ""]
    rows = []
    for dtype in ("bfloat16", "float32"):
        peak = flops.peak_flops(device.kind, dtype)
        if peak is not None:
            rows.append([dtype, si(peak, "FLOP/s"), f"{total / (MFU * peak) / 86400:,.1f}"])
    return out + table(["dtype", "dense peak", "days"], rows)


# --------------------------------------------------------------------------- measured answers


def load_bench_file(path: Path) -> tuple[list[dict], dict]:
    """Rows and meta of a bench JSON, a run directory holding bench.json, or a bench run's result.json."""
    path = Path(path)
    if path.is_dir():
        path = next((p for p in (path / "bench.json", path / "result.json") if p.is_file()), path / "bench.json")
    if not path.is_file():
        raise DataError(f"--bench {path}: no such file; give a `jaxlm.bench model --json` file or its run directory")
    data = read_json(path, default=None)
    if isinstance(data, dict) and "bench_rows" in data:
        return list(data["bench_rows"] or []), {}
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        return data["rows"], data.get("meta") or {}
    raise DataError(f"--bench {path}: not a bench result (no 'rows' or 'bench_rows' list in it)")


def measured_section(bench: Path | None) -> list[str]:
    out = ["## 5. Measured timings", ""]
    if bench is None:
        return out + ["Not measured here: give a benchmark result with `--bench`, e.g. from "
                      "`python -m jaxlm.bench model --preset small --context 256 --batch 4 --mode forward forward_backward "
                      "--breakdown --json runs/bench.json`.", ""]
    rows, meta = load_bench_file(bench)
    ok = [r for r in rows if r.get("status") == "ok" and isinstance(r.get("step_ms"), (int, float))]
    out += [f"From `{bench}` ({len(ok)} measured rows). Mean and standard deviation over the timed steps, after warm-up.", ""]
    body = [[str(r.get(k, "–")) for k in ("framework", "mode", "dtype", "context", "batch")]
            + [ms(r["step_ms"]), ms(r["step_ms_std"]) if isinstance(r.get("step_ms_std"), (int, float)) else "–"]
            for r in ok]
    out += table(["framework", "mode", "dtype", "context", "batch", "mean (ms)", "std (ms)"], body) if body else ["No measured rows.", ""]
    out += backward_lines(ok) + breakdown_lines(meta.get("breakdown") or [])
    return out


def backward_lines(rows: list[dict]) -> list[str]:
    """Backward time = forward+backward - forward, where both modes were measured at the same setting."""
    key = lambda r: tuple(str(r.get(k)) for k in ("framework", "dtype", "attention", "remat", "context", "batch"))
    fwd = {key(r): r for r in rows if r.get("mode") == "forward"}
    out = []
    for r in rows:
        f = fwd.get(key(r))
        if r.get("mode") == "forward_backward" and f:
            b = r["step_ms"] - f["step_ms"]
            out.append(f"- {r.get('framework')} {r.get('dtype')} T={r.get('context')} B={r.get('batch')}: forward "
                       f"{ms(f['step_ms'])} ms, backward {ms(b)} ms ({b / f['step_ms']:.2f}x the forward; the FLOP count says 2x).")
    return out + [""] if out else []


def breakdown_lines(breakdowns: list[dict]) -> list[str]:
    out = []
    for bd in breakdowns:
        c = bd.get("components") or {}
        if "ffn" not in c or "attention" not in c or not c["attention"].get("forward_s"):
            continue
        t = c["ffn"]["forward_s"] / c["attention"]["forward_s"]
        fl = c["ffn"]["flops_forward"] / c["attention"]["flops_forward"]
        why = ("attention takes a larger share of the time than of the FLOPs: its softmax, masking and T x T "
               "memory traffic are not in the FLOP count" if t < fl else
               "the feed-forward takes a larger share of the time than of the FLOPs")
        out.append(f"- Feed-forward vs attention, forward, T={bd.get('context')} B={bd.get('batch')} {bd.get('dtype')}: "
                   f"time ratio {t:.2f}, FLOP ratio {fl:.2f}; {why}.")
    return out + [""] if out else []


# --------------------------------------------------------------------------- the document


def answers(device: Device, bench: Path | None = None) -> str:
    names = [*GPT2, *(n for n in PRESETS if n not in GPT2)]
    lines = ["# Resource accounting: the analytical answers", "",
             f"Generated by `python -m experiments.answers --device {device.name}"
             + (f" --bench {bench}" if bench else "") + "` from `jaxlm/analysis/flops.py` and `jaxlm/analysis/memory.py`; every number below is computed, "
             "none typed in. Models: GPT-2 small to XL as the curriculum defines them (vocabulary 50,257, "
             "untied output head, SwiGLU with the given d_ff as in [spec](spec.md)) and the project's other presets "
             "(`--preset NAME`, vocabulary 10,000).", ""]
    lines += parameters_section(names) + flops_section(names) + memory_section(names, device)
    lines += time_section(device) + measured_section(bench)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = cli.ArgumentParser(prog="python -m experiments.answers", formatter_class=cli.HelpFormatter, description=__doc__)
    p.add_argument("--device", default="h100-80gb", choices=sorted(DEVICES), help="the accelerator the memory and time answers assume")
    p.add_argument("--bench", metavar="PATH", help="a `jaxlm.bench model --json` file (or its run directory) for the measured answers")
    p.add_argument("--out", metavar="FILE", help="write the Markdown here (default: print it)")
    args = p.parse_args(argv)
    text = answers(DEVICES[args.device], Path(args.bench) if args.bench else None)
    if args.out:
        atomic_write(args.out, text)
        print(args.out)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
