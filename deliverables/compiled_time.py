"""The curriculum's GPU time questions answered from XLA's GPU program, on any machine: the page
docs/results/compiled/TARGET-time.md, from the store it shares with deliverables.compiled_memory (docs/benchmarks.md,
"Predicted GPU time")."""

from __future__ import annotations

import sys
from pathlib import Path

from deliverables.compiled_memory import BATCHES, GIB, LOSSES, OUT_DIR, SWEPT, Section, cached, job, write_page
from jaxlm import cli
from jaxlm.predict.roofline import PRICING_VERSION
from jaxlm.predict.target import Target

SIZES = ("small", "medium", "large", "xl", "2.7B")  # the benchmarking script's model sizes
SIZE_CONTEXT, SIZE_BATCH = 512, 4  # its setting (experiments/plans/benchmarking.toml), float32
NSYS_PRESETS, NSYS_CONTEXTS = ("small", "large"), (128, 256, 512, 1024)  # nsys_profile's models and contexts
# The techniques of the predicted-time table in docs/benchmarks.md (labels as deliverables.compiled_memory.technique
# reads them), with the configuration's window.
TECHNIQUES = ("float32", "bfloat16", "bfloat16 + cuDNN", "bfloat16 + cuDNN + window {w}", "float32 + remat full")
REMAT = ("bfloat16 + remat full", "bfloat16 + cuDNN + remat full")  # beside the techniques, for `small` only
SHARES = ("matmul", "attention", "softmax/normalisation", "loss", "other elementwise", "optimizer update", "copies")
STEPS = ("forward", "train_step")


def sections() -> list[Section]:
    """The page's tables, in order (deliverables/pages/compiled_time.md says what each holds)."""
    return [
        Section("techniques-small", [(how, job("small", 1024, 8, how))
                                     for how in (*(t.format(w=256) for t in TECHNIQUES), *REMAT)]),
        Section("rtx5090", [(f"{how}, batch {b}", job("rtx5090", 256, b, how, loss_chunk=0))
                            for b in (32, 64, 128) for how in (t.format(w=32) for t in TECHNIQUES)]),
        Section("sizes", [(f"{preset}, {mode}", job(preset, SIZE_CONTEXT, SIZE_BATCH, "float32", mode=mode))
                          for preset in SIZES for mode in STEPS]),
        Section("mixed-precision", [(f"{mode}, {d}", job("small", 512, 8, d, mode=mode))
                                    for mode in STEPS for d in ("float32", "bfloat16")]),
        Section("batch", [(f"{how}, batch {b}", job("small", 256, b, how)) for how in SWEPT for b in BATCHES]),
        Section("nsys", [(f"{preset}, {mode}, context {t}", job(preset, t, SIZE_BATCH, "float32", mode=mode))
                         for preset in NSYS_PRESETS for t in NSYS_CONTEXTS for mode in STEPS]),
        Section("chunk", [(f"{d}, {loss}, batch 128", job("rtx5090", 256, 128, d, loss_chunk=c))
                          for d in ("float32", "bfloat16") for loss, c in LOSSES]),
    ]


def stored(section: str, target_name: str, out_dir: Path = OUT_DIR) -> dict[str, dict]:
    """label -> the stored figures (with a prediction) of a section's rows; none compiled here."""
    rows = cached(section, target_name, out_dir, sections)
    return {label: r for label, r in rows.items() if r.get("predicted_step_ms")}


def fields(target: Target) -> dict[str, str]:
    """The template's fields besides the tables."""
    return {"description": target.description, "predicted_label": target.predicted_label, "name": target.name,
            "pricing": str(PRICING_VERSION), "size_context": str(SIZE_CONTEXT), "size_batch": str(SIZE_BATCH)}


def columns(section: Section, rows: list[dict]):
    """The section's table head, and the cells of a row that did not fail."""
    head = ["setting", "matmuls", "predicted ms", "predicted tokens/s", "predicted MFU", *SHARES, "compiled GiB"]

    def cells(r: dict) -> list[str]:
        first = [r["setting"], r.get("matmul_precision") or "-"]
        gib = f"{r['total_bytes'] / GIB:.2f}"
        if r.get("predicted_step_ms") is None:  # a step that does not fit: its label says so
            return [*first, r["predicted_label"], *["-"] * (2 + len(SHARES)), gib]
        share = {g["group"]: g["share"] for g in r.get("predicted_groups", [])}  # of each kernel group
        return [*first, f"{r['predicted_step_ms']:.1f}", f"{r['predicted_tokens_per_s']:,.0f}",
                f"{100 * r['predicted_mfu']:.0f}%", *(f"{100 * share.get(g, 0):.0f}%" for g in SHARES), gib]

    return head, cells


def main(argv: list[str]) -> int:
    return write_page(argv, __spec__.name, __doc__, sections, fields, columns, predicted=True)


if __name__ == "__main__":
    sys.exit(cli.run(main))
