"""Every remat policy on both layer layouts through the whole training command, the end-of-run sample included
(it slides past the context, so the full forward runs inside the decoding loop), and `generate` on such a run.
Remat without scanned layers used to crash the sample (an NNX transform inside a `while_loop`)."""

from __future__ import annotations

import pytest

from jaxlm.nn.remat import POLICIES
from tests.system.fault_helpers import one_error, run_rows, sets
from tests.train_helpers import make_corpus, tiny_overrides

LAYOUTS = {"unrolled": "false", "scanned": "true"}


@pytest.mark.parametrize("combos", [
    pytest.param([("full", "unrolled")], id="full-unrolled"),
    pytest.param([(p, lay) for p in POLICIES for lay in LAYOUTS], id="all", marks=pytest.mark.extended),
])
def test_remat_policies_and_layouts_train_and_sample(combos, tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    rows = [("jaxlm.train", sets(tiny_overrides(corpus, tmp_path / f"{p}-{lay}", **{
        "train.steps": 2, "train.eval_every": 2, "checkpoint.every": 2, "data.eval_tokens": 64,
        "log.sample_tokens": 40, "log.tensorboard": "false", "compute.remat": f'"{p}"',
        "compute.scan_layers": LAYOUTS[lay]}))) for p, lay in combos]
    rows.append(("jaxlm.generate", ["--run", tmp_path / "full-unrolled", "--prompt", "x", "--max-new-tokens", "40"]))
    results = run_rows(rows, tmp_path)
    failures = [f"{combo}: {one_error(got, 1)}" for combo, got in zip([*combos, "generate"], results)
                if got["code"] != 0]
    assert not failures, "\n".join(failures)
    for (p, lay), got in zip(combos, results):
        assert (tmp_path / f"{p}-{lay}" / "checkpoints" / "2").is_dir(), (p, lay, got["stderr"][-2000:])
