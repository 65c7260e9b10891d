"""jaxlm.training.optim's schedule against the specification's formula, evaluated in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxlm.core.config import OptimConfig
from jaxlm.training.optim import make_schedule


def spec_lr(t: int, lr_max: float, lr_min: float, t_w: int, t_c: int) -> float:
    """docs/spec.md, written out in float64."""
    if t < t_w:
        return t / t_w * lr_max
    if t <= t_c:
        return lr_min + 0.5 * (1 + math.cos(math.pi * (t - t_w) / (t_c - t_w))) * (lr_max - lr_min)
    return lr_min


@pytest.mark.parametrize("lr, min_lr, warmup, cosine", [(1.0, 0.1, 7, 21), (1e-3, 1e-4, 100, 2000),
                                                        (2e-3, 2e-4, 50, 600), (3e-3, 0.0, 1, 50)])
def test_schedule_equals_the_formula(lr, min_lr, warmup, cosine):
    schedule = make_schedule(OptimConfig(lr=lr, min_lr=min_lr, warmup_steps=warmup, cosine_steps=cosine), 10**6)
    ts = np.arange(cosine + 20)
    got = np.array([float(schedule(t)) for t in ts])
    want = np.array([spec_lr(int(t), lr, min_lr, warmup, cosine) for t in ts])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_spec_example_and_a_run_shorter_than_its_warmup():
    s = make_schedule(OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=7, cosine_steps=21), 100)
    assert [round(float(s(t)), 6) for t in (0, 7, 14, 21, 30)] == [0.0, 1.0, 0.55, 0.1, 0.1]
    short = make_schedule(OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=100), total_steps=10)
    np.testing.assert_allclose([float(short(t)) for t in range(10)], [t * 1e-5 for t in range(10)], rtol=0, atol=1e-10)
