"""Seed and timing noise: 95 % t-intervals, Welch's and paired t-tests (scipy), Holm's correction over every
comparison of one report (`Family`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Callable, NamedTuple, TypeVar

from scipy import stats as _scipy_stats

ALPHA = 0.05
LEVEL = 0.95
T = TypeVar("T")


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (4.303 for p 0.975, df 2)."""
    return float(_scipy_stats.t.ppf(p, df))


def half_width(std: float, n: int) -> float | None:
    """Half-width of the 95 % interval of a mean of n values with sample standard deviation `std`."""
    return t_quantile(0.5 + LEVEL / 2, n - 1) * std / math.sqrt(n) if n >= 2 else None


class Test(NamedTuple):
    """A two-sided test of a difference: the difference, its p-value (None: one value per side)."""

    diff: float
    p: float | None


def _no_spread(diff: float) -> Test:
    """A difference between values that do not vary: certain (p 0) unless it is 0 (p 1); scipy would give NaN."""
    return Test(diff, 1.0 if diff == 0 else 0.0)


def welch(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float, n_b: int) -> Test:
    """Welch's unequal-variance t-test of mean_a - mean_b (sample standard deviations)."""
    if n_a < 2 or n_b < 2:
        return Test(mean_a - mean_b, None)
    if std_a == std_b == 0:
        return _no_spread(mean_a - mean_b)
    t = _scipy_stats.ttest_ind_from_stats(mean_a, std_a, n_a, mean_b, std_b, n_b, equal_var=False)
    return Test(mean_a - mean_b, float(t.pvalue))


def paired(diffs: list[float]) -> Test:
    """One-sample t-test of paired differences (seed by seed) against 0."""
    if len(diffs) < 2:
        return Test(diffs[0] if diffs else math.nan, None)
    mean = statistics.fmean(diffs)
    if statistics.stdev(diffs) == 0:
        return _no_spread(mean)
    return Test(mean, float(_scipy_stats.ttest_1samp(diffs, 0).pvalue))


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: the k-th smallest of m is multiplied by
    m - k + 1, made non-decreasing along that order and capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = accumulate((min(1.0, (m - k) * pvalues[i]) for k, i in enumerate(order)), max)
    return [p for _, p in sorted(zip(order, adjusted))]


@dataclass
class Family:
    """The comparisons of one report, judged together: `judged` records every test in call order, then answers
    each from its Holm-adjusted p-value over the whole family."""

    adjusted: list[float] | None = None
    tests: list[Test] = field(default_factory=list)
    _seen: dict = field(default_factory=dict)

    def beyond(self, test: Test, key=None) -> bool | None:
        """True when `test` rejects at ALPHA after the correction, False when not, None without a p-value.
        A comparison made again under the same `key` (a table cell and its sentence) counts once."""
        if test.p is None:
            return None
        i = self._seen.setdefault(object() if key is None else key, len(self.tests))  # no key: always a new test
        if i == len(self.tests):
            self.tests.append(test)
        return (test.p if self.adjusted is None else self.adjusted[i]) < ALPHA

    @property
    def size(self) -> int:
        return len(self.tests)

    def note(self) -> str:
        """How this family's verdicts were reached, for the text under a report's tables."""
        return (f"*Beyond noise*: the two-sided t-test rejects at {ALPHA:.0%} after Holm's correction over the "
                f"{self.size} comparison{'s' * (self.size != 1)} with a test in this report; otherwise *within noise*.")


def judged(build: Callable[[Family], T]) -> tuple[T, Family]:
    """`build(family)` run twice: once to collect its tests, once with their Holm-adjusted p-values."""
    first = Family()
    build(first)
    final = Family(holm([t.p for t in first.tests]))
    result = build(final)
    assert [t.p for t in final.tests] == [t.p for t in first.tests], "a report table must be deterministic"
    return result, final
