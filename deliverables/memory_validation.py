"""The memory estimator (jaxlm.analysis.memory) against the compilers' plans of the same train steps, and the fit
of its GPU coefficients: docs/results/compiled/h100-80gb-validation.md says what each table compares and how to
regenerate it; docs/memory.md, "The model", the calibration."""

from __future__ import annotations

import sys
from pathlib import Path

from deliverables.common import STUDY_MODELS, table, technique
from jaxlm import cli
from jaxlm.analysis import memory
from jaxlm.analysis.flops import param_counts
from jaxlm.core.config import load_config
from jaxlm.core.files import write_between_markers
from jaxlm.nn.loss import chunk_tokens
from jaxlm.predict import compile as gpu
from jaxlm.predict.store import CompileCache, job_config
from jaxlm.predict.target import Target, parse_target, require_compiler

# (model, dtype, remat, attention, context, batch, loss chunk): four presets (vocabulary 10,000; loss chunk unset)
# across precision, remat policy and attention kernel; then every remat policy with the whole logits (0) and chunked
# (1024 tokens) at the RTX 5090 study's model (vocabulary 50,257: the logits are most of the step) and at small.
_DTYPES = ("float32", "bfloat16")
_EACH = [f"{k}{r}" for k in ("float32", "bfloat16", "bfloat16 + cuDNN")
         for r in ("", " + remat full", " + remat dots_saveable")]
_SOME = ("float32", "bfloat16", "bfloat16 + remat full", "bfloat16 + cuDNN")


def _at(preset: str, context: int, batch: int, *hows: str) -> list[tuple]:
    """Rows of one model and shape, a technique's label each (deliverables.common.technique)."""
    return [(preset, *technique(how)[:3], context, batch, None) for how in hows]


ROWS = (
    *_at("tinystories-17M", 256, 64, *_EACH), *_at("tinystories-17M", 512, 16, "bfloat16", "bfloat16 + cuDNN"),
    *_at("small", 1024, 8, *_EACH), *_at("small", 256, 32, *_SOME),
    *_at("small", 2048, 2, "bfloat16", "bfloat16 + cuDNN"),
    *_at("medium", 1024, 4, *_SOME[:3], "bfloat16 + remat dots_saveable", "bfloat16 + cuDNN",
         "bfloat16 + cuDNN + remat full"),
    *_at("large", 1024, 2, *_SOME),
    *(("rtx5090", d, r, "xla", 256, b, c) for r in ("full", "offload") for c in (0, 1024) for d in _DTYPES
      for b in (32, 64, 128)),
    *(("rtx5090", d, r, "xla", 256, 64, c) for r in ("none", "dots_saveable") for c in (0, 1024) for d in _DTYPES),
    *(("small", d, r, "xla", 1024, 8, c) for r, c in (("offload", None), ("offload", 1024), ("full", 1024),
                                                       ("none", 1024), ("dots_saveable", 1024)) for d in _DTYPES),
    *(("rtx5090", "bfloat16", "offload", "cudnn", 256, 64, c) for c in (0, 1024)),  # offload's fused-kernel term
    ("small", "bfloat16", "offload", "cudnn", 1024, 8, None),
)
FIELDS = ("preset", "dtype", "remat", "attention", "context", "batch", "loss_chunk")
GPU_MARKS = ("<!-- gpu validation table: begin -->", "<!-- gpu validation table: end -->")


def validation_job(preset: str, dtype: str, remat: str, attention: str, context: int, batch: int,
                   loss_chunk: int | None = None) -> dict:
    """The compile job of a row: a preset, or one of STUDY_MODELS (its keys after the row's, as in
    deliverables/compiled_memory.py, so both share the stored figures)."""
    extra = [*STUDY_MODELS.get(preset, []), *([f"compute.loss_chunk={loss_chunk}"] if loss_chunk is not None else [])]
    return {"preset": None if preset in STUDY_MODELS else preset,
            "set": [f"model.context_length={context}", f"data.batch_size={batch}", f'compute.dtype="{dtype}"',
                    f'compute.remat="{remat}"', f'compute.attention="{attention}"', *extra], "mode": "train_step"}


def with_estimates(rows: list[dict]) -> list[dict]:
    """Each row with the estimator's total and its error against the compiled total."""
    out = []
    for r in rows:
        cfg = job_config(validation_job(*(r[f] for f in FIELDS)))
        est = memory.estimate(cfg.model, r["batch"], r["context"], cfg.compute, "train_step")
        out.append({**r, "estimate_bytes": est.total, "estimate_state": est.state_total,
                    "loss_chunk": chunk_tokens(cfg.compute, cfg.model.vocab_size),
                    "error": est.total / r["total_bytes"] - 1})
    return out


def page(head: list[str], rows: list[list], align: str, errors: list[float], where: str) -> str:
    """A validation table and the line under it: how far the estimates are from what they are checked against."""
    errs = [abs(e) for e in errors]
    return (f"{table(head, rows, align)}\n\n{len(rows)} rows; mean absolute error {100 * sum(errs) / len(errs):.1f}%, "
            f"largest {100 * max(errs):.1f}%; {sum(e <= 0.10 for e in errs)} of {len(rows)} within 10%. {where}.")


def validate(target_name: str, cache: Path | None, first: int | None = None) -> str:
    """The GPU table: each row compiled for the target (from `cache` where stored, and saved there as they come)."""
    import jax

    target = parse_target(target_name)
    require_compiler()
    store = CompileCache(cache)
    rows = with_estimates([{**dict(zip(FIELDS, spec)), **store.row(validation_job(*spec), target, print)}
                           for spec in ROWS[:first]])
    gib = lambda x: f"{x / 2**30:.2f}"  # noqa: E731
    return page(["model", "dtype", "remat", "attention", "context", "batch", "loss chunk", "estimate GiB",
                 "compiled GiB", "error", "compiled temp GiB", "matmuls", "cuDNN calls"],
                [[r["preset"], r["dtype"], r["remat"], r["attention"], r["context"], r["batch"], r["loss_chunk"],
                  gib(r["estimate_bytes"]), gib(r["total_bytes"]), f"{100 * r['error']:+.1f}%", gib(r["temp_bytes"]),
                  r["matmuls"], r["cudnn_attention_calls"]] for r in rows], "llllr", [r["error"] for r in rows],
                f"{rows[0]['label']}, on a CPU-only machine, jax {jax.__version__}")


# --------------------------------------------------------------------------- calibration of the estimator

# Two-layer probes, one dimension changed at a time from each base (widths, heads, vocabulary, context, batch):
# the estimator's GPU coefficients (jaxlm.analysis.memory.GPU_BYTES) are fitted on these, never on ROWS.
_TINY = dict(num_layers=2, d_model=256, num_heads=4, d_ff=1024, vocab_size=1024, context_length=256, batch=8)
_MID = dict(num_layers=2, d_model=768, num_heads=12, d_ff=3072, vocab_size=10000, context_length=1024, batch=2)
PROBES = [
    *({**_TINY, **v} for v in ({}, dict(batch=16), dict(num_layers=4), dict(context_length=512, batch=4),
                               dict(vocab_size=4096), dict(d_ff=2048), dict(d_model=512, num_heads=8))),
    *({**_MID, **v} for v in ({}, dict(batch=4), dict(num_layers=4), dict(context_length=2048, batch=1),
                              dict(vocab_size=20000), dict(context_length=256, batch=16), dict(num_heads=24))),
]
CLASSES = [(d, r, a) for d in ("float32", "bfloat16") for r in ("none", "full", "dots_saveable")
           for a in ("xla", "cudnn") if not (d == "float32" and a == "cudnn")]


def probe_job(probe: dict, dtype: str, remat: str, attention: str) -> dict:
    sets = [f"model.{k}={v}" for k, v in probe.items() if k != "batch"]
    return {"preset": None, "mode": "train_step", "set": [*sets, f"data.batch_size={probe['batch']}",
            f'compute.dtype="{dtype}"', f'compute.remat="{remat}"', f'compute.attention="{attention}"']}


def calibrate(target: Target, cache: Path | None, log=print) -> dict:
    """Non-negative least-squares fit (relative errors) of each class's GPU_BYTES row on the compiled probes'
    temp bytes: the activation features of jaxlm.analysis.memory.gpu_features, and the parameter count
    (gradients and weight copies). The rows price the blocks' backward; the loss's backward (HEAD_BYTES) and
    offload's from_host are not fitted."""
    import numpy as np
    from scipy.optimize import nnls  # scipy comes with jax

    store, out = CompileCache(cache), {}
    for dtype, remat, attention in CLASSES:
        X, y = [], []
        for probe in PROBES:
            j = probe_job(probe, dtype, remat, attention)
            cfg = job_config(j)
            X.append([*memory.gpu_features(cfg.model, probe["batch"], cfg.model.context_length, remat),
                      param_counts(cfg.model)["total"]])
            y.append(store.row(j, target, log)["temp_bytes"])
        X, y = np.array(X, float), np.array(y, float)
        if attention == "cudnn":
            X[:, 2] = 0.0  # no T x T tensor
        coef, _ = nnls(X / y[:, None], np.ones_like(y))
        key = (dtype, remat, attention == "cudnn")
        out[key] = tuple(round(float(c), 2) for c in coef)
        log(f"{key}: {out[key]}, largest probe error {100 * np.max(np.abs(X @ coef / y - 1)):.1f}%")
    return out


# --------------------------------------------------------------------------- against XLA:CPU (float32)

# (d_model, num_layers, num_heads, vocab_size, context, batch): float32 train steps without remat, where
# XLA:CPU's memory_analysis() is faithful; head size 64 as in the presets, except where noted by the shape.
CPU_ROWS = (
    (256, 4, 4, 1000, 128, 4), (256, 4, 4, 1000, 256, 4), (256, 4, 4, 1000, 512, 2), (256, 8, 4, 1000, 128, 8),
    (512, 4, 8, 1000, 256, 4), (512, 4, 8, 10000, 128, 4), (384, 6, 6, 5000, 256, 4), (512, 2, 8, 10000, 256, 2),
    (256, 4, 4, 10000, 128, 16), (128, 4, 2, 1000, 256, 8), (512, 8, 8, 10000, 512, 1), (768, 2, 12, 10000, 256, 2),
    (256, 4, 4, 4000, 1024, 1), (384, 4, 6, 2000, 128, 8),
)
CPU_MARKS = ("<!-- validation table: begin -->", "<!-- validation table: end -->")


def cpu_row(d: int, layers: int, heads: int, vocab: int, context: int, batch: int, mode: str = "train_step") -> dict:
    """One row: the estimator's peak against memory_analysis() of training's step compiled for this machine's
    backend (temp + arguments + outputs - aliased), float32, xla attention, no remat."""
    import jax

    cfg = load_config(None, [f"model.d_model={d}", f"model.num_layers={layers}", f"model.num_heads={heads}",
                             f"model.vocab_size={vocab}", f"model.context_length={context}",
                             f"data.batch_size={batch}"])
    measured = memory.compiled_memory(gpu.lower_on(cfg, jax.devices()[:1], mode).compile()).total
    est = memory.estimate(cfg.model, batch, context, cfg.compute, mode, backend="cpu").total
    return dict(d_model=d, layers=layers, heads=heads, vocab=vocab, context=context, batch=batch, mode=mode,
                estimate_bytes=est, measured_bytes=measured, error=est / measured - 1)


def cpu_validate(first: int | None) -> str:
    """The XLA:CPU table, a line of progress per row."""
    import jax

    mib = lambda x: f"{x / 2**20:.1f}"  # noqa: E731
    rows = []
    for i, shape in enumerate(CPU_ROWS[:first]):
        rows.append(r := cpu_row(*shape))
        print(f"[{i + 1}/{len(CPU_ROWS[:first])}] {shape}: estimate {mib(r['estimate_bytes'])} MiB, "
              f"memory_analysis {mib(r['measured_bytes'])} MiB ({100 * r['error']:+.1f}%)", flush=True)
    return page(["d_model", "layers", "heads", "vocab", "context", "batch", "estimate MiB", "memory_analysis MiB",
                 "error"], [[r["d_model"], r["layers"], r["heads"], r["vocab"], r["context"], r["batch"],
                             mib(r["estimate_bytes"]), mib(r["measured_bytes"]), f"{100 * r['error']:+.1f}%"]
                            for r in rows], "r", [r["error"] for r in rows],
                f"Measured with jax {jax.__version__} on {jax.devices()[0].platform}")


def main(argv: list[str]) -> int:
    p = cli.ArgumentParser(command="deliverables.memory_validation", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--out", type=Path, help="write the table into this Markdown file, between its markers")
    p.add_argument("--rows", type=cli.bounded(int, 1), help="first N rows only (default: all)")
    p.add_argument("--target", metavar="GPU", help="compile for this GPU (the gpu-compile extra): h100-80gb, ...; "
                   "without it, for this machine's backend")
    p.add_argument("--cache", type=Path, metavar="JSON", help="with --target: keep the compiled figures here "
                   "and reuse them (per row, target and jax version)")
    p.add_argument("--calibrate", action="store_true", help="with --target: fit the estimator's GPU_BYTES on "
                   "compiled two-layer probes (PROBES) and print them")
    args = p.parse_args(argv)
    if args.target and args.calibrate:
        fitted = calibrate(parse_target(args.target), args.cache)
        print("GPU_BYTES = {\n" + "".join(f"    {k}: {v},\n" for k, v in fitted.items()) + "}")
        return 0
    text = validate(args.target, args.cache, args.rows) if args.target else cpu_validate(args.rows)
    if args.out:
        write_between_markers(args.out, text, *(GPU_MARKS if args.target else CPU_MARKS))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
