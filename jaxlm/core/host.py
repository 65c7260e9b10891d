"""Host-side tuning for CPU runs: keep large temporary buffers in the malloc heap; limit the CPUs a
benchmark runs on (`limit_cpu_threads`); describe the machine a timing ran on.

XLA:CPU allocates each step's temporaries (tens of MB for a small model) with
malloc and frees them after the call. glibc serves blocks above its mmap
threshold with fresh `mmap` pages and returns them on free, so every call
page-faults its whole temp buffer again: on the shakespeare_char model that was
about a third of a train step (29.8 -> 19.6 ms, see docs/benchmarks.md). Raising
the mmap and trim thresholds keeps those blocks in the heap and reuses them.
The cost is that freed memory stays with the process; GPU runs are unaffected
(device memory has its own allocator).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from jaxlm.core.errors import UserError

M_TRIM_THRESHOLD = -1  # glibc mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 1 << 30  # blocks up to 1 GiB come from (and return to) the heap

_done = False


def keep_large_allocations_in_heap() -> bool:
    """Raise glibc's mmap/trim thresholds once per process; False where not glibc (macOS, musl)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES))
    return _done


def tune_for_cpu_backend() -> bool:
    """Apply `keep_large_allocations_in_heap` when JAX computes on the host CPU (the CLIs call this)."""
    import jax

    return jax.default_backend() == "cpu" and keep_large_allocations_in_heap()


def limit_cpu_threads(n: int) -> int:
    """Run this process, and so both frameworks, on n of its CPUs; returns how many it got (n or fewer).

    Must run before JAX starts its CPU backend: XLA sizes its thread pool (the dots' threads
    too) from the CPUs the process may run on, and threads started later inherit the set.
    OpenMP is told by OMP_NUM_THREADS (a framework loaded later follows it; one already loaded is told by
    its caller).
    """
    import os

    if not hasattr(os, "sched_setaffinity"):
        raise UserError(f"--threads {n}: limiting the CPU threads needs CPU affinity, which this OS "
                        "(not Linux) does not offer; leave --threads out")
    cpus = sorted(os.sched_getaffinity(0))[:n]
    os.sched_setaffinity(0, cpus)
    os.environ["OMP_NUM_THREADS"] = str(len(cpus))
    return len(cpus)


def describe() -> dict:
    """The machine a measurement ran on: CPU model (with its family and model numbers, which name the
    generation where a virtual machine shows only "Intel(R) Xeon(R) Processor"), cores, vector extensions
    and the 1-minute load average.

    Timings on a CPU depend on all of them (XLA:CPU and PyTorch use AVX-512 and AMX where present), so
    every benchmark record carries them."""
    import os
    import platform

    fields = {"model name": platform.processor() or platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "cpu family", "model", "flags"):
                    fields[key.strip()] = value.strip()
                if not line.strip() and "flags" in fields:
                    break  # the first processor's block is enough
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    vector = [x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in flags]
    family = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else None
    return {"cpu_model": fields["model name"], "cpu_family_model": family, "cpus": os.cpu_count(),
            "vector_extensions": vector, "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
