"""The one timing loop of every benchmark, and how busy the machine was while it ran.

`time_calls` runs a call untimed (warm-up, then the settling below) and then times each call to
completion: `wait(out)` blocks on what the call returned (`jax.block_until_ready` for JAX, a device
synchronize for another framework; by default the call itself returns only when done). `Load` measures
the CPU time that *other* processes took while a block ran: a ratio of two frameworks' times taken on a
busy CPU says more about the other work than about either framework (one framework's threads may starve
under load while the other's do not), so such a ratio is marked and not printed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

# After a call, a framework's worker threads may spin for milliseconds before they sleep (OpenMP's do) and
# would take CPU from another framework's call that followed at once: in interleaved timing every call
# first runs untimed for this long.
SETTLE_S = 0.03
# Other processes' share of the machine's CPU time above which a timing counts as taken on a busy machine.
BUSY_SHARE = 0.1


class Timing(NamedTuple):
    seconds: list[float]  # wall seconds of each timed call, to completion
    cpu_s: float  # this process's CPU seconds over the timed calls (every thread)


def _done(out: Any) -> Any:
    return out


def settle(call: Callable[[], Any], wait: Callable[[Any], Any] = _done) -> None:
    """Run `call` untimed (at least once) until SETTLE_S have passed: the other framework's threads go quiet."""
    start = time.perf_counter()
    while True:
        wait(call())
        if time.perf_counter() - start >= SETTLE_S:
            return


def time_calls(call: Callable[[], Any], steps: int, *, warmup: int = 0, wait: Callable[[Any], Any] = _done,
               settled: bool = False) -> Timing:
    """Wall seconds of each of `steps` calls of `call()`, each waited for with `wait(out)`, after `warmup`
    untimed calls and, with `settled`, after `settle`."""
    for _ in range(warmup):
        wait(call())
    if settled:
        settle(call, wait)
    seconds, cpu = [], time.process_time()
    for _ in range(steps):
        t = time.perf_counter()
        wait(call())
        seconds.append(time.perf_counter() - t)
    return Timing(seconds, time.process_time() - cpu)


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """(call(), its wall seconds): a one-off, e.g. a compilation."""
    t = time.perf_counter()
    out = call()
    return out, time.perf_counter() - t


def machine_busy_seconds() -> float | None:
    """CPU seconds every CPU of the machine has been busy since boot (Linux /proc/stat: user, nice, system,
    irq, softirq and steal, which counts other virtual machines); None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Snapshot(NamedTuple):
    wall_s: float
    own_cpu_s: float  # this process, every thread
    machine_busy_s: float | None  # every process (None: not readable here)


def snapshot() -> Snapshot:
    return Snapshot(time.perf_counter(), time.process_time(), machine_busy_seconds())


@dataclass
class Load:
    """`with Load() as load:` ... then `load.other_cpus`: how many CPUs other processes kept busy on average
    while the block ran (None where the machine's CPU time cannot be read), and `load.busy`."""

    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    other_cpus: float | None = None
    start: Snapshot | None = None

    def __enter__(self) -> "Load":
        self.start = snapshot()
        return self

    def __exit__(self, *exc) -> None:
        end, start = snapshot(), self.start
        wall = end.wall_s - start.wall_s
        if end.machine_busy_s is None or start.machine_busy_s is None or wall <= 0:
            return
        others = (end.machine_busy_s - start.machine_busy_s) - (end.own_cpu_s - start.own_cpu_s)
        self.other_cpus = max(others, 0.0) / wall

    @property
    def busy(self) -> bool | None:
        """Other processes took more than BUSY_SHARE of the machine's CPU time (None: not measured)."""
        return None if self.other_cpus is None else self.other_cpus > BUSY_SHARE * self.cpus

    def mark(self, record: dict) -> dict:
        """The reading on a row or result: `other_cpus` and `busy`."""
        record["other_cpus"], record["busy"] = self.other_cpus, self.busy
        return record


def withheld(what: str, records: list[dict]) -> str | None:
    """One line saying why a ratio is not printed, when any of `records` was timed on a busy machine."""
    busy = [r for r in records if r.get("busy")]
    if not busy:
        return None
    worst = max(r["other_cpus"] for r in busy)
    return (f"{what} withheld: other processes kept up to {worst:.1f} of this machine's {os.cpu_count()} CPUs busy "
            f"while it was timed (more than {BUSY_SHARE:.0%}); rerun on a quiet machine (the JSON keeps the figures, "
            "marked busy)")
