"""Which platform JAX starts on, decided once before anything imports JAX (`prepare`).

With the CUDA plugin installed (the `gpu-compile` extra, or `jax[cuda12]`) on a
machine without an NVIDIA driver, a plain JAX start prints a plugin traceback and
picks CPU anyway, and even with ``JAX_PLATFORMS=cpu`` the plugin's libraries log
"Could not find cuda drivers" lines to fd 2 while they load (no environment
variable silences them). `prepare` makes such a machine behave as if the plugin
were not installed: it chooses ``cpu`` when JAX_PLATFORMS is unset, and loads JAX
and its plugins with fd 2 filtered. With a driver, or without a CUDA plugin,
nothing changes. The commands (`jaxlm.cli`) and the test suite call it first.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import tempfile
from typing import Iterator

NVIDIA_DRIVER = "/proc/driver/nvidia/version"  # present wherever the NVIDIA kernel driver is loaded
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
# What the plugin's libraries print while loading without a driver (absl's pre-init notice, cudart's stub).
PLUGIN_NOISE = re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
                          r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine")


def has_nvidia_driver() -> bool:
    return os.path.exists(NVIDIA_DRIVER)


def cuda_plugin_installed() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in CUDA_PLUGINS)


@contextlib.contextmanager
def plugin_noise_filtered(kept: list[str] | None = None) -> Iterator[None]:
    """fd 2 goes to a temporary file inside the block; afterwards every line but PLUGIN_NOISE is written
    to stderr, or appended to `kept` when given (the caller decides what reaches the terminal). The noise
    comes from C++ (absl), below sys.stderr, so only a file-descriptor swap catches it."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to protect
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            lines = [line for line in text.splitlines(keepends=True) if not PLUGIN_NOISE.search(line)]
            if kept is not None:
                kept += lines
            elif lines:
                sys.stderr.write("".join(lines))


def prepare() -> str | None:
    """Before JAX is imported: on a machine with a CUDA plugin but no NVIDIA driver, choose the CPU
    (when JAX_PLATFORMS is unset) and load JAX and its plugins quietly. Returns JAX_PLATFORMS."""
    if has_nvidia_driver() or "jax" in sys.modules or not cuda_plugin_installed():
        return os.environ.get("JAX_PLATFORMS")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with plugin_noise_filtered():
        import jax  # noqa: F401  (its import loads the plugin's CUDA libraries)
        from jax._src import xla_bridge

        # Plugin discovery loads the PJRT plugin's library (more noise); it only registers backend
        # factories, so jax.distributed and XLA_FLAGS set later still apply.
        getattr(xla_bridge, "_discover_and_register_pjrt_plugins", lambda: None)()
    return os.environ["JAX_PLATFORMS"]
