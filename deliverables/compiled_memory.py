"""The curriculum's GPU memory questions answered by XLA's GPU compiler, on any machine: the page
docs/results/compiled/TARGET-memory.md, from the store TARGET.json (docs/memory.md, "Compiling for a GPU without one").
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from deliverables.common import render, table, technique
from deliverables.memory_validation import validation_job
from jaxlm import cli
from jaxlm.analysis.memory import DEFAULT_USABLE
from jaxlm.core.errors import UserError
from jaxlm.predict.store import CompileCache
from jaxlm.predict.target import Target, parse_target, require_compiler

OUT_DIR = Path("docs/results/compiled")
GIB = 2**30
LOSSES = (("whole logits", 0), ("chunked", 1024))  # compute.loss_chunk, labelled
CONTEXTS, BATCHES = (256, 512, 1024, 2048), (1, 2, 4, 8, 16, 32, 64)  # the sweeps of `small` (figures 1 and 2)
SWEPT = ("float32", "bfloat16", "bfloat16 + cuDNN")  # the techniques the context and batch sweeps draw as lines
# The memory techniques, alone and combined; each label names its settings (deliverables.common.technique).
TECHNIQUES = ("float32", "bfloat16", "bfloat16 + remat full", "bfloat16 + remat dots_saveable", "bfloat16 + cuDNN",
              "bfloat16 + cuDNN + remat full", "bfloat16 + cuDNN + dots_saveable", "bfloat16 + window 256",
              "bfloat16 + cuDNN + window 256")


def job(preset=None, context=1024, batch=8, how="bfloat16", mode="train_step", loss_chunk=None, extra=()) -> dict:
    """The compile job of technique `how` (a preset or one of STUDY_MODELS); without a window or extra keys, the
    validation's job (and cache entry)."""
    dtype, remat, attention, window = technique(how)
    j = validation_job(preset, dtype, remat, attention, context, batch, loss_chunk)
    j["set"] += [*extra, *([f"model.window={window}"] if window else [])]
    return {**j, "mode": mode}


@dataclass
class Section:
    """One table of a page, {name} in its template (deliverables/pages/): rows of (label, job); `reference` (a
    label) adds each row's reduction against it."""

    name: str
    rows: list[tuple[str, dict]]
    reference: str | None = None
    largest: bool = False  # also the largest batch that fits, by compiling


def sections() -> list[Section]:
    """The page's tables, in order."""
    return [
        Section("rtx5090", [(f"{how}, batch {b}", job("rtx5090", 256, b, how, loss_chunk=0)) for b in (32, 64, 128)
                            for how in ("float32", "bfloat16", "bfloat16 + cuDNN", "bfloat16 + cuDNN + window 16",
                                        "bfloat16 + cuDNN + window 32", "float32 + remat full")],
                reference="float32, batch {b}"),
        Section("loss-chunk", [(f"{how}, {loss}, batch {b}", job("rtx5090", 256, b, how, loss_chunk=c))
                               for b in (32, 64, 128)
                               for how in ("float32", "bfloat16", "bfloat16 + cuDNN", "bfloat16 + remat full")
                               for loss, c in LOSSES],
                reference="float32, whole logits, batch {b}"),
        Section("loss-chunk-presets",
                [(f"{preset}, {loss}", job(preset, 1024, batch, extra=["model.vocab_size=50257",
                                                                       f"compute.loss_chunk={c}"]))
                 for preset, batch in (("small", 8), ("large", 2)) for loss, c in LOSSES],
                reference="{p}, whole logits"),
        *(Section(f"techniques-{preset}", [(how, job(preset, 1024, batch, how)) for how in TECHNIQUES],
                  reference="float32") for preset, batch in (("small", 8), ("large", 2))),
        Section("context", [(f"{mode}, {how}, context {t}", job("small", t, 8, how, mode=mode))
                            for mode in ("train_step", "forward") for how in SWEPT for t in CONTEXTS]),
        Section("batch", [(f"{how}, batch {b}", job("small", 256, b, how)) for how in SWEPT for b in BATCHES]),
        Section("mixed-precision", [(f"{mode}, {d}", job("small", 512, 8, d, mode=mode))
                                    for mode in ("forward", "train_step") for d in ("float32", "bfloat16")]),
        Section("largest-batch", [(how, job("small", 1024, 8, how)) for how in TECHNIQUES[:6]], largest=True),
        Section("2_7B", [(f"{mode}, {d}, context {t}", job("2.7B", t, 4, d, mode=mode))
                         for mode in ("forward", "train_step") for d in ("float32", "bfloat16")
                         for t in (128, 256, 512)]),
    ]


def figures(section: Section, target: Target, store: CompileCache, compile: bool = True,
            predicted: bool = False) -> list[dict]:
    """The section's rows: compiled now, or (compile=False) only those already in the store; `predicted`: with the
    predicted time (a stored figure without one is compiled again). A `largest` section's rows add the largest
    batch that fits ('largest_batch', None where not searched) and its figures ('at_largest', {} where not
    compiled)."""
    log = lambda m: print(f"[{section.name}] {m}", flush=True)  # noqa: E731
    rows = []
    for label, j in section.rows:
        stale = predicted and "predicted_step_ms" not in store.stored.get(store.key(j, target), {})
        if not compile and (not store.has(j, target) or stale):
            rows.append({"setting": label, "error": f"not compiled yet (--only {section.name})"})
            continue
        try:
            r = {**store.row(j, target, log=log, predicted=predicted), "setting": label}
        except UserError as e:  # a setting the compiler or the config refuses: a row that says so
            r = {"setting": label, "error": str(e).splitlines()[0][:160]}
        if section.largest and "error" not in r:
            n = store.largest(j, target) if compile else store.stored.get(
                store.key({**j, "search": "largest_batch"}, target), {}).get("largest_batch")
            at = {**j, "set": [f"data.batch_size={n}" if s.startswith("data.batch_size=") else s for s in j["set"]]}
            found = n is not None and (compile or store.has(at, target))
            r["largest_batch"], r["at_largest"] = n, store.row(at, target, log=log) if found else {}
        rows.append(r)
    return rows


def cached(section: str, target_name: str, out_dir: Path = OUT_DIR, all_sections=sections) -> dict[str, dict]:
    """label -> compiled figures of a section's rows (one of `all_sections()`) already stored (none compiled here),
    as `figures` gives them."""
    store = CompileCache(Path(out_dir) / f"{target_name}.json")
    s = next(s for s in all_sections() if s.name == section)
    return {r["setting"]: r for r in figures(s, parse_target(target_name), store, compile=False) if "error" not in r}


def cached_at_largest(section: str, target_name: str, out_dir: Path = OUT_DIR) -> dict[str, tuple[int, dict]]:
    """label -> (the largest batch that fits, the compiled figures at that batch or {}) of a `largest` section's
    rows already searched in OUT_DIR/TARGET.json."""
    rows = cached(section, target_name, out_dir).items()
    return {label: (r["largest_batch"], r["at_largest"]) for label, r in rows if r["largest_batch"] is not None}


def columns(section: Section, rows: list[dict]):
    """The section's table head, and the cells of a row that did not fail."""
    by_label = {r["setting"]: r for r in rows}
    head = ["setting", "total GiB", "temp GiB", "arguments GiB", "matmuls", "cuDNN calls",
            *(["vs reference"] if section.reference else []),
            *(["largest batch", "its total GiB", "its matmuls", "its XLA remat clones"] if section.largest else [])]

    def cells(r: dict) -> list[str]:
        cells = [r["setting"], f"{r['total_bytes'] / GIB:.2f}", f"{r['temp_bytes'] / GIB:.2f}",
                 f"{r['argument_bytes'] / GIB:.2f}", str(r["matmuls"]), str(r["cudnn_attention_calls"])]
        if section.reference:
            batch, preset = r["setting"].rsplit("batch ", 1)[-1], r["setting"].split(",")[0]
            ref = by_label.get(section.reference.format(b=batch, p=preset))
            cells.append(f"{100 * (r['total_bytes'] / ref['total_bytes'] - 1):+.0f}%" if ref and "error" not in ref
                         else "-")
        if not section.largest:
            return cells
        at = r.get("at_largest") or {}
        return cells + [r["largest_batch"], f"{at['total_bytes'] / GIB:.2f}" if at else "-",
                        str(at.get("matmuls", "-")), str(at.get("rematerialised", "-"))]

    return head, cells


def fields(target: Target) -> dict[str, str]:
    """The template's fields besides the tables."""
    import jax

    return {"description": target.description, "label": target.label, "jax": jax.__version__, "name": target.name,
            "usable": f"{DEFAULT_USABLE}", "memory_gib": f"{target.memory_bytes / GIB:.1f}",
            "usable_gib": f"{DEFAULT_USABLE * target.memory_bytes / GIB:.1f}"}


def write_page(argv: list[str], module: str, doc: str, all_sections, fields, columns, predicted: bool = False) -> int:
    """The command of this module and of deliverables.compiled_time (`module`, compiled_NAME): compile
    `all_sections()` (the --only ones; the rest from the store) for --target and write the page,
    docs/results/compiled/TARGET-NAME.md: the module's template in deliverables/pages/ with `fields(target)` and
    each section's table (`columns(section, rows)`; a row that failed says why)."""
    names, name = [s.name for s in all_sections()], module.rpartition("_")[2]
    p = cli.ArgumentParser(command=module, description=doc, formatter_class=cli.HelpFormatter)
    p.add_argument("--target", default="h100-80gb", help="the GPU to compile for (jaxlm.analysis.devices.TARGETS)")
    p.add_argument("--only", nargs="+", choices=names, metavar="SECTION", help=f"these sections: {', '.join(names)}")
    p.add_argument("--out", type=Path, help=f"the page (default: docs/results/compiled/TARGET-{name}.md)")
    p.add_argument("--cache", type=Path, help="the compiled figures (default: docs/results/compiled/TARGET.json)")
    args = p.parse_args(argv)
    target = parse_target(args.target)
    require_compiler()
    store = CompileCache(args.cache or OUT_DIR / f"{target.name}.json")
    tables = {}
    for s in all_sections():
        rows = figures(s, target, store, compile=not args.only or s.name in args.only, predicted=predicted)
        head, cells = columns(s, rows)
        tables[s.name] = table(head, [[r["setting"], r["error"]] if "error" in r else cells(r) for r in rows], "lr")
    out = args.out or OUT_DIR / f"{target.name}-{name}.md"
    out.write_text(render(f"{module.rpartition('.')[2]}.md", **{**fields(target), **tables}))
    print(f"wrote {out}")
    return 0


def main(argv: list[str]) -> int:
    return write_page(argv, __spec__.name, __doc__, sections, fields, columns)


if __name__ == "__main__":
    sys.exit(cli.run(main))
