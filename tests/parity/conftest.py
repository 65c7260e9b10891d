"""The parity tests compare against PyTorch (torchref, parity). Without the torch extra each module is skipped,
the reason naming the extra; with it, torch runs on one thread."""

import importlib.util

import pytest

from jaxlm.core import extras

if importlib.util.find_spec("torch") is None:

    class _NeedsTorch(pytest.Module):
        """A test module left unimported: it imports torch at the top."""

        def collect(self):
            pytest.skip(extras.missing_message("torch"), allow_module_level=True)

    def pytest_pycollect_makemodule(module_path, parent):
        return _NeedsTorch.from_parent(parent, path=module_path)

else:
    import torch

    # The suite's tensors are tiny: torch's OpenMP pool only spins against the JAX
    # threads and the other pytest-xdist worker (a 1 s test took 70 s that way).
    torch.set_num_threads(1)
