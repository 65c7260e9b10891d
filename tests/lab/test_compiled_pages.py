"""deliverables.compiled_memory and compiled_time: a technique's label names its settings (deliverables.common),
and every row of both pages names a job the committed store holds (docs/results/compiled/h100-80gb.json; nothing
compiles here)."""

import json
from pathlib import Path

import pytest

from deliverables import compiled_memory, compiled_time
from deliverables.common import technique
from deliverables.compiled_memory import job

STORE = Path(__file__).resolve().parents[2] / "docs/results/compiled"


def test_a_techniques_label_names_its_dtype_remat_attention_and_window():
    assert technique("float32") == ("float32", "none", "xla", None)
    assert technique("bfloat16 + cuDNN + remat full") == ("bfloat16", "full", "cudnn", None)
    assert technique("bfloat16 + cuDNN + dots_saveable") == ("bfloat16", "dots_saveable", "cudnn", None)
    assert technique("bfloat16 + window 256") == ("bfloat16", "none", "xla", 256)
    assert job("small", 256, 4, "bfloat16 + cuDNN + window 32", mode="forward")["set"] == [
        "model.context_length=256", "data.batch_size=4", 'compute.dtype="bfloat16"', 'compute.remat="none"',
        'compute.attention="cudnn"', "model.window=32"]


@pytest.mark.parametrize("page", [compiled_memory, compiled_time], ids=lambda m: m.__name__)
def test_every_row_of_the_page_is_in_the_committed_store(page):
    import jax

    versions = {json.loads(k)[3] for k in json.loads((STORE / "h100-80gb.json").read_text())}
    if jax.__version__ not in versions:
        pytest.skip(f"no stored figure was compiled with jax {jax.__version__}")
    for s in page.sections():
        assert list(compiled_memory.cached(s.name, "h100-80gb", STORE, page.sections)) == [r[0] for r in s.rows]
    searched = compiled_memory.cached_at_largest("largest-batch", "h100-80gb", STORE)
    assert set(searched) == set(compiled_memory.TECHNIQUES[:6]) and all(at for _, at in searched.values())
