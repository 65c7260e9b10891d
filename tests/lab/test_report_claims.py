"""The facts the written report states: each against a hand-checked figure or an independent route."""

from __future__ import annotations

import re


def test_attention_share_is_the_estimators_attention_scores_entry():
    from experiments.report.short import attention_share

    # Hand-checked with jaxlm's own coefficients (issue 40): about 28 % at T = 256 and 60 % at T = 1024.
    shares = [int(x) for x in re.findall(r"(\d+)% at T", attention_share())]
    assert len(shares) == 2 and 25 <= shares[0] <= 31 and 57 <= shares[1] <= 63
