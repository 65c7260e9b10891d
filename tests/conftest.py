from pathlib import Path

import pytest
import torch

from jaxlm.data.tokenizer import find_shared_data

REPO = Path(__file__).resolve().parents[1]

# The suite's tensors are tiny: torch's OpenMP pool only spins against the JAX
# threads and the other pytest-xdist worker (a 1 s test took 70 s that way).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only shared data directory (tinyshakespeare/, wikitext-2/, cs336/)."""
    path = find_shared_data(REPO)  # $JAXLM_SHARED_DATA, else shared/data beside the checkout or above it
    if path is None:
        pytest.skip("shared data not found: set JAXLM_SHARED_DATA or put shared/data beside the repository")
    return path
