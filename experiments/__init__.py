"""The lab: study plans and their runner, reports, the GPU campaign and the analytical answers.

It may import jaxlm, parity and torchref; nothing imports it (docs/code.md). The plan format is
`spec` (a run's fields) and `plan` (the file); `commands`, `device`, `estimate` and `run` execute
it; `results` reads what runs leave; `report/`, `gpu/` and `answers` turn that into documents.
"""

from jaxlm.core import platform

platform.prepare()  # before any of its commands imports JAX: CPU and a quiet start where a CUDA plugin has no GPU
