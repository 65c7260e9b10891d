"""The lab: study plans and their runner (docs/experiments.md; its modules: docs/code.md). It may import jaxlm,
parity and torchref; deliverables/ builds on it and nothing else imports it."""

from jaxlm.core import platform

platform.prepare()  # before any of its commands imports JAX: CPU and a quiet start where a CUDA plugin has no GPU
