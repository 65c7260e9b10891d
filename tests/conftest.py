"""Fixtures for every test folder. Imports nothing beyond the core install: torch's settings live in
tests/parity/conftest.py, so the library's tests run on a bare `pip install -e .`."""

from pathlib import Path

from jaxlm.core import platform

platform.prepare()  # as every command does: CPU and a quiet JAX start where a CUDA plugin has no GPU

import pytest  # noqa: E402

from jaxlm.core.errors import DataError  # noqa: E402
from jaxlm.data.corpora import corpus_files  # noqa: E402


def _corpus(name: str) -> Path:
    """ROOT/NAME from the data root ($JAXLM_DATA); the test is skipped, naming the download, without it."""
    try:
        return corpus_files(name, which="all")[0].parent
    except DataError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def cs336() -> Path:
    """The CS336 fixtures: GPT-2 vocabulary and merges, reference BPE, corpus.en, tokenizer samples."""
    return _corpus("cs336")


@pytest.fixture(scope="session")
def tinyshakespeare() -> Path:
    return _corpus("tinyshakespeare")
