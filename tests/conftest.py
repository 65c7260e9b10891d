"""Fixtures for every test folder. Imports nothing beyond the core install: torch's settings live in
tests/parity/conftest.py, so the library's tests run on a bare `pip install -e .`."""

import os
import shutil
import tempfile
from pathlib import Path

from tests.train_helpers import TEST_XLA_FLAGS, missing_extra

# One persistent compilation cache per test session, set before JAX starts and inherited by the pytest-xdist
# workers and by every command a test runs: the suite compiles the same tiny programs again and again (a tiny
# training command spends most of its CPU time compiling). Compiled programs are keyed by their HLO, options and
# JAX version, so a cached one is the program a fresh compile would give.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jaxlm-tests-xla-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
# XLA:CPU's LLVM optimisations off: they cost a third of the suite's CPU time and buy nothing at its sizes. Results
# are checked against references with tolerances, or against a run compiled under the same flags.
if TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):  # once: pytest-xdist's workers inherit it
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()

from jaxlm.core import platform  # noqa: E402

platform.prepare()  # as every command does: CPU and a quiet JAX start where a CUDA plugin has no GPU

import pytest  # noqa: E402

from jaxlm.core.errors import DataError  # noqa: E402
from jaxlm.data.corpora import corpus_files  # noqa: E402

CORPUS_FIXTURES = ("cs336", "tinyshakespeare")


def pytest_collection_modifyitems(items):
    """A test that reads a corpus (through one of CORPUS_FIXTURES) is marked `corpus`: `-m corpus` selects them."""
    for item in items:
        if any(f in CORPUS_FIXTURES for f in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.corpus)


def pytest_runtest_setup(item):
    for mark in item.iter_markers("extra"):
        if why := missing_extra(*mark.args):
            pytest.skip(why)


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


def pytest_unconfigure(config):
    if _OWN_CACHE:  # the process that made the cache (the controller under pytest-xdist) removes it
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
