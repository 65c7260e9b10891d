"""Hugging Face files without torch (the hf extra): jaxlm's own BPE written as a tokenizer.json encodes alike
(the `tokenizers` library as the reference), a tokenizer.json directory as a data tokenizer, a jaxlm-trained run
exported with its tokenizer, what a Llama config.json cannot say, and the missing extra named in one line."""

from __future__ import annotations

import json
import pickle

import pytest

from jaxlm.core import extras
from jaxlm.core.config import DataConfig
from jaxlm.core.errors import MissingExtra
from jaxlm.data.hf_tokenizer import HFTokenizer
from jaxlm.data.prepare import ensure_prepared, load_tokenizer_from_meta, read_meta, tokens
from jaxlm.data.tokenizer import byte_tokenizer, load_tokenizer

pytest.importorskip("tokenizers", reason=extras.missing_message("tokenizers"))


@pytest.fixture(scope="module")
def gpt2_json(cs336, tmp_path_factory):
    """GPT-2's vocabulary (CS336 fixtures) as jaxlm loads it, and written as a tokenizer.json directory."""
    from jaxlm.hf.tokenizer import to_tokenizer_json

    tok = load_tokenizer("gpt2")
    d = tmp_path_factory.mktemp("gpt2_json")
    (d / "tokenizer.json").write_text(to_tokenizer_json(tok))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.eot_id}))
    return tok, d


@pytest.mark.parametrize("name", ["corpus.en", "tinystories_sample.txt", "german.txt", "address.txt"])
def test_jaxlm_bpe_as_tokenizer_json_encodes_alike(gpt2_json, cs336, name):
    tok, d = gpt2_json
    hf = load_tokenizer(d)
    assert isinstance(hf, HFTokenizer) and hf.vocab_size == tok.vocab_size and hf.eot_id == tok.eot_id
    text = (cs336 / name).read_text(encoding="utf-8")[:20000]
    ids = tok.encode(text)
    assert hf.encode(text) == ids
    assert hf.decode(ids) == text and hf.decode_bytes(ids) == tok.decode_bytes(ids)


def test_the_byte_tokenizer_as_tokenizer_json():
    from jaxlm.hf.tokenizer import to_tokenizer_json

    tok = byte_tokenizer()
    hf = HFTokenizer(to_tokenizer_json(tok), {"eos_token_id": 256})
    text = "héllo <|endoftext|> wörld\n"
    assert hf.encode(text) == tok.encode(text) and hf.stop_ids == [256] and hf.bos_id is None


def test_a_tokenizer_json_directory_prepares_data(gpt2_json, cs336, tmp_path):
    """data.tokenizer = a tokenizer.json directory: its files travel with the data, its digest names it, and
    the workers (a pickled tokenizer) give the ids of one process."""
    tok, d = gpt2_json
    text = (cs336 / "tinystories_sample.txt").read_text(encoding="utf-8")
    (tmp_path / "in.txt").write_text(text)
    data = ensure_prepared(DataConfig(dir=str(tmp_path / "data"), source=[str(tmp_path / "in.txt")],
                                      tokenizer=str(d)), progress=False)
    meta = read_meta(data)
    assert {"tokenizer.json", "generation_config.json"} <= set(meta["tokenizer_files"])
    again = load_tokenizer_from_meta(data)
    assert isinstance(again, HFTokenizer) and meta["tokenizer_sha256"] == again.digest() == load_tokenizer(d).digest()
    ids = list(tokens(data, "train")) + list(tokens(data, "val"))
    assert [int(i) for i in ids] == tok.encode(text) + ([] if text.endswith("<|endoftext|>") else [tok.eot_id])
    assert pickle.loads(pickle.dumps(again)).encode(text[:500]) == tok.encode(text[:500])


def test_a_jaxlm_run_exports_with_its_tokenizer(tmp_path, capsys):
    """A run trained here (byte tokenizer) exports a tokenizer.json that encodes as the run's does."""
    from jaxlm import cli
    from jaxlm.cli import hf as hf_cli
    from jaxlm.core.config import load_config
    from jaxlm.training.loop import train
    from tests.train_helpers import make_corpus, tiny_overrides

    corpus = make_corpus(tmp_path / "corpus")
    train(load_config(None, tiny_overrides(corpus, tmp_path / "run", **{"train.steps": 2, "train.eval_every": 2})))
    assert cli.run(hf_cli.main, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_key_value_heads"] == 2 and config["head_dim"] == 16 and config["eos_token_id"] == 256
    hf = load_tokenizer(tmp_path / "out")
    assert hf.encode("The rain, <|endoftext|>") == byte_tokenizer().encode("The rain, <|endoftext|>")


def test_a_missing_extra_is_named_in_one_line(monkeypatch, capsys):
    from jaxlm import cli
    from jaxlm.cli import hf as hf_cli
    from jaxlm.core import extras

    real = extras.importlib.import_module

    def without_safetensors(name):
        if name.split(".")[0] == "safetensors":
            raise ModuleNotFoundError(f"No module named '{name}'", name="safetensors")
        return real(name)

    monkeypatch.setattr(extras.importlib, "import_module", without_safetensors)
    assert cli.run(hf_cli.main, ["export", "RUN", "--out", "DIR"]) == 1
    assert capsys.readouterr().err.strip() == ("error: safetensors is not installed; it comes with the 'hf' extra: "
                                               "pip install -e '.[hf]'")
    with pytest.raises(MissingExtra, match="'hf' extra"):
        extras.require("safetensors.numpy")


@pytest.mark.parametrize("key, value", [("norm", "post"), ("ffn", "silu"), ("rope", False), ("window", 8)])
def test_what_a_llama_config_cannot_say_is_refused_at_export(key, value):
    from jaxlm.core.config import ModelConfig
    from jaxlm.core.errors import ConfigError
    from jaxlm.hf.config import hf_config

    with pytest.raises(ConfigError, match=f"^model.{key} = {value!r}: .*no Hugging Face Llama equivalent$"):
        hf_config(ModelConfig(**{key: value}), {}, "float32")


def test_the_rotary_row_order_round_trips_and_pairs_the_halves():
    """Hugging Face's head rows [x0 x1 x2 | y0 y1 y2] become jaxlm's [x0 y0 x1 y1 x2 y2] and back."""
    import numpy as np

    from jaxlm.hf.weights import to_halves, to_interleaved

    hf = np.arange(2 * 6 * 3).reshape(12, 3)  # 2 heads of width 6, 3 inputs
    ours = to_interleaved(hf, 6)
    assert ours[:6, 0].tolist() == [hf[i, 0] for i in (0, 3, 1, 4, 2, 5)]
    assert ours[6:, 0].tolist() == [hf[i, 0] for i in (6, 9, 7, 10, 8, 11)]
    assert (to_halves(ours, 6) == hf).all()
