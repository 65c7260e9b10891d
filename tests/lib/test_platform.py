"""jaxlm.core.platform: a machine with the CUDA plugin but no GPU starts JAX on CPU, quietly."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxlm.core import platform

ROOT = Path(__file__).resolve().parents[2]
NOISE = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
         "I0000 00:00:1795551618.936365   18448 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
         "GPU will not be used.\n")


def test_the_filter_drops_the_plugin_lines_and_keeps_the_rest(capfd):
    with platform.plugin_noise_filtered():
        os.write(2, NOISE.encode())
        os.write(2, b"a real warning\n")
        print("from python", file=sys.stderr)
        os.write(2, NOISE.encode())
    err = capfd.readouterr().err  # (pytest captures sys.stderr apart from fd 2, so the order may differ)
    assert sorted(err.splitlines()) == ["a real warning", "from python"]


@pytest.mark.skipif(platform.has_nvidia_driver() or not platform.cuda_plugin_installed(),
                    reason="needs the CUDA plugin (pip install -e '.[gpu-compile]') on a machine without a GPU")
def test_a_command_with_the_plugin_and_no_gpu_starts_on_cpu_quietly():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = "from jaxlm import cli\nimport jax\nprint(jax.default_backend(), jax.numpy.ones(2).sum())"
    r = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["cpu", "2.0"] and r.stderr == "", r.stderr[-2000:]
