"""jaxlm.core.limits on made-up /proc and cgroup trees: the tightest of MemAvailable, the memory cgroup (v1 and
v2, at the process's own level or above) and RLIMIT_AS is what a CPU run may use, named."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxlm.core import limits

GIB = 2**30


def _tree(tmp_path: Path, cgroup_line: str, available_kib: int) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal:  99999999 kB\nMemAvailable:  {available_kib} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    (proc / "self" / "status").write_text("VmSize:  1048576 kB\n")
    return proc, root


def _write(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")


@pytest.fixture(autouse=True)
def no_address_space_limit(monkeypatch):
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (limits.resource.RLIM_INFINITY,) * 2)


def test_cgroup_v2_limit_of_a_slurm_job_binds(tmp_path):
    proc, root = _tree(tmp_path, "0::/system.slice/slurmstepd.scope/job_7/step_0", 32 * 1024 * 1024)
    _write(root / "system.slice/slurmstepd.scope/job_7", {"memory.max": str(4 * GIB), "memory.current": str(GIB)})
    _write(root / "system.slice/slurmstepd.scope/job_7/step_0", {"memory.max": "max", "memory.current": str(GIB)})
    left, what = limits.host_memory(proc, root)
    assert left == 3 * GIB and "job_7" in what and "limit 4.00 GiB" in what
    assert "limits it to 4.00 GiB" in limits.describe_limits(proc, root)


def test_cgroup_v1_limit_and_its_unlimited_value(tmp_path):
    proc, root = _tree(tmp_path, "4:memory:/docker/abc", 16 * 1024 * 1024)
    _write(root / "memory/docker/abc", {"memory.limit_in_bytes": str(2 * GIB),
                                            "memory.usage_in_bytes": str(GIB // 2)})
    _write(root / "memory", {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": str(8 * GIB)})
    assert limits.host_memory(proc, root)[0] == 3 * GIB // 2
    _write(root / "memory/docker/abc", {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "1"})
    assert limits.host_memory(proc, root) == (16 * GIB, "this host has available")
    assert limits.describe_limits(proc, root) == ""


def test_address_space_limit_binds_minus_what_is_mapped(tmp_path, monkeypatch):
    proc, root = _tree(tmp_path, "0::/", 64 * 1024 * 1024)
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (3 * GIB, limits.resource.RLIM_INFINITY))
    left, what = limits.host_memory(proc, root)
    assert left == 2 * GIB and "ulimit -v" in what  # 3 GiB less the 1 GiB VmSize
    assert "ulimit -v" in limits.describe_limits(proc, root)


def test_out_of_memory_is_recognised():
    assert limits.is_out_of_memory(MemoryError())
    assert limits.is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 799698052 bytes."))
    assert limits.is_out_of_memory(RuntimeError("INTERNAL: Error dispatching computation: Out of memory allocating 7"))
    assert not limits.is_out_of_memory(RuntimeError("INTERNAL: something else"))
