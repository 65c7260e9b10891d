"""Weight conversion between torchref and jaxlm, and numerical parity checks."""

from jaxlm.core import platform

platform.prepare()  # before any of its commands imports JAX: CPU and a quiet start where a CUDA plugin has no GPU
