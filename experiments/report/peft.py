"""The peft and quantization studies' own findings and tables (plans whose [report] sets `peft` or
`quantization` to true): what each fine-tuning run trained and held in memory (the `params` row the
trainer writes to metrics.jsonl at step 0), and the `python -m jaxlm.quantize` rows."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.report.format import fmt, table

MIB = 2**20


def params_row(run: dict) -> dict | None:
    """The trainer's step-0 record of trainable / frozen parameters and their bytes."""
    path = Path(run.get("_dir", "")) / "metrics.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("kind") == "params":
            return {k.split("/", 1)[1]: v for k, v in r.items() if k.startswith("params/")}
    return None


def _loss(run: dict) -> float | None:
    return (run.get("metrics") or {}).get("eval_loss")


def _label(run: dict) -> str:
    lora = (run.get("config") or {}).get("lora") or {}
    if not lora.get("rank"):
        return "full fine-tuning"
    kind = "QLoRA" if lora.get("base", "float32") != "float32" else "LoRA"
    return f"{kind} rank {lora['rank']}" + (f" ({lora['base']} base)" if kind == "QLoRA" else "")


def peft(runs: list[dict]) -> tuple[list[str], list[str]]:
    """(findings, lines of the fine-tuning table) over the runs that started from another run's weights."""
    tuned = [(r, params_row(r)) for r in runs if ((r.get("config") or {}).get("train") or {}).get("init_from")]
    tuned = [(r, p) for r, p in tuned if p and _loss(r) is not None]
    if not tuned:
        return [], []
    rows, findings = [], []
    full = next(((r, p) for r, p in tuned if not (r["config"].get("lora") or {}).get("rank")), None)
    for r, p in tuned:
        total = p["trainable_params"] + p["frozen_params"]
        state = p["grad_bytes"] + p["optimizer_bytes"]
        per = p.get("quantised_bytes_per_param") or p.get("frozen_bytes_per_param") or 0
        step = (r.get("metrics") or {}).get("step_time")
        rows.append([r["name"], _label(r), f"{int(p['trainable_params']):,}", f"{100 * p['trainable_params'] / total:.2f} %",
                     f"{state / MIB:.3f}", f"{p['frozen_bytes'] / MIB:.3f}", fmt(per, ".3f") if per else "-",
                     fmt(step * 1e3, ".1f") if step else "-", fmt(_loss(r), ".4f")])
        if full is not None and r is not full[0]:
            fp = full[1]
            findings.append(
                f"{_label(r)} trained {100 * p['trainable_params'] / total:.2f} % of the parameters with "
                f"{100 * state / (fp['grad_bytes'] + fp['optimizer_bytes']):.1f} % of full fine-tuning's gradient + "
                f"optimizer-state memory and reached validation loss {_loss(r):.4f} "
                f"({_loss(r) - _loss(full[0]):+.4f} against full fine-tuning's {_loss(full[0]):.4f}).")
        if p.get("quantised_bytes_per_param"):
            findings.append(f"{_label(r)} stored its quantised frozen weights at {p['quantised_bytes_per_param']:.3f} "
                            f"bytes per parameter (float32: 4), {p['frozen_bytes'] / MIB:.3f} MiB of frozen weights "
                            "in all (embeddings and norms stay float32).")
    headers = ["run", "method", "trainable", "share", "grad + opt MiB", "frozen MiB", "bytes / quantised param",
               "step ms", "val loss"]
    return findings, ["## Fine-tuning cost", "", table(headers, rows), "",
                      "Gradients: one float32 per trainable parameter; optimizer state: AdamW's two moments and its "
                      "step count; frozen: the parameters outside the trainable set, in the bytes they are stored in.", ""]


def quantization(runs: list[dict]) -> tuple[list[str], list[str]]:
    """(findings, lines of the PTQ / QAT table) from the quantize run's quantize.json."""
    path = next((Path(r["_dir"]) / "quantize.json" for r in runs if (Path(r.get("_dir", "")) / "quantize.json").is_file()), None)
    if path is None:
        return [], []
    rows = json.loads(path.read_text())
    by = {(r["run"], r["bits"]): r for r in rows}
    base = next((r for r in rows if r["trained"] == "float32" and r["bits"] is None), None)
    findings = []
    for r in rows:
        if base is None or r is base:
            continue
        findings.append(f"{r['run']} with {r['weights']} weights: validation loss {r['val_loss']:.4f} "
                        f"({r['val_loss'] - base['val_loss']:+.4f} against float32), weights "
                        f"{base['weight_bytes'] / r['weight_bytes']:.2f}x smaller than float32's."
                        if r["bits"] else f"{r['run']} as trained: validation loss {r['val_loss']:.4f} "
                        f"({r['val_loss'] - base['val_loss']:+.4f} against float32).")
    for bits in (8, 4):
        ptq = by.get((base["run"], bits)) if base else None
        qat = [r for r in rows if r["bits"] == bits and r["trained"] != "float32" and f"w{bits}" in r["trained"]]
        if ptq and qat:
            findings.append(f"At int{bits}, QAT then conversion ({qat[0]['run']}) reached {qat[0]['val_loss']:.4f}, "
                            f"PTQ of the float32 model {ptq['val_loss']:.4f}: QAT "
                            f"{'recovered' if qat[0]['val_loss'] < ptq['val_loss'] else 'did not recover'} "
                            f"{abs(ptq['val_loss'] - qat[0]['val_loss']):.4f} of loss.")
    lines = ["## Float32, PTQ and QAT", "",
             table(["run", "trained", "weights", "val loss", "weight bytes"],
                   [[r["run"], r["trained"], r["weights"], f"{r['val_loss']:.4f}", f"{r['weight_bytes']:,}"] for r in rows]),
             ""]
    return findings, lines


def study_extras(report_cfg: dict, runs: list[dict]) -> tuple[list[str], list[str]]:
    findings, lines = [], []
    for key, fn in (("peft", peft), ("quantization", quantization)):
        if report_cfg.get(key):
            f, l = fn(runs)
            findings += f
            lines += l
    return findings, lines
