"""deliverables.predicted_anchors: a published figure beside the prediction of the same configuration, in the
figure's unit, with the error of the time (a throughput's inverse); stored compiled figures, no compile here."""

import pytest

from deliverables import predicted_anchors as anchors
from jaxlm.analysis.flops import param_counts
from jaxlm.predict.store import job_config


class _Store:
    """A compiled store that has every anchor's step: 1 s per step."""

    def row(self, job, target, log=None, predicted=False):
        assert predicted and target.name in ("a100-40gb", "a100-80gb")
        return {"predicted_step_ms": 1000.0, "predicted_label": "x"}


def test_a_step_anchor_is_converted_to_the_papers_tflops_and_the_error_is_of_the_time():
    a = anchors.ANCHORS[2]  # GPT3-1.3B, 64 sequences of 2048 per step, 196 TFLOP/s measured
    cfg = job_config({"preset": None, "set": list(a.sets), "mode": "train_step"})
    n = param_counts(cfg.model)["total"]
    flops = 64 * (6 * 2048 * n + 12 * 24 * 2048 * 2048**2)
    assert cfg.data.batch_size == 64 and cfg.train.grad_accum == 8 and 1.3e9 < n < 1.32e9
    tflops = anchors.predicted(a, _Store())
    assert tflops == pytest.approx(flops / 1e12)  # in one second
    assert anchors.error(a, tflops) == pytest.approx(196 / tflops - 1)  # predicted time over measured time, - 1
    ms = anchors.ANCHORS[1]  # llm.c's 78.0 ms
    assert anchors.predicted(ms, _Store()) == 1000.0 and anchors.error(ms, 39.0) == pytest.approx(-0.5)


def test_the_table_names_every_source_and_the_mean_error():
    values = [a.measured * (1.1 if a.unit == "ms" else 1 / 1.1) for a in anchors.ANCHORS]  # all 10 % slow
    text = anchors.table(values)
    assert text.count("+10%") == len(anchors.ANCHORS) and "Mean absolute error of the time: 10%" in text
    assert all(a.source in text for a in anchors.ANCHORS) and len(anchors.ANCHORS) >= 4
