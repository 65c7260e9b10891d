"""jaxlm.host: large freed blocks stay in the malloc heap after the thresholds are raised."""

import subprocess
import sys

import pytest

PROBE = """
import sys, numpy as np, psutil
from jaxlm.core.host import keep_large_allocations_in_heap
applied = keep_large_allocations_in_heap() if sys.argv[1] == "tuned" else False
proc = psutil.Process()
before = proc.memory_info().rss
a = np.ones(200 * 2**20, dtype=np.uint8)  # 200 MiB through malloc, every page touched
del a
print(applied, (proc.memory_info().rss - before) / 2**20)
"""


def rss_kept_mib(mode: str) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_freed_temporaries_stay_in_the_heap():
    applied, kept = rss_kept_mib("tuned")
    assert applied
    assert kept > 150  # the 200 MiB block was kept for reuse, not unmapped
    _, kept_default = rss_kept_mib("default")
    assert kept_default < 50  # glibc's default: a block that large is mmap'ed and returned on free
