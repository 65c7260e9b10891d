"""deliverables.memory_validation: the estimator against XLA:CPU's memory_analysis() of training's step (float32,
no remat) and against the figures compiled for an H100 (docs/results/compiled/h100-80gb-validation.md)."""

import json
from pathlib import Path

import pytest

from deliverables import memory_validation as mv
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

