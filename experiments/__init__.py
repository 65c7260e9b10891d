"""The lab: study plans and their runner.

It may import jaxlm, parity and torchref; deliverables/ builds on it and nothing else imports it (docs/code.md).
The plan format is `spec` (a run's fields) and `plan` (the file); `commands`, `device`, `estimate` and `run`
(with `child`, its child process) execute it; `results` reads what runs leave.
"""

from jaxlm.core import platform

platform.prepare()  # before any of its commands imports JAX: CPU and a quiet start where a CUDA plugin has no GPU
