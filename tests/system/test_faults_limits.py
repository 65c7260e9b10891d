"""Memory limits set on the process (issue 36, item 13): `ulimit -v` (RLIMIT_AS) is seen by the preflight
(a cgroup's limit too: tests/lib/test_limits.py), and an allocation that still fails is one line naming the limit,
not "unexpected"."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from jaxlm.core import limits
from tests.system.fault_helpers import PY, one_error, run_rows, sets
from tests.train_helpers import env, make_corpus, tiny_overrides

GIB = 2**30


@pytest.mark.parametrize("d_ff", [3 * 2**20, 2**20], ids=["weights", "compiled-step"])
def test_the_preflight_holds_the_model_against_ulimit_v(tmp_path, d_ff):
    """6 GiB of address space (about 2.7 GiB of it mapped once JAX runs): 4.5 GiB of weights, or 1.5 GiB of weights
    whose train step (gradients, AdamW's moments) needs over 6 GiB, are refused before anything is allocated or
    written, naming the model's keys and the limit, where the host's own memory would have let the run start.
    Which check refuses (the weights before anything is built, or the compiled step) depends on how much address
    space JAX maps at start-up; either is the right refusal."""
    have = limits.host_memory()
    if have is None or have[0] < 8 * GIB:
        pytest.skip("the host itself has under 8 GiB available: its memory, not the limit, would bind")
    corpus = make_corpus(tmp_path / "corpus")
    big = {"model.d_model": 64, "model.num_heads": 2, "model.d_ff": d_ff}  # 2 layers x 3 x 64 x d_ff floats
    rows = [("jaxlm.train", sets(tiny_overrides(corpus, tmp_path / "run", **big)))]
    (got,) = run_rows(rows, tmp_path / "rows", address_space=6 * GIB)
    assert one_error(got, 2, "model.d_model = 64", "ulimit -v", "choose a smaller model") is None, got["stderr"]
    assert not (tmp_path / "run").exists()


RAISES = textwrap.dedent("""
    import resource, sys
    limit = int(sys.argv[1])
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    from jaxlm import cli

    def main(argv):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 799698052 bytes.")

    sys.exit(cli.run(main, []))
    """)


@pytest.mark.parametrize("limit", [64 * GIB, 0], ids=["ulimit-v", "none"])
def test_an_allocation_that_fails_is_one_line_naming_the_limits(limit):
    r = subprocess.run([PY, "-c", RAISES, str(limit)], env=env(), capture_output=True, text=True, timeout=300)
    got = {"code": r.returncode, "stderr": r.stderr}
    named = ("`ulimit -v` (RLIMIT_AS) limits its address space to 64.00 GiB" if limit
             else limits.describe_limits() or "no limit is set")  # a container's cgroup limit is named too
    assert one_error(got, 1, "out of memory (RESOURCE_EXHAUSTED", named) is None, r.stderr
