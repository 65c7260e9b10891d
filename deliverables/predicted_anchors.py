"""Published GPU measurements beside jaxlm's prediction for the same configurations: the table of docs/benchmarks.md,
"How far to trust it"."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from deliverables import common
from jaxlm import cli
from jaxlm.analysis.flops import param_counts
from jaxlm.core.errors import UsageError
from jaxlm.core.files import write_between_markers
from jaxlm.predict import roofline
from jaxlm.predict.store import CompileCache, job_config
from jaxlm.predict.target import parse_target, require_compiler

STORE = Path("docs/results/compiled/anchors.json")
DOC = Path("docs/benchmarks.md")
MARKS = ("<!-- anchors: python -m deliverables.predicted_anchors -->", "<!-- /anchors -->")
# jaxlm keeps the whole AdamW state on one GPU where the FlashAttention-2 runs shard it over 8 (ZeRO-1): the train
# steps are judged against 95 % of the memory (the store's compiles' `fraction`), not JAX's default 75 %.
FRACTION = 0.95
GPT2 = ["model.vocab_size=50257", 'model.ffn="silu"', "model.tie_embeddings=true"]  # GELU's two matrices: SiLU's
# FlashAttention-2's GPT3 runs: size, its model, measured TFLOP/s per GPU, accumulation steps of 64 sequences
GPT3 = (("1.3B", ["model.num_layers=24", "model.d_model=2048", "model.num_heads=16", "model.d_ff=8192"], 196.0, 8),
        ("2.7B", ["model.num_layers=32", "model.d_model=2560", "model.num_heads=32", "model.d_ff=10240"], 205.0, 16))
FA2 = ("FlashAttention-2 (Dao 2023), Table 1: GPT-style training on 8 x A100 80GB SXM, TFLOP/s per GPU by the "
       "paper's 6 T N + 12 L d T^2 per sequence; micro-batch and accumulation of the paper's repository "
       "(training/configs/experiment/pile/gpt3xl-flash.yaml, gpt3-2.7B-flash.yaml), global batch 512")


@dataclass(frozen=True)
class Anchor:
    what: str
    gpu: str
    source: str
    measured: float
    unit: str  # "ms" (per step or call) or "TFLOP/s" (per GPU, the paper's formula)
    target: str
    sets: tuple[str, ...] = ()  # a train step's config; none: the fused attention kernel of `kernel`
    kernel: tuple[int, ...] = ()  # (batch, sequence, heads, head dim): cuDNN attention, forward, not causal


ANCHORS = (
    Anchor("fused attention forward, batch 4, sequence 8448, 16 heads of 128, not causal, bf16 (cuDNN here)",
           "H100 SXM5", "FlashAttention-3 (Shah et al. 2024), Table 2: FlashAttention-3, 3.538 ms (661 TFLOP/s); "
           "cuDNN 9.1 is slower than FlashAttention-3 from sequence 1k on (same paper, §4.1)", 3.538, "ms",
           "h100-80gb", kernel=(4, 8448, 16, 128)),
    Anchor("GPT-2 124M train step, batch 4, context 1024, float32 (TF32 matmuls), unfused attention",
           "A100 (priced as the 40GB SXM)",
           "llm.c README (karpathy/llm.c, April 2024): train_gpt2fp32cu, 'step 74/74 ... (78.009975 ms)' on the "
           "author's A100", 78.0, "ms", "a100-40gb",
           (*GPT2, "model.d_model=768", "model.num_layers=12", "model.num_heads=12", "model.d_ff=3072",
            "model.context_length=1024", "data.batch_size=4", 'compute.dtype="float32"')),
    *(Anchor(f"GPT3-{size} train step, context 2048, bf16, FlashAttention-2 (cuDNN here), micro-batch "
             f"{64 // accum} x {accum} accumulated", "A100 80GB SXM", FA2, measured, "TFLOP/s", "a100-80gb",
             (*GPT2, *model, "model.context_length=2048", "data.batch_size=64", f"train.grad_accum={accum}",
              'compute.dtype="bfloat16"', 'compute.attention="cudnn"')) for size, model, measured, accum in GPT3),
)


def kernel_ms(anchor: Anchor) -> float:
    """The predicted time of the fused attention call alone, compiled for the anchor's GPU."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxlm.nn.attention import compiling_for
    from jaxlm.predict.target import devices

    t = parse_target(anchor.target)
    gpus = devices(t)
    spec = NamedSharding(Mesh(np.array(gpus), ("d",)), PartitionSpec())
    args = [jax.ShapeDtypeStruct(anchor.kernel, "bfloat16", sharding=spec)] * 3
    attend = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))
    with compiling_for(gpus):
        text = attend.lower(*args).compile().as_text()
    return 1e3 * roofline.predict(text, roofline.device_rates(t.device)).seconds


def predicted(anchor: Anchor, store: CompileCache) -> float:
    """The prediction in the anchor's unit."""
    if anchor.kernel:
        return kernel_ms(anchor)
    job = {"preset": None, "set": list(anchor.sets), "mode": "train_step"}
    row = store.row(job, parse_target(anchor.target), log=lambda m: print(f"[anchors] {m}", flush=True),
                    predicted=True)
    if row.get("predicted_step_ms") is None:
        raise UsageError(f"{anchor.what}: {row['predicted_label']}")
    if anchor.unit == "ms":
        return row["predicted_step_ms"]
    cfg = job_config(job)
    m, t = cfg.model, cfg.model.context_length
    flops = cfg.data.batch_size * (6 * t * param_counts(m)["total"] + 12 * m.num_layers * m.d_model * t * t)
    return flops / (row["predicted_step_ms"] / 1e3) / 1e12


def error(anchor: Anchor, value: float) -> float:
    """Predicted over measured time, minus 1: a throughput's inverse."""
    return value / anchor.measured - 1 if anchor.unit == "ms" else anchor.measured / value - 1


def table(values: list[float]) -> str:
    rows = [[a.what, a.gpu, f"{a.measured:g} {a.unit}", f"{v:.3g} {a.unit}", f"{100 * error(a, v):+.0f}%", a.source]
            for a, v in zip(ANCHORS, values)]
    head = ["configuration", "GPU", "measured", "jaxlm predicts", "error (time)", "source"]
    mean = sum(abs(error(a, v)) for a, v in zip(ANCHORS, values)) / len(values)
    return (f"{common.table(head, rows, 'llrrrl')}\n\nMean absolute error of the time: {100 * mean:.0f}% over "
            f"{len(values)} anchors. Regenerate with `python -m deliverables.predicted_anchors`.")


def main(argv: list[str]) -> int:
    p = cli.ArgumentParser(command="deliverables.predicted_anchors", description=__doc__,
                           formatter_class=cli.HelpFormatter)
    p.add_argument("--out", type=Path, default=DOC, help="the page whose anchors table is rewritten (default: "
                   "%(default)s)")
    args = p.parse_args(argv)
    require_compiler()
    store = CompileCache(STORE, fraction=FRACTION)
    text = table([predicted(a, store) for a in ANCHORS])
    print(text)
    print(f"wrote {write_between_markers(args.out, text, *MARKS)}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
