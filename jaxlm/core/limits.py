"""How much host memory this process may still use, and which limit says so.

Three limits can bind before the machine runs out: the kernel's available memory (/proc/meminfo
MemAvailable), the memory limit of the process's control group (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``, at its own level or any level above: what Slurm's ``--mem`` and container
runtimes set, enforced by the OOM killer with a silent exit 137), and its address-space limit
(RLIMIT_AS, ``ulimit -v``, under which allocations fail). `host_memory` returns the tightest, each
minus what is already in use; `describe_limits` names the ones set, for an out-of-memory line.
"""

from __future__ import annotations

import resource
from pathlib import Path

from jaxlm.core.units import binary

UNLIMITED_V1 = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def _meminfo_available(proc: Path) -> int | None:
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        return None
    kib = next((line.split()[1] for line in lines if line.startswith("MemAvailable:")), None)
    return int(kib) * 1024 if kib is not None and kib.isdigit() else None


def _cgroup_dirs(proc: Path, cgroup_root: Path) -> list[tuple[Path, str, str]]:
    """(directory, limit file, usage file) of the process's memory cgroup and each level above it."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            base, files = cgroup_root, ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = cgroup_root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        here = base / path.lstrip("/")
        if not here.is_dir():  # a cgroup namespace shows its own root at the mount point
            here = base
        for d in [here, *here.parents]:
            if d == base.parent:
                break
            found.append((d, *files))
    return found


def _cgroup_left(proc: Path, cgroup_root: Path) -> tuple[int, int, Path] | None:
    """(bytes left, limit, directory) of the tightest memory cgroup limit above this process, or None."""
    best = None
    for d, limit_file, usage_file in _cgroup_dirs(proc, cgroup_root):
        limit, usage = _read_int(d / limit_file), _read_int(d / usage_file)
        if limit is None or limit >= UNLIMITED_V1 or usage is None:
            continue
        left = max(limit - usage, 0)
        if best is None or left < best[0]:
            best = (left, limit, d)
    return best


def _address_space_left(proc: Path) -> tuple[int, int] | None:
    """(bytes left, limit) under RLIMIT_AS (`ulimit -v`), or None without one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        lines = (proc / "self" / "status").read_text().splitlines()
        used = next(int(line.split()[1]) * 1024 for line in lines if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        used = 0
    return max(soft - used, 0), soft


def host_limits(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[tuple[int, str]]:
    """(bytes this process may still allocate, what sets it) for every limit found."""
    out = []
    available = _meminfo_available(proc)
    if available is not None:
        out.append((available, "this host has available"))
    cgroup = _cgroup_left(proc, cgroup_root)
    if cgroup is not None:
        out.append((cgroup[0], f"the memory cgroup {cgroup[2]} (limit {binary(cgroup[1])}, e.g. Slurm's --mem or a "
                               "container's) leaves"))
    space = _address_space_left(proc)
    if space is not None:
        out.append((space[0], f"the address-space limit (ulimit -v, RLIMIT_AS {binary(space[1])}) leaves"))
    return out


def host_memory(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> tuple[int, str] | None:
    """The tightest of `host_limits`: (bytes, what sets it), or None where none can be read."""
    limits = host_limits(proc, cgroup_root)
    return min(limits, key=lambda x: x[0]) if limits else None


def describe_limits(proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> str:
    """The limits set on this process (cgroup, ulimit -v), for an out-of-memory line; '' when none is set."""
    parts = []
    cgroup = _cgroup_left(proc, cgroup_root)
    if cgroup is not None:
        parts.append(f"the memory cgroup {cgroup[2]} limits it to {binary(cgroup[1])}")
    space = _address_space_left(proc)
    if space is not None:
        parts.append(f"`ulimit -v` (RLIMIT_AS) limits its address space to {binary(space[1])}")
    return "; ".join(parts)


def is_out_of_memory(e: BaseException) -> bool:
    """A failed allocation: Python's MemoryError, or XLA's (RESOURCE_EXHAUSTED, or INTERNAL 'Out of memory')."""
    text = str(e)
    return isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in text or "Out of memory allocating" in text
