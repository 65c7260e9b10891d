"""Compiled figures kept in a JSON file, so that pages built from many compiles regenerate in seconds.

    store = CompileCache(Path("docs/results/compiled/h100-80gb.json"))
    store.row({"preset": "small", "set": ["data.batch_size=8"], "mode": "train_step"}, parse_target("h100-80gb"))

A *job* names a step as a config does: {"preset": NAME or None, "set": [SECTION.KEY=VALUE, ...], "mode":
train_step | forward}. Figures are keyed by (job, target, jax version), each with the hash of the lowered
program it was compiled from (`jaxlm.predict.compile.program_hash`): a job missing from the file is lowered
first, and a figure of the same program is reused; only a new program compiles. A figure holds the compiled
memory and, from the same compile, the predicted step time with its per-group, per-pass and per-part totals and
slowest ops (`jaxlm.predict.compile.prediction`), so pages and answers read both without compiling; a figure
without a prediction, or with one priced by another version of the model (jaxlm.predict.roofline.PRICING_VERSION),
gets a new one when asked for (`row(..., predicted=True)`: compiled again). Keys do not depend on jaxlm's sources,
so a refactor that leaves the program unchanged keeps every figure (a test lowers stored jobs again and fails
when the program they name has changed).
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxlm.core.config import Config, load_config
from jaxlm.core.files import write_json
from jaxlm.predict import calibration
from jaxlm.predict import compile as gpu
from jaxlm.predict.roofline import PRICING_VERSION
from jaxlm.predict.target import Target

PREDICTED = "predicted_step_ms"
KEPT = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "total_bytes", "usable_bytes", "fits",
        "matmuls", "matmul_dtypes", "matmul_precision", "dtype_label", "cudnn_attention_calls", "rematerialised",
        "compile_s", "label", "compiler_options", PREDICTED, "predicted_tokens_per_s", "predicted_mfu",
        "predicted_peak", "predicted_label", "predicted_calibration", "predicted_pricing", "predicted_groups",
        "predicted_phases", "predicted_components", "predicted_ops",
        "predicted_notes")  # not the kernels: their ops, summed


def priced(figures: dict) -> bool:
    """Whether stored figures hold a prediction of the current pricing model (a step that does not fit has none,
    and its label says so)."""
    return figures.get("predicted_pricing") == PRICING_VERSION and "predicted_label" in figures


def job_config(job: dict) -> Config:
    return load_config(None, job["set"], preset=job.get("preset"))


class CompileCache:
    """Compiled figures by (job, target, jax version) in a JSON file (none: in memory only), saved after every
    new compile."""

    def __init__(self, path: Path | None, fraction: float | None = None):
        self.path, self.fraction = path, fraction  # fraction: of the GPU a step may fill (None: JAX's share)
        self.stored = json.loads(path.read_text()) if path is not None and path.exists() else {}

    @staticmethod
    def key(job: dict, target: Target) -> str:
        import jax

        return json.dumps([job, target.name, target.count, jax.__version__], sort_keys=True)

    def has(self, job: dict, target: Target) -> bool:
        return self.key(job, target) in self.stored

    def _save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, self.stored)

    def row(self, job: dict, target: Target, log=None, predicted: bool = False) -> dict:
        """The job's compiled figures (KEPT and "program"), compiled now unless stored; `log` hears of compiles.
        `predicted`: a stored figure without a current prediction (jaxlm.predict.store.priced) is compiled again."""
        key = self.key(job, target)
        stored = self.stored.get(key)
        if stored is None or (predicted and not priced(stored)):
            self.stored[key] = self._figures(job, target, log, predicted)
            self._save()
        return self.stored[key]

    def _figures(self, job: dict, target: Target, log, predicted: bool) -> dict:
        """A stored figure of the same lowered program, else a new compile (which every entry of that program
        then shares)."""
        cfg, mode = job_config(job), job.get("mode", "train_step")
        lowered = gpu.lower_step(cfg, target, mode)
        program = gpu.program_hash(lowered, target)
        same = [v for v in self.stored.values() if v.get("program") == program]
        if same and (not predicted or priced(same[0])):
            return same[0]
        r = gpu.compiled_row(cfg, target, mode, self.fraction, lowered, calibration.resolve(None, target.name))
        figures = {**{k: r[k] for k in KEPT if k in r}, "program": program}
        for v in same:
            v.update(figures)
        if log:
            ms = f", predicted {r[PREDICTED]:.1f} ms per step" if r.get(PREDICTED) else f", {r['predicted_label']}"
            log(f"{job}: {r['total_bytes'] / 2**30:.2f} GiB (temp {r['temp_bytes'] / 2**30:.2f}){ms}, "
                f"compiled in {r['compile_s']:.0f} s")
        return figures

    def largest(self, job: dict, target: Target) -> int:
        """The largest batch of `job` that fits the target, by compiling (jaxlm.predict.compile.largest_batch)."""
        key = self.key({**job, "search": "largest_batch"}, target)
        if key not in self.stored:
            found = gpu.largest_batch(job_config(job), target, job.get("mode", "train_step"))
            self.stored[key] = {"largest_batch": found}
            self._save()
        return self.stored[key]["largest_batch"]
