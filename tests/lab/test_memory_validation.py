"""experiments.memory_validation: the estimator against XLA:CPU's memory_analysis() of training's step (float32,
no remat) and against the figures compiled for an H100 (docs/memory.md)."""

import json
from pathlib import Path

import pytest

from experiments import memory_validation as mv
from jaxlm import cli


@pytest.mark.parametrize("shape", [(256, 4, 4, 1000, 128, 4), (256, 2, 4, 1000, 128, 4)])
def test_estimate_within_fifteen_percent_of_memory_analysis(shape):
    row = mv.cpu_row(*shape)
    assert abs(row["error"]) < 0.15, row


def test_validate_writes_the_table_between_markers(tmp_path):
    begin, end = mv.CPU_MARKS
    out = tmp_path / "memory.md"
    out.write_text(f"# Memory\n\nbefore\n\n{begin}\nold\n{end}\n\nafter\n")
    assert cli.run(mv.main, ["--rows", "1", "--out", str(out)]) == 0
    text = out.read_text()
    assert "before" in text and "after" in text and "old" not in text
    assert "| 256 | 4 | 4 | 1000 | 128 | 4 |" in text


def test_the_gpu_model_against_the_compiled_h100_figures():
    """The stored H100-compiled totals of the validation rows (docs/results/compiled, jax 0.10.2; nothing
    compiles here): every row, each remat policy with the whole and the chunked logits included, within 15 %."""
    stored = json.loads((Path(__file__).resolve().parents[2] / "docs/results/compiled/h100-80gb.json").read_text())
    by_job = {json.dumps(json.loads(k)[0], sort_keys=True): v for k, v in stored.items()
              if json.loads(k)[1:3] == ["h100-80gb", 1]}  # [job, target, GPUs, jax version]
    rows = [{**dict(zip(mv.FIELDS, spec)), **by_job[json.dumps(mv.validation_job(*spec), sort_keys=True)]}
            for spec in mv.ROWS]
    rows = mv.with_estimates(rows)
    assert {(r["remat"], r["loss_chunk"] > 0, r["dtype"]) for r in rows} >= {
        (remat, chunked, dtype) for remat in ("none", "full", "dots_saveable", "offload") for chunked in (False, True)
        for dtype in ("float32", "bfloat16")}
    worst = max(rows, key=lambda r: abs(r["error"]))
    assert abs(worst["error"]) <= 0.15, worst


def test_the_peak_fit_recovers_known_coefficients():
    """fit_peak on synthetic probes made with the estimator's form (kept + max(logits, backward) + parameters):
    each probe's moment is found and the coefficients come back."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.uniform(1.0, 10.0, size=(40, 10))
    head = rng.uniform(5.0, 120.0, size=40)
    true = np.array([2.0, 1.0, 0.5, 1.0, 0.0, 2.5, 3.0, 2.0, 1.5, 4.0])
    y = X[:, [0, 1, 2, 9]] @ true[[0, 1, 2, 9]] + np.maximum(head, X[:, 3:9] @ true[3:9])
    assert 5 < (head > X[:, 3:9] @ true[3:9]).sum() < 35  # both moments occur
    coef, fitted = mv.fit_peak(X, head, y)
    assert coef == pytest.approx(true, rel=1e-6, abs=1e-9) and fitted == pytest.approx(y, rel=1e-9)
