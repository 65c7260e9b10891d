"""benchmarking_script from the `benchmarking` plan's records and any `--bench` result (docs/report.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from deliverables.answers import predicted, prose
from deliverables.answers.accounting import model
from deliverables.answers.gpu import campaign
from deliverables.answers.predicted import ms
from deliverables.common import plan_runs, table
from experiments.results import RESULT, load_bench
from jaxlm.analysis.flops import forward_flops
from jaxlm.core.errors import DataError
from jaxlm.core.files import read_json

PLAN = "benchmarking"
GPT2_VOCAB = 50_257  # the curriculum's models' vocabulary (GPT-2's tokenizer)


def load_bench_file(path: Path) -> tuple[list[dict], dict]:
    """Rows and meta of a `jaxlm.bench model --json` file, or of the bench.json or result.json in a run directory."""
    path = Path(path)
    if path.is_dir():
        path = next((p for p in (path / "bench.json", path / RESULT) if p.is_file()), path / "bench.json")
    if not path.is_file():
        raise DataError(f"--bench {path}: no such file; give a `jaxlm.bench model --json` file or its run directory")
    if path.name == RESULT:  # the runner's record of a bench run
        return list((read_json(path, default=None) or {}).get("bench_rows") or []), {}
    return load_bench(path)


# `small` at the size table's setting, measured on the CPU host (fits its memory; the larger sizes do not fit
# its time): python -m jaxlm.bench model --preset small --context 512 --batch 4 --mode forward forward_backward
#   --breakdown --json docs/results/benchmarking/small-cpu.json
CPU_SMALL = "small-cpu.json"


def measured_section(bench: Path | None, title: str = "A benchmark result given with `--bench`") -> list[str]:
    if bench is None:
        return []
    rows, meta = load_bench_file(bench)
    ok = [r for r in rows if r.get("status") == "ok" and isinstance(r.get("step_ms"), (int, float))]
    where = f" on {machine({'host': meta['host']})}" if isinstance(meta.get("host"), dict) else ""
    body = [[str(r.get(k, "–")) for k in ("framework", "mode", "dtype", "context", "batch")]
            + [ms(r["step_ms"]), ms(r["step_ms_std"]) if isinstance(r.get("step_ms_std"), (int, float)) else "–"]
            for r in ok]
    head = ["framework", "mode", "dtype", "context", "batch", "mean (ms)", "std (ms)"]
    forward = {r.get("mode"): r for r in ok}.get("forward")
    return prose("bench_result", title=title, bench=bench, count=len(ok), where=where,
                 table=table(head, body, "lr") if body else "No measured rows.", variability=variability_lines(ok),
                 backward=backward_lines(ok), breakdown=breakdown_lines(meta.get("breakdown") or [], forward))


def variability_lines(rows: list[dict]) -> list[str]:
    """How much the timed steps varied, and how much of the host other work held while they ran."""
    out = []
    for r in rows:
        if not isinstance(r.get("step_ms_std"), (int, float)):
            continue
        others = (f"; other processes kept {r['other_cpus']:.2f} CPUs busy meanwhile"
                  if isinstance(r.get("other_cpus"), (int, float)) else "")
        out.append(f"- {r.get('mode', '?').replace('_', ' + ')}: standard deviation {ms(r['step_ms_std'])} ms, "
                   f"{100 * r['step_ms_std'] / r['step_ms']:.0f}% of the mean{others}.")
    if any(r.get("busy") for r in rows):
        out += prose("oversubscribed")
    return out


def backward_lines(rows: list[dict]) -> list[str]:
    """Backward time = forward+backward - forward, where both modes were measured at the same setting; by wall time
    and, where recorded, by this process's CPU time (what the step itself computed, whatever else ran)."""
    key = lambda r: tuple(str(r.get(k)) for k in ("framework", "dtype", "attention", "remat", "context", "batch"))
    fwd = {key(r): r for r in rows if r.get("mode") == "forward"}
    out = []
    for r in rows:
        f = fwd.get(key(r))
        if r.get("mode") == "forward_backward" and f:
            b = r["step_ms"] - f["step_ms"]
            out.append(f"- {r.get('framework')} {r.get('dtype')} T={r.get('context')} B={r.get('batch')}: forward "
                       f"{ms(f['step_ms'])} ms, backward {ms(b)} ms ({b / f['step_ms']:.2f}x the forward by wall "
                       "time; the FLOP count says 2x).")
            if isinstance(r.get("step_cpu_ms"), (int, float)) and isinstance(f.get("step_cpu_ms"), (int, float)):
                out += prose("cpu_time", forward=ms(f["step_cpu_ms"]), both=ms(r["step_cpu_ms"]),
                             ratio=(r["step_cpu_ms"] - f["step_cpu_ms"]) / f["step_cpu_ms"],
                             forward_cpus=f["step_cpu_ms"] / f["step_ms"], both_cpus=r["step_cpu_ms"] / r["step_ms"])
    return out


def breakdown_lines(breakdowns: list[dict], forward: dict | None = None) -> list[str]:
    """Feed-forward against attention from `--breakdown`, and how its parts relate to the whole `forward` row."""
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
        out.append(f"- Feed-forward vs attention, forward, T={bd.get('context')} B={bd.get('batch')} "
                   f"{bd.get('dtype')}: time ratio {t:.2f}, FLOP ratio {fl:.2f}; {why}.")
        parts = sum(v.get("forward_s") or 0 for v in c.values())
        if forward and parts:
            out += prose("breakdown_timing", parts=parts, whole=forward["step_ms"] / 1e3)
    return out


def campaign_sizes(root: Path) -> dict[tuple[str, str], float]:
    """(preset, mode) -> ms of the GPU campaign's float32 bench table at the size table's context and batch."""
    rows = (campaign(root).get("bench_f32") or {}).get("rows") or []
    return {(r["model"], r["mode"]): r["step_ms"] for r in rows if r.get("status") == "ok" and r.get("step_ms")
            and r.get("context") == predicted.SIZE_CONTEXT and r.get("batch") == predicted.SIZE_BATCH}


def loads(host: dict) -> list[float]:
    """The 1-minute load averages a run recorded of its host: at its start, while it ran, at its end."""
    return [host[k] for k in ("load_avg_1m_start", "load_avg_1m", "load_avg_1m_end")
            if isinstance(host.get(k), (int, float))]


def machine(run: dict) -> str:
    h = run.get("host") or {}
    what = h.get("cpu_model") or f"{run.get('device', '?')}"
    cores = f", {h['cpus']} cores" if h.get("cpus") else ""
    load = loads(h)
    return what + cores + (f", load average {min(load):.1f}-{max(load):.1f}" if load else "")


def by_mode(run: dict) -> dict[str, dict]:
    return {row.get("mode"): row for row in run["bench_rows"] if row.get("status") == "ok"}


def axis(run: dict, key: str):
    return (run.get("axes") or {}).get(key, run["name"])


def timing_rows(runs: list[dict], key: str, first: bool = False) -> list[list[str]]:
    """A row per run: its `key` axis, then the times of its forward and forward + backward (table heads)."""
    out = []
    for r in runs:
        f, fb = (by_mode(r).get(m) for m in ("forward", "forward_backward"))
        cells = []
        for row in (f, fb):
            cells.append(f"{ms(row['step_ms'])} ± {ms(row['step_ms_std'])}" if row else "–")
            if first:
                cells.append(ms(row["step_ms_first"]) if row and row.get("step_ms_first") is not None else "–")
        back = ms(fb["step_ms"] - f["step_ms"]) if f and fb else "–"
        compiles = [row["compile_s"] for row in (f, fb) if row and row.get("compile_s") is not None]
        out.append([str(axis(r, key)), *cells, back, f"{max(compiles):.2f}" if compiles else "–"])
    return out


def warmup_lines(warm: list[dict]) -> list[str]:
    """What the records show: the first timed step without warm-up against the median after the most warm-up."""
    cold, hot = warm[0], warm[-1]
    out = []
    for mode in ("forward", "forward_backward"):
        c, h = by_mode(cold).get(mode), by_mode(hot).get(mode)
        if not (c and h and c.get("step_ms_first") and h.get("step_ms_median")):
            continue
        out += prose("warmup_row", mode=mode.replace("_", " + "), first=ms(c["step_ms_first"]),
                     ratio=c["step_ms_first"] / h["step_ms_median"], warm=axis(hot, "warmup"),
                     median=ms(h["step_ms_median"]), cold_std=ms(c["step_ms_std"]), warm_std=ms(h["step_ms_std"]))
    for r in warm[1:-1]:
        fb, h = by_mode(r).get("forward_backward"), by_mode(hot).get("forward_backward")
        if fb and h and fb.get("step_ms_first"):
            out.append(f"- after {axis(r, 'warmup')} warm-up step(s) the first timed forward + backward took "
                       f"{ms(fb['step_ms_first'])} ms ({fb['step_ms_first'] / h['step_ms_median']:.1f}x that median).")
    return out


def warmup_section(root: Path, warm: list[dict]) -> list[str]:
    """(c): the first timed steps and the spread of the `benchmarking` plan's warm-up runs."""
    if not warm:
        return ["#### (c) Warm-up", "", *prose("missing", plan=PLAN, what="records", root=root)]
    spec = warm[0].get("spec") or {}
    setting = ", ".join(f"{k} {v}" for k, v in (spec.get("args") or {}).items()
                        if k in ("config", "preset", "context", "batch"))
    warm = sorted(warm, key=lambda r: axis(r, "warmup"))
    head = ["warm-up steps", "forward (ms)", "first (ms)", "forward + backward (ms)", "first (ms)", "backward (ms)",
            "compile (s)"]
    return prose("warmup", setting=setting, machine=machine(warm[0]), observations=warmup_lines(warm),
                 table=table(head, timing_rows(warm, "warmup", first=True), "lr"))


def benchmarking_section(root: Path, bench: Path | None) -> list[str]:
    """benchmarking_script (a)-(c), then any `--bench` result."""
    runs = [r for r in plan_runs(root, PLAN) if r.get("status") == "ok" and r.get("bench_rows")]
    sizes = [r for r in runs if "preset" in (r.get("axes") or {})]
    found = prose("sizes_on_cpu")
    if sizes:
        found = [f"Measured on {machine(sizes[0])} ({sizes[0].get('device')}):", "",
                 table(["model", "forward (ms)", "forward + backward (ms)", "backward (ms)", "compile (s)"],
                       timing_rows(sizes, "preset"), "lr")]
    cpu = root / PLAN / CPU_SMALL
    cpu = measured_section(cpu, "`small` measured on the CPU host: forward, backward, their variability, "
                           "feed-forward against attention") if cpu.is_file() else []
    ours = model("small", 1024)
    head = {v: forward_flops(replace(ours, vocab_size=v), 1024) for v in (ours.vocab_size, GPT2_VOCAB)}
    out = prose("benchmarking", sizes=found, predicted=predicted.size_section(root, campaign_sizes(root)),
                cpu_small=cpu, ours=ours.vocab_size, gpt2=GPT2_VOCAB, context=1024,
                ours_share=100 * head[ours.vocab_size].lm_head / head[ours.vocab_size].total,
                gpt2_share=100 * head[GPT2_VOCAB].lm_head / head[GPT2_VOCAB].total)
    warm = [r for r in runs if "warmup" in (r.get("axes") or {})]
    return out + warmup_section(root, warm) + measured_section(bench)
