"""The GPU a step is compiled and priced for: a row of the device table (`--target h100-80gb:8`), a file
(`--target-config FILE[:N]`), and the one `--target` flag group every command that predicts shares.

A `--target-config` file is either a GpuTargetConfigProto in text form (compiler fields only: the step compiles,
and its time is priced when its `device_description_str` names a row of the device table) or a TOML file of a
GPU the table lacks, compiler fields and rates together (TargetFile; docs/memory.md has an example), which
compiles and is priced like a row.

XLA's GPU compiler runs on a CPU-only machine with the CUDA plugin installed (the `gpu-compile` extra):
`jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=TEXT)` gives abstract GPUs.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from jaxlm.analysis.devices import DEVICES, TARGETS, CudaTarget, Device, find
from jaxlm.core import platform
from jaxlm.core.errors import ConfigError, DataError, MissingExtra, UsageError
from jaxlm.core.typedconfig import from_dict

EXTRA = "pip install -e '.[gpu-compile]'"
LABEL = "compiled for {device} (the GPU compiler's plan), not measured"
PREDICTED = "predicted from the compiled program for {device}, not measured"


@dataclass(frozen=True)
class TargetFile:
    """A GPU the device table lacks (`--target-config FILE.toml`): what compiling for it needs and the rates its
    kernels are priced at. Rates are the datasheet's (bytes/s, dense FLOP/s, one-way links); the achieved share
    of each is the device table's rule for a GPU without measurements."""

    description: str  # the device name CUDA reports
    memory_bytes: int
    bandwidth: float
    peak_bfloat16: float
    sms: int
    compute_capability: list[int]
    clock_ghz: float  # boost clock
    l2_bytes: int
    shared_per_sm: int
    shared_per_block_optin: int
    threads_per_sm: int
    fp32_per_sm: int = 128
    peak_tf32: float | None = None
    peak_float32: float | None = None
    host_link: float | None = None
    link: float | None = None

    def device(self, name: str) -> Device:
        cuda = CudaTarget(tuple(self.compute_capability), self.sms, self.fp32_per_sm, self.l2_bytes, self.clock_ghz,
                          self.shared_per_sm, self.shared_per_block_optin, self.threads_per_sm)
        peaks = {"bfloat16": self.peak_bfloat16, "float16": self.peak_bfloat16, "tf32": self.peak_tf32,
                 "float32": self.peak_float32}
        return Device(name, self.description, self.description, self.memory_bytes, self.bandwidth,
                      {k: v for k, v in peaks.items() if v}, cuda, link=self.link, host_link=self.host_link)


@dataclass(frozen=True)
class Target:
    """`count` GPUs described by `config` (GpuTargetConfigProto text); `flag`: how the user named them; `row`: the
    GPU's rates when they came from a file."""

    name: str
    config: str
    count: int = 1
    flag: str = "--target"
    row: Device | None = field(default=None, compare=False)

    @property
    def description(self) -> str:
        m = re.search(r'device_description_str:\s*"([^"]*)"', self.config)
        return m.group(1) if m else self.name

    @property
    def memory_bytes(self) -> int:
        return int(re.search(r"device_memory_size:\s*(\d+)", self.config).group(1))

    @property
    def label(self) -> str:
        return LABEL.format(device=self._devices)

    @property
    def predicted_label(self) -> str:
        return PREDICTED.format(device=self._devices)

    @property
    def _devices(self) -> str:
        return self.description + (f" x{self.count}" if self.count > 1 else "")

    @property
    def device(self) -> Device | None:
        """The GPU's rates: its file's, the device table's row, or the row a config file's description names."""
        return self.row or (DEVICES.get(self.name) if self.name in TARGETS else find(self.description))


def _count(text: str, flag: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{flag}: the GPU count after ':' must be a positive integer, got {text!r}")
    return int(text)


def _from_file(config_file: str | Path) -> Target:
    counted = re.search(r":\d+$", str(config_file))
    path, _, n = str(config_file).rpartition(":") if counted else (config_file, "", "1")
    flag = f"--target-config {path}"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{flag}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if Path(path).suffix == ".toml":
        return _toml_target(Path(path), text, _count(n, "--target-config"), flag)
    for key in ("device_memory_size", "cuda_compute_capability", "core_count"):
        if key not in text:
            raise DataError(f"{flag}: no {key}; expected a GpuTargetConfigProto in text form or a .toml GPU "
                            "(see docs/memory.md)")
    return Target(Path(path).stem, text, _count(n, "--target-config"), flag)


def _toml_target(path: Path, text: str, count: int, flag: str) -> Target:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"{flag}: not valid TOML: {e}") from None
    required = [f.name for f in fields(TargetFile) if f.default is MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise DataError(f"{flag}: no {missing[0]}; a .toml GPU gives {', '.join(required)} (see docs/memory.md)")
    try:
        row = from_dict(TargetFile, data).device(path.stem)
    except ConfigError as e:
        raise DataError(f"{flag}: {e}") from None
    return Target(path.stem, row.config_text(), count, flag, row)


def parse_target(name: str | None, config_file: str | Path | None = None) -> Target:
    """"h100-80gb" or "h100-80gb:8" (a GPU of jaxlm.analysis.devices, times 8), or a file (count: "FILE:8"): a
    GpuTargetConfigProto in text form, or a .toml GPU with its rates (TargetFile)."""
    if config_file is not None:
        return _from_file(config_file)
    base, _, n = name.partition(":")
    if base not in TARGETS:
        raise UsageError(f"--target {name}: unknown GPU; known: {', '.join(TARGETS)} (or --target-config FILE)")
    return Target(base, DEVICES[base].config_text(), _count(n or "1", "--target"), f"--target {name}")


def add_target_args(parser: argparse.ArgumentParser, does: str) -> argparse._ArgumentGroup:
    """The `--target` flag group of every command that compiles for a GPU; `does`: what the command then does
    ("report the compiler's plan")."""
    g = parser.add_argument_group("compile for a GPU, on any machine (the gpu-compile extra; docs/memory.md)")
    which = g.add_mutually_exclusive_group()
    which.add_argument("--target", metavar="GPU[:N]", help=f"compile for N of a known GPU ({', '.join(TARGETS)}; N: "
                       f"the mesh of parallel.*) and {does}; nothing runs")
    which.add_argument("--target-config", metavar="FILE[:N]", help="the same for another GPU: a GpuTargetConfigProto "
                       "text file, or a .toml file with its rates (docs/memory.md)")
    g.add_argument("--calibration", metavar="FILE", help="scale predicted kernel times by a GPU's measured over "
                   "predicted (the GPU campaign's profile step writes one); default: the calibration committed for "
                   "the target, if any ('none': without)")
    return g


def require_compiler() -> None:
    """Stop in one line unless XLA's GPU compiler (the CUDA plugin) is installed."""
    if not platform.cuda_plugin_installed():
        raise MissingExtra(f"--target needs XLA's GPU compiler (jax-cuda12-plugin and -pjrt at jaxlib's version, "
                           f"cuDNN): it comes with the 'gpu-compile' extra: {EXTRA}")


@functools.cache
def devices(target: Target) -> tuple:
    """The target's abstract GPUs (jax.experimental.topologies), one per `count`. What XLA logs while reading
    the target (a malformed config's parse error) goes into the one-line refusal, not onto the terminal."""
    require_compiler()
    from jax.experimental import topologies

    log: list[str] = []
    try:
        with platform.plugin_noise_filtered(kept=log):
            topo = topologies.get_topology_desc(platform="cuda", target_config=target.config,
                                                topology=f"1x1x{target.count}")
    except Exception as e:  # a malformed config file, or a CUDA backend that failed to start
        raise UsageError(refusal(target, e, log)) from None
    sys.stderr.write("".join(log))  # what the compiler said about a target it took
    return tuple(topo.devices)


def refusal(target: Target, error: Exception, log: list[str]) -> str:
    """One line for a target the compiler refused: where a config file fails to parse, and JAX_PLATFORMS=cpu
    as advice only where it is not what is already set."""
    parse = next((line for line in log if "Error parsing text-format" in line), None)
    if parse is not None:
        where = parse.split("GpuTargetConfigProto: ", 1)[-1].strip()
        return f"{target.flag}: not a GpuTargetConfigProto in text form ({where}; see docs/memory.md)"
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    helps = os.environ.get("JAX_PLATFORMS") != "cpu"
    advice = "; on a machine without a GPU run with JAX_PLATFORMS=cpu" if helps else ""
    return f"{target.flag}: the GPU compiler refused the target ({first}){advice}"
