"""The device a plan runs on, and whether a run's requirements are met there."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

from experiments.spec import RunSpec


@dataclass(frozen=True)
class Device:
    platform: str  # cpu | gpu | tpu
    kind: str  # jax.devices()[0].device_kind, "cpu" on CPUs
    count: int


def detect_device() -> Device:
    """Ask JAX in a child process, so this process never initialises (or preallocates on) the accelerator."""
    code = "import jax, json; d = jax.devices(); print(json.dumps([d[0].platform, d[0].device_kind, len(d)]))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
        platform, kind, count = json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as e:
        print(f"warning: could not query JAX devices ({e}); assuming cpu", file=sys.stderr)
        return Device("cpu", "cpu", 1)
    return Device(platform, "cpu" if platform == "cpu" else kind, count)


SOFTWARE = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "torch")


def software_versions() -> dict[str, str]:
    """Python and the installed versions of the packages results depend on (absent ones left out)."""
    found = {"python": platform.python_version()}
    for name in SOFTWARE:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


# Requirement name -> (is it met on this device?, default reason when not).
REQUIREMENTS: dict[str, tuple[Callable[[Device], bool], str]] = {
    "gpu": (lambda d: d.platform == "gpu", "needs an NVIDIA GPU"),
}


def unmet_requirement(spec: RunSpec, device: Device) -> str | None:
    """Why the run cannot happen on this device, or None. cuDNN attention implies 'gpu'."""
    needs, reason = spec.requires, spec.reason
    cudnn = spec.set.get("compute.attention") == "cudnn" or str(spec.args.get("attention", "")) == "cudnn"
    if needs is None and cudnn:
        needs, reason = "gpu", reason or "cuDNN flash attention needs an NVIDIA GPU (cuDNN)"
    if needs is None:
        return None
    met, default_reason = REQUIREMENTS[needs]
    if met(device):
        return None
    return f"{reason or default_reason}; this device is {device.kind} ({device.platform})"
