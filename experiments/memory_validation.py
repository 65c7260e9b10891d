"""The memory estimator (jaxlm.analysis.memory) against the GPU compiler's plan of the same train steps.

    python -m jaxlm.memory validate --target h100-80gb --out docs/memory.md [--cache runs/memory/h100.json]

Each row compiles training's own step (jaxlm.bench.target) for the target and compares
the estimate with the compiled total per GPU (argument + output + temp - alias). The
compiled figures are kept in `--cache` (keyed by row, target and jax version, each with the hash of the
program it was compiled from), so the table regenerates in seconds after a change to the estimator; a test
lowers stored jobs again and fails when the program they name has changed.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxlm.bench import target as gpu
from jaxlm.core.config import load_config

# (preset, dtype, remat, attention, context, batch): the tinystories-17M model, small, medium and large
# (vocabulary 10,000) across precision, remat policy and attention kernel, at a few shapes.
_TS = [("tinystories-17M", d, r, a, 256, 64) for d, a in (("float32", "xla"), ("bfloat16", "xla"),
                                                         ("bfloat16", "cudnn"))
       for r in ("none", "full", "dots_saveable")]
_SMALL = [("small", d, r, a, 1024, 8) for d, a in (("float32", "xla"), ("bfloat16", "xla"), ("bfloat16", "cudnn"))
          for r in ("none", "full", "dots_saveable")]
ROWS = (
    *_TS,
    ("tinystories-17M", "bfloat16", "none", "xla", 512, 16), ("tinystories-17M", "bfloat16", "none", "cudnn", 512, 16),
    *_SMALL,
    ("small", "float32", "none", "xla", 256, 32), ("small", "bfloat16", "none", "xla", 256, 32),
    ("small", "bfloat16", "full", "xla", 256, 32), ("small", "bfloat16", "none", "cudnn", 256, 32),
    ("small", "bfloat16", "none", "xla", 2048, 2), ("small", "bfloat16", "none", "cudnn", 2048, 2),
    ("medium", "float32", "none", "xla", 1024, 4), ("medium", "bfloat16", "none", "xla", 1024, 4),
    ("medium", "bfloat16", "full", "xla", 1024, 4), ("medium", "bfloat16", "dots_saveable", "xla", 1024, 4),
    ("medium", "bfloat16", "none", "cudnn", 1024, 4), ("medium", "bfloat16", "full", "cudnn", 1024, 4),
    ("large", "float32", "none", "xla", 1024, 2), ("large", "bfloat16", "none", "xla", 1024, 2),
    ("large", "bfloat16", "full", "xla", 1024, 2), ("large", "bfloat16", "none", "cudnn", 1024, 2),
)
FIELDS = ("preset", "dtype", "remat", "attention", "context", "batch")
MARK_BEGIN, MARK_END = "<!-- gpu validation table: begin -->", "<!-- gpu validation table: end -->"
KEPT = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "total_bytes", "matmuls", "matmul_dtypes",
        "cudnn_attention_calls", "compile_s", "label")


def row_config(preset: str, dtype: str, remat: str, attention: str, context: int, batch: int):
    return job_config(validation_job(preset, dtype, remat, attention, context, batch))


def validation_job(preset: str, dtype: str, remat: str, attention: str, context: int, batch: int) -> dict:
    return {"preset": preset, "set": [f"model.context_length={context}", f"data.batch_size={batch}",
                                      f'compute.dtype="{dtype}"', f'compute.remat="{remat}"',
                                      f'compute.attention="{attention}"'], "mode": "train_step"}


def job_config(job: dict):
    """A job: {"preset": NAME or None, "set": [SECTION.KEY=VALUE, ...], "mode": train_step | forward}."""
    return load_config(None, job["set"], preset=job.get("preset"))


class CompileCache:
    """Compiled figures by (job, target, jax version) in a JSON file, saved after every new compile. A job
    whose key is missing is lowered first: a figure compiled from the same lowered program (`program` in every
    figure) is reused, anything else compiled."""

    def __init__(self, path: Path | None):
        self.path = path
        self.stored = json.loads(path.read_text()) if path is not None and path.exists() else {}

    @staticmethod
    def key(job: dict, target: gpu.Target) -> str:
        import jax

        return json.dumps([job, target.name, target.count, jax.__version__], sort_keys=True)

    def has(self, job: dict, target: gpu.Target) -> bool:
        return self.key(job, target) in self.stored

    def _save(self) -> None:
        from jaxlm.core.files import write_json

        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, self.stored)

    def row(self, job: dict, target: gpu.Target, log=None) -> dict:
        key = self.key(job, target)
        if key not in self.stored:
            cfg, mode = job_config(job), job.get("mode", "train_step")
            lowered = gpu.lower_step(cfg, target, mode)
            program = gpu.program_hash(lowered, target)
            same = next((v for v in self.stored.values() if v.get("program") == program), None)
            if same is None:
                r = gpu.compiled_row(cfg, target, mode, lowered=lowered)
                same = {**{k: r[k] for k in KEPT}, "program": program}
                if log:
                    log(f"{job}: {r['total_bytes'] / 2**30:.2f} GiB (temp {r['temp_bytes'] / 2**30:.2f}), "
                        f"compiled in {r['compile_s']:.0f} s")
            self.stored[key] = same
            self._save()
        return self.stored[key]

    def largest(self, job: dict, target: gpu.Target) -> int:
        """The largest batch of `job` that fits the target, by compiling (jaxlm.bench.target.largest_batch)."""
        key = self.key({**job, "search": "largest_batch"}, target)
        if key not in self.stored:
            self.stored[key] = {"largest_batch": gpu.largest_batch(job_config(job), target, job.get("mode", "train_step"))}
            self._save()
        return self.stored[key]["largest_batch"]


def compiled_rows(target: gpu.Target, rows=ROWS, cache: Path | None = None, log=print) -> list[dict]:
    """The compiled figures of each validation row, from `cache` where present (and saved there as they come)."""
    store = CompileCache(cache)
    return [{**dict(zip(FIELDS, spec)), **store.row(validation_job(*spec), target, log)} for spec in rows]


def with_estimates(rows: list[dict]) -> list[dict]:
    """Each row with the estimator's total and its error against the compiled total."""
    from jaxlm.analysis import memory

    out = []
    for r in rows:
        cfg = row_config(*(r[f] for f in FIELDS))
        est = memory.estimate(cfg.model, r["batch"], r["context"], cfg.compute, "train_step")
        out.append({**r, "estimate_bytes": est.total, "estimate_state": est.state_total,
                    "error": est.total / r["total_bytes"] - 1})
    return out


def table(rows: list[dict]) -> str:
    import jax

    gib = lambda x: f"{x / 2**30:.2f}"  # noqa: E731
    lines = ["| model | dtype | remat | attention | context | batch | estimate GiB | compiled GiB | error "
             "| compiled temp GiB | matmuls | cuDNN calls |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['preset']} | {r['dtype']} | {r['remat']} | {r['attention']} | {r['context']} | "
                     f"{r['batch']} | {gib(r['estimate_bytes'])} | {gib(r['total_bytes'])} | {100 * r['error']:+.1f}% "
                     f"| {gib(r['temp_bytes'])} | {r['matmuls']} | {r['cudnn_attention_calls']} |")
    errs = [abs(r["error"]) for r in rows]
    lines += ["", f"{len(rows)} rows; mean absolute error {100 * sum(errs) / len(errs):.1f}%, largest "
                  f"{100 * max(errs):.1f}%; {sum(e <= 0.10 for e in errs)} of {len(rows)} within 10%. "
                  f"{rows[0]['label']}, on a CPU-only machine, jax {jax.__version__}."]
    return "\n".join(lines)


def validate(target_name: str, out: Path | None, cache: Path | None, first: int | None = None) -> str:
    from jaxlm.core.files import write_between_markers

    t = gpu.parse_target(target_name)
    gpu.require_compiler()
    text = table(with_estimates(compiled_rows(t, ROWS[:first], cache)))
    if out is not None:
        write_between_markers(out, text, MARK_BEGIN, MARK_END)
    return text


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


def calibrate(target: gpu.Target, cache: Path | None, log=print) -> dict:
    """Non-negative least-squares fit (relative errors) of each class's GPU_BYTES row on the compiled probes'
    temp bytes: the activation features of jaxlm.analysis.memory.gpu_features, and the parameter count
    (gradients and weight copies)."""
    import numpy as np
    from scipy.optimize import nnls  # scipy comes with jax

    from jaxlm.analysis import memory
    from jaxlm.analysis.flops import param_counts

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
