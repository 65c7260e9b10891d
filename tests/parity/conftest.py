"""The parity tests compare against PyTorch (torchref, parity): without the torch extra the folder is skipped,
naming it."""

import pytest

from jaxlm.core import extras

torch = pytest.importorskip("torch", reason=extras.missing_message("torch"))

# The suite's tensors are tiny: torch's OpenMP pool only spins against the JAX
# threads and the other pytest-xdist worker (a 1 s test took 70 s that way).
torch.set_num_threads(1)
