import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# The suite's tensors are tiny: torch's OpenMP pool only spins against the JAX
# threads and the other pytest-xdist worker (a 1 s test took 70 s that way).
torch.set_num_threads(1)


def _find_shared_data() -> Path | None:
    """$JAXLM_SHARED_DATA, else a `shared/data` beside the repository or one of its parents."""
    env = os.environ.get("JAXLM_SHARED_DATA")
    if env:
        return Path(env) if Path(env).is_dir() else None
    for parent in [REPO, *REPO.parents]:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only shared data directory (tinyshakespeare/, wikitext-2/, cs336/)."""
    path = _find_shared_data()
    if path is None:
        pytest.skip("shared data not found: set JAXLM_SHARED_DATA or put shared/data beside the repository")
    return path
