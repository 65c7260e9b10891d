"""jaxlm.core.host: large freed blocks stay in the malloc heap after the thresholds are raised; --threads limits both
frameworks through the CPU affinity."""

import os
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


THREADS_PROBE = """
import os, sys
from jaxlm.core.host import limit_cpu_threads
got = limit_cpu_threads(int(sys.argv[1])) if sys.argv[1] != "all" else len(os.sched_getaffinity(0))
import jax.numpy as jnp
(jnp.ones((64, 64)) @ jnp.ones((64, 64))).block_until_ready()  # the CPU backend and its thread pool are up
pool = sum(open(f"/proc/self/task/{t}/comm").read().strip() == "tf_XLAEigen" for t in os.listdir("/proc/self/task"))
print(got, len(os.sched_getaffinity(0)), pool, os.environ.get("OMP_NUM_THREADS"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="CPU affinity is Linux-only; needs 2 CPUs to see a limit")
def test_thread_limit_sizes_xla_thread_pool():
    """--threads N: the process runs on N CPUs and XLA starts N pool threads (an XLA flag did not limit them)."""
    def probe(n):
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        out = subprocess.run([sys.executable, "-c", THREADS_PROBE, n], capture_output=True, text=True, check=True,
                             env={**env, "JAX_PLATFORMS": "cpu"}).stdout.split()
        return int(out[0]), int(out[1]), int(out[2]), out[3]

    got, cpus, pool, omp = probe("1")
    assert (got, cpus, pool, omp) == (1, 1, 1, "1")
    got, cpus, pool, _ = probe("all")
    assert pool == cpus == got >= 2
