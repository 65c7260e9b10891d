"""The peft and quantization studies' own findings and tables (plans whose [report] sets `peft` or
`quantization` to true): what each fine-tuning run trained and held in memory (the `params` row the
trainer writes to metrics.jsonl at step 0), and the `python -m jaxlm.quantize` rows."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.report.format import fmt, table
from experiments.report.seeds import SEED_SUFFIX, Stats, compare_phrase, resolved

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


def _by_setting(items: list, name_of) -> dict[str, list]:
    """Items grouped by their run's name without the seed suffix, in first-seen order."""
    out: dict[str, list] = {}
    for it in items:
        out.setdefault(SEED_SUFFIX.sub("", name_of(it)), []).append(it)
    return out


def peft(runs: list[dict]) -> tuple[list[str], list[str]]:
    """(findings, lines of the fine-tuning table) over the runs that started from another run's weights,
    one row per method (mean ± std of the validation loss over its seeds)."""
    tuned = [(r, params_row(r)) for r in runs if ((r.get("config") or {}).get("train") or {}).get("init_from")]
    tuned = [(r, p) for r, p in tuned if p and _loss(r) is not None]
    if not tuned:
        return [], []
    groups = _by_setting(tuned, lambda rp: rp[0]["name"])
    loss = {name: Stats.of([_loss(r) for r, _ in g]) for name, g in groups.items()}
    full = next((name for name, g in groups.items() if not (g[0][0]["config"].get("lora") or {}).get("rank")), None)
    rows, findings = [], []
    for name, g in groups.items():
        r, p = g[0]  # trainable / frozen counts and bytes are the same at every seed
        total = p["trainable_params"] + p["frozen_params"]
        state = p["grad_bytes"] + p["optimizer_bytes"]
        per = p.get("quantised_bytes_per_param") or p.get("frozen_bytes_per_param") or 0
        step = Stats.of([t for r_, _ in g if (t := (r_.get("metrics") or {}).get("step_time"))])
        rows.append([name, _label(r), str(len(g)), f"{int(p['trainable_params']):,}", f"{100 * p['trainable_params'] / total:.2f} %",
                     f"{state / MIB:.3f}", f"{p['frozen_bytes'] / MIB:.3f}", fmt(per, ".3f") if per else "-",
                     fmt(step.mean * 1e3, ".1f") if step else "-", loss[name].text(4)])
        if full is not None and name != full:
            fp = groups[full][0][1]
            findings.append(
                f"{_label(r)} trained {100 * p['trainable_params'] / total:.2f} % of the parameters with "
                f"{100 * state / (fp['grad_bytes'] + fp['optimizer_bytes']):.1f} % of full fine-tuning's gradient + "
                f"optimizer-state memory: {compare_phrase(loss[name], loss[full], digits=4)} for full fine-tuning.")
        if p.get("quantised_bytes_per_param"):
            findings.append(f"{_label(r)} stored its quantised frozen weights at {p['quantised_bytes_per_param']:.3f} "
                            f"bytes per parameter (float32: 4), {p['frozen_bytes'] / MIB:.3f} MiB of frozen weights "
                            "in all (embeddings and norms stay float32).")
    headers = ["setting", "method", "seeds", "trainable", "share", "grad + opt MiB", "frozen MiB", "bytes / quantised param",
               "step ms", "val loss"]
    return findings, ["## Fine-tuning cost", "", table(headers, rows), "",
                      "Val loss: mean ± sample standard deviation over the seeds. Gradients: one float32 per trainable "
                      "parameter; optimizer state: AdamW's two moments and its step count; frozen: the parameters "
                      "outside the trainable set, in the bytes they are stored in.", ""]


def quantize_rows(runs: list[dict]) -> list[dict]:
    """Every `python -m jaxlm.quantize` row of the plan (one quantize.json per seed's command run)."""
    rows = []
    for r in runs:
        path = Path(r.get("_dir", "")) / "quantize.json"
        if path.is_file():
            rows += json.loads(path.read_text())
    return rows


def quantization(runs: list[dict]) -> tuple[list[str], list[str]]:
    """(findings, lines of the PTQ / QAT table): each trained model and conversion, mean ± std over seeds."""
    rows = quantize_rows(runs)
    if not rows:
        return [], []
    groups = _by_setting(rows, lambda q: q["run"])
    cells = {}  # (setting, bits) -> (first row, Stats of its validation loss over seeds)
    for name, g in groups.items():
        for bits in dict.fromkeys(q["bits"] for q in g):
            same = [q for q in g if q["bits"] == bits]
            cells[(name, bits)] = (same[0], Stats.of([q["val_loss"] for q in same]))
    base = next(((q, st) for (name, bits), (q, st) in cells.items() if q["trained"] == "float32" and bits is None), None)
    findings = []
    for (name, bits), (q, st) in cells.items():
        if base is None or q is base[0]:
            continue
        what = f"{name} with {q['weights']} weights" if bits else f"{name} as trained"
        size = f"; weights {base[0]['weight_bytes'] / q['weight_bytes']:.2f}x smaller than float32's" if bits else ""
        findings.append(f"{what}: {compare_phrase(st, base[1], digits=4)} for float32{size}.")
    for bits in (8, 4):
        ptq = next((c for (name, b), c in cells.items() if b == bits and c[0]["trained"] == "float32"), None)
        qat = next(((name, c) for (name, b), c in cells.items() if b == bits and f"w{bits}" in c[0]["trained"]), None)
        if ptq and qat:
            verdict = {True: "beyond noise", False: "within noise", None: "one seed"}[resolved(qat[1][1], ptq[1])]
            better = "recovered" if qat[1][1].mean < ptq[1].mean else "did not recover"
            findings.append(f"At int{bits}, QAT then conversion ({qat[0]}) reached {qat[1][1].text(4)}, PTQ of the "
                            f"float32 model {ptq[1].text(4)}: QAT {better} {abs(ptq[1].mean - qat[1][1].mean):.4f} of loss "
                            f"({verdict}).")
    table_rows = [[name, q["trained"], q["weights"], str(st.n), st.text(4), f"{q['weight_bytes']:,}"]
                  for (name, _), (q, st) in cells.items()]
    return findings, ["## Float32, PTQ and QAT", "",
                      table(["run", "trained", "weights", "seeds", "val loss", "weight bytes"], table_rows), "",
                      "Val loss: mean ± sample standard deviation over the seeds, each evaluated on the same "
                      "validation batches.", ""]
