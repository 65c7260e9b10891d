"""Bad data: a failed prepare keeps the good data; a token file past the vocabulary is refused naming it; a
padded vocabulary never samples past the tokenizer."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from jaxlm.core.config import load_config
from jaxlm.core.errors import DataError
from tests.system.fault_helpers import tree
from tests.train_helpers import tiny_overrides

# --------------------------------------------------------------------------- data


def test_failed_prepare_keeps_good_data(tmp_path):
    from jaxlm.data.prepare import prepare

    good, bad, out = tmp_path / "good.txt", tmp_path / "bad.txt", tmp_path / "data"
    good.write_text("some good text\n" * 200)
    bad.write_bytes(b"valid start " * 100 + b"\xff\xfe")
    prepare([str(good)], "bytes", out, progress=False)
    before = tree(out)
    with pytest.raises(DataError, match="bad.txt: not valid UTF-8"):
        prepare([str(good), str(bad)], "bytes", out, progress=False)  # fails after encoding good.txt
    with pytest.raises(DataError, match="bad.txt: not valid UTF-8"):
        prepare([str(good)], "bytes", out, val_inputs=[str(bad)], progress=False)  # fails after train.bin
    with pytest.raises(DataError, match="bad.txt: not valid UTF-8"):
        prepare([str(bad)], "bytes", tmp_path / "new" / "deeper", progress=False)
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "data", "good.txt"]  # no temporaries
    killed = tmp_path / ".data.prepare-999999999"  # what a kill -9 mid-prepare leaves: cleared by the next one
    killed.mkdir()
    prepare([str(good)], "bytes", out, progress=False)
    assert not killed.exists()


def test_out_of_range_token_file_is_refused_naming_it(corpus, tmp_path):
    from jaxlm.training.loop import train

    data = tmp_path / "data"
    shutil.copytree(corpus, data)
    ids = np.fromfile(data / "train.bin", dtype=np.uint16)
    ids[1234] = 300  # model.vocab_size is 257; meta.json still records the old maximum
    ids.tofile(data / "train.bin")
    cfg = load_config(None, tiny_overrides(data, tmp_path / "run"))
    with pytest.raises(DataError, match=f"{data / 'train.bin'}: holds token id 300, but model.vocab_size = 257"):
        train(cfg)
    assert not (tmp_path / "run").exists()

# --------------------------------------------------------------------------- padded vocabularies


def test_a_padded_vocabulary_never_samples_past_the_tokenizer():
    """The padding ids get the only nonzero logits (the largest, almost surely, among them); neither greedy
    nor sampled decoding may draw one."""
    from flax import nnx

    from jaxlm.core.config import ModelConfig
    from jaxlm.nn.decode import Generator, SamplingParams
    from jaxlm.nn.model import TransformerLM

    model = TransformerLM(ModelConfig(vocab_size=300, context_length=32, d_model=32, num_layers=1, num_heads=2,
                                      d_ff=64), rngs=nnx.Rngs(0))
    model.lm_head.weight[...] = 10 * model.lm_head.weight[...].at[:257].set(0.0)  # (V, D): only padding rows
    prompt = [[1, 2, 3]]
    assert max(Generator(model).generate(prompt, 8, SamplingParams(0.0)).tokens[0]) >= 257  # the trap works
    gen = Generator(model, 257)  # sampling parameters are traced: one compilation per cache mode
    for sampling in (SamplingParams(0.0), SamplingParams(1.0), SamplingParams(1.0, top_k=5, top_p=0.9)):
        for use_cache in (True, False):
            out = gen.generate(prompt * 3, 8, sampling, seed=1, use_cache=use_cache)
            assert max(map(max, out.tokens)) < 257, (sampling, use_cache)


@pytest.mark.parametrize("progress", ["false", "true"])
def test_log_progress_covers_the_first_use_tokenisation(progress, tmp_path, capsys):
    """Issue 46, item 21: with log.progress = false the tokenisation that training's first use runs still drew
    its progress bar; with true it draws it (the test can fail either way)."""
    from jaxlm.training.preflight import prepare_data

    (tmp_path / "text.txt").write_text("words to tokenise\n" * 500)
    cfg = load_config(None, tiny_overrides(tmp_path / "data", tmp_path / "run", **{
        "data.source": f'["{tmp_path / "text.txt"}"]', "log.progress": progress}))
    prepare_data(cfg)
    err = capsys.readouterr().err
    assert "[jaxlm.data] preparing" in err
    assert ("%|" in err) == (progress == "true"), err
