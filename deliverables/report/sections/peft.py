"""The peft and quantization studies' findings and tables: the trainer's step-0 `params` rows and
`python -m jaxlm.quantize`'s rows."""

from __future__ import annotations

from pathlib import Path

from deliverables.common import table
from deliverables.report.format import fmt
from deliverables.report.noise import Family, paired
from deliverables.report.seeds import SEED_SUFFIX, VERDICT, Stats, compare_phrase, group_settings, run_json
from experiments.results import read_metrics

MIB = 2**20


def params_row(run: dict) -> dict | None:
    """The trainer's step-0 record of trainable / frozen parameters and their bytes."""
    for r in read_metrics(Path(run.get("_dir", "")) / "metrics.jsonl"):
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


def peft(runs: list[dict], noise: Family) -> tuple[list[str], list[str]]:
    """(findings, lines of the fine-tuning table) over the runs that started from another run's weights,
    one row per method (mean ± 95 % interval of the validation loss over its seeds)."""
    tuned = [(r, params_row(r)) for r in runs if ((r.get("config") or {}).get("train") or {}).get("init_from")]
    tuned = [(r, p) for r, p in tuned if p and _loss(r) is not None]
    if not tuned:
        return [], []
    params = {r["name"]: p for r, p in tuned}
    groups = {s.name: [(r, params[r["name"]]) for r in s.runs] for s in group_settings([r for r, _ in tuned])}
    loss = {name: Stats.of([_loss(r) for r, _ in g]) for name, g in groups.items()}
    full = next((name for name, g in groups.items() if not (g[0][0]["config"].get("lora") or {}).get("rank")), None)
    rows, findings = [], []
    for name, g in groups.items():
        r, p = g[0]  # trainable / frozen counts and bytes are the same at every seed
        total = p["trainable_params"] + p["frozen_params"]
        state = p["grad_bytes"] + p["optimizer_bytes"]
        per = p.get("quantised_bytes_per_param") or p.get("frozen_bytes_per_param") or 0
        step = Stats.of([t for r_, _ in g if (t := (r_.get("metrics") or {}).get("step_time"))])
        rows.append([name, _label(r), str(len(g)), f"{int(p['trainable_params']):,}",
                     f"{100 * p['trainable_params'] / total:.2f} %",
                     f"{state / MIB:.3f}", f"{p['frozen_bytes'] / MIB:.3f}", fmt(per, ".3f") if per else "-",
                     fmt(step.mean * 1e3, ".1f") if step else "-", loss[name].text(4)])
        if full is not None and name != full:
            fp = groups[full][0][1]
            findings.append(
                f"{_label(r)} trained {100 * p['trainable_params'] / total:.2f} % of the parameters with "
                f"{100 * state / (fp['grad_bytes'] + fp['optimizer_bytes']):.1f} % of full fine-tuning's gradient + "
                f"optimizer-state memory: {compare_phrase(loss[name], loss[full], noise, digits=4)} for full "
                "fine-tuning.")
        if p.get("quantised_bytes_per_param"):
            findings.append(f"{_label(r)} stored its quantised frozen weights at {p['quantised_bytes_per_param']:.3f} "
                            f"bytes per parameter (float32: 4), {p['frozen_bytes'] / MIB:.3f} MiB of frozen weights "
                            "in all (embeddings and norms stay float32).")
    headers = ["setting", "method", "seeds", "trainable", "share", "grad + opt MiB", "frozen MiB",
               "bytes / quantised param", "step ms", "val loss"]
    return findings, ["## Fine-tuning cost", "", table(headers, rows), "",
                      "Val loss: mean ± the half-width of its 95 % t-interval over the seeds. Gradients: one "
                      "float32 per trainable parameter; optimizer state: AdamW's two moments and its step count; "
                      "frozen: the parameters outside the trainable set, in the bytes they are stored in.", ""]


def quantize_rows(runs: list[dict]) -> list[dict]:
    """Every `python -m jaxlm.quantize` row of the plan (one quantize.json per seed's command run)."""
    return [row for _, rows in run_json(runs, "quantize.json") for row in rows]


def paired_phrase(a: dict[str, float], b: dict[str, float], noise: Family) -> str:
    """'+0.0149 ± 0.0012 (paired by seed, beyond noise)': the mean of a - b over the seeds both have,
    ± the half-width of its 95 % t-interval; beyond noise when the paired t-test rejects after Holm.
    Each seed's models share their initialisation and data order, so pairing removes that spread."""
    diffs = [a[k] - b[k] for k in a if k in b]
    if not diffs:
        return "no common seed"
    st = Stats.of(diffs)
    spread = f" ± {st.ci:.4f}" if st.ci is not None else ""
    return f"{st.mean:+.4f}{spread} (paired by seed, {VERDICT[noise.beyond(paired(diffs))]})"


def quantization(runs: list[dict], noise: Family) -> tuple[list[str], list[str]]:
    """(findings, lines of the PTQ / QAT table): each trained model and conversion, mean ± 95 % interval
    over seeds, compared with float32 and PTQ by seed-paired differences."""
    rows = quantize_rows(runs)
    if not rows:
        return [], []
    cells: dict[tuple[str, int | None], tuple[dict, dict[str, float]]] = {}  # (setting, bits) -> (a row, {seed: loss})
    for q in rows:
        seed = (SEED_SUFFIX.search(q["run"]) or [""])[0]
        cells.setdefault((SEED_SUFFIX.sub("", q["run"]), q["bits"]), (q, {}))[1][seed] = q["val_loss"]
    stats = {k: Stats.of(list(v.values())) for k, (_, v) in cells.items()}
    base = next((k for k, (q, _) in cells.items() if q["trained"] == "float32" and k[1] is None), None)
    findings = []
    for k, (q, losses) in cells.items():
        if base is None or k == base:
            continue
        what = f"{k[0]} with {q['weights']} weights" if k[1] else f"{k[0]} as trained"
        size = (f"; weights {cells[base][0]['weight_bytes'] / q['weight_bytes']:.2f}x smaller than float32's"
                if k[1] else "")
        findings.append(f"{what}: validation loss {stats[k].text(4)}, {paired_phrase(losses, cells[base][1], noise)} "
                        f"against float32{size}.")
    for bits in (8, 4):
        ptq = next((k for k, (q, _) in cells.items() if k[1] == bits and q["trained"] == "float32"), None)
        qat = next((k for k, (q, _) in cells.items() if k[1] == bits and f"w{bits}" in q["trained"]), None)
        if ptq and qat:
            better = "below" if stats[qat].mean < stats[ptq].mean else "above"
            findings.append(f"At int{bits}, QAT then conversion ({qat[0]}) reached {stats[qat].text(4)}, {better} "
                            f"PTQ of the float32 model ({stats[ptq].text(4)}): "
                            f"{paired_phrase(cells[qat][1], cells[ptq][1], noise)}.")
    table_rows = [[k[0], q["trained"], q["weights"], str(stats[k].n), stats[k].text(4), f"{q['weight_bytes']:,}"]
                  for k, (q, _) in cells.items()]
    return findings, ["## Float32, PTQ and QAT", "",
                      table(["run", "trained", "weights", "seeds", "val loss", "weight bytes"], table_rows), "",
                      "Val loss: mean ± the half-width of its 95 % t-interval over the seeds, each evaluated on the "
                      "same validation tokens.", ""]
