"""An imported checkpoint with its tokenizer.json, used as a pretrained model: the tokenizer against
transformers', generation, LoRA / QLoRA / QAT / full fine-tuning from it, and the fine-tuned run exported
back (merged weights, or PEFT adapters) and loaded by transformers and peft."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from jaxlm import cli
from jaxlm.cli import generate as generate_cli
from jaxlm.cli import lora as lora_cli
from jaxlm.core.config import load_config
from jaxlm.nn.decode import encode_prompt
from tests.parity.hf_models import SHAPES, hf_command, hf_logits, jaxlm_logits, llama, rel

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.xdist_group("hf_finetune")  # one worker builds the module's checkpoint and data once

TEXTS = ["ROMEO: What light through yonder window breaks?", "<|endoftext|>First Citizen:\nBefore we proceed",
         "  spaces,\ttabs and ünïcödé — ok", ""]
TOKENS = [[1, 5, 9, 3, 7, 2, 11, 4, 8, 6, 10, 12, 33, 40, 17, 60, 200, 250, 9, 51]]


def bpe_tokenizer(text: str, path) -> dict:
    """A byte-level BPE tokenizer.json of 300 entries trained on `text` whose post-processor puts <s> first (as
    Llama's do); returns the generation config naming its BOS and EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok.save(str(path))
    return {"bos_token_id": bos, "eos_token_id": eos}


def tokenizer_config(directory) -> None:
    """transformers' tokenizer_config.json (bos <s>, eos <|endoftext|>) beside the tokenizer.json in `directory`,
    written by transformers (its tokenizer.json left as it was)."""
    import tempfile

    from transformers import PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), bos_token="<s>",
                                eos_token="<|endoftext|>").save_pretrained(tmp)
        shutil.copyfile(f"{tmp}/tokenizer_config.json", directory / "tokenizer_config.json")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tinyshakespeare):
    """(tmp, the transformers model, its directory, the imported run, the training corpus): grouped-query
    attention, a vocabulary of 320 rows over the tokenizer's 300 ids (padded)."""
    tmp = tmp_path_factory.mktemp("pretrained")
    corpus = tmp / "corpus.txt"
    corpus.write_text((tinyshakespeare / "input.txt").read_text()[:60000])
    (tmp / "hf").mkdir()
    ids = bpe_tokenizer(corpus.read_text(), tmp / "hf" / "tokenizer.json")
    tokenizer_config(tmp / "hf")
    model = llama(tmp / "hf", **{**SHAPES["grouped_query"], "vocab_size": 320, **ids})
    assert hf_command("import", tmp / "hf", "--out", tmp / "run") == 0
    return tmp, model, tmp / "hf", tmp / "run", corpus


def test_the_tokenizer_encodes_as_transformers_does(pretrained):
    from transformers import PreTrainedTokenizerFast

    from jaxlm.training.checkpoint import restore_for_inference

    _, _, hf_dir, run, _ = pretrained
    _, cfg, tok = restore_for_inference(run)
    theirs = PreTrainedTokenizerFast(tokenizer_file=str(hf_dir / "tokenizer.json"))
    for text in TEXTS:
        assert tok.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
        assert encode_prompt(tok, text) == theirs(text)["input_ids"], text  # <s> first, as tokenizer(text) gives
        ids = tok.encode(text)
        assert tok.decode(ids) == theirs.decode(ids) and tok.decode_bytes(ids).decode() == theirs.decode(ids)
    generation = json.loads((hf_dir / "generation_config.json").read_text())
    assert tok.stop_ids == [generation["eos_token_id"]] and tok.bos_id == generation["bos_token_id"]
    assert tok.vocab_size == 300 and cfg.model.vocab_size == 320  # a padded vocabulary
    assert cfg.data.tokenizer == str(run / "tokenizer")


def test_generate_samples_from_the_imported_run(pretrained, capsys):
    _, _, _, run, _ = pretrained
    assert cli.run(generate_cli.main, ["--run", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "8",
                                       "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_without_tokenizer_json_the_weights_import_and_generation_asks_for_one(pretrained, tmp_path, capsys):
    """...and an export keeps config.json's bos/eos ids (issue 46, item 17: they were written as null, with an empty
    generation_config.json)."""
    from transformers import GenerationConfig

    tmp, _, hf_dir, _, _ = pretrained
    shutil.copytree(hf_dir, tmp_path / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (tmp_path / "hf" / name).unlink()
    capsys.readouterr()
    assert hf_command("import", tmp_path / "hf", "--out", tmp_path / "run") == 0
    assert "generation needs --tokenizer DIR" in capsys.readouterr().err
    argv = ["--run", str(tmp_path / "run"), "--prompt", "ROMEO:", "--max-new-tokens", "4", "--temperature", "0"]
    assert cli.run(generate_cli.main, argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--tokenizer" in err
    assert cli.run(generate_cli.main, [*argv, "--tokenizer", str(tmp / "run" / "tokenizer")]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    assert hf_command("export", tmp_path / "run", "--out", tmp_path / "out") == 0
    source = json.loads((hf_dir / "config.json").read_text())
    ids = {k: source[k] for k in ("bos_token_id", "eos_token_id")}
    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    assert None not in ids.values() and {k: exported[k] for k in ids} == ids
    generation = GenerationConfig.from_pretrained(tmp_path / "out")
    assert (generation.bos_token_id, generation.eos_token_id) == (ids["bos_token_id"], ids["eos_token_id"])


def fine_tune(pretrained, name: str, **extra):
    """A few steps of training from the imported run on its tokenizer's data; returns the run directory."""
    from jaxlm.training.loop import train

    tmp, _, _, run, corpus = pretrained
    sets = {"train.init_from": f'"{run}"', "train.out_dir": f'"{tmp / name}"', "train.steps": 8,
            "train.eval_every": 4, "data.dir": f'"{tmp / "data"}"', "data.source": f'["{corpus}"]',
            "data.batch_size": 4, "data.eval_tokens": 512, "model.context_length": 32, "optim.lr": 3e-2,
            "optim.warmup_steps": 0, "optim.cosine_steps": 8, "log.sample_tokens": 0, "log.progress": "false",
            "log.every": 1, "checkpoint.every": 8, "log.tensorboard": "false", **extra}
    train(load_config(run / "config.toml", [f"{k}={v}" for k, v in sets.items()]))
    return tmp / name


def _losses(run, kind: str = "train") -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[f"{kind}/loss"] for r in rows if r["kind"] == kind]


@pytest.mark.slow
def test_lora_fine_tune_exports_merged_weights_and_peft_adapters(pretrained):
    """Merged: transformers' logits of the export equal jaxlm's merged model. Adapters: peft's LoRA on the
    original checkpoint equals jaxlm's adapted model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jaxlm.nn import lora
    from jaxlm.training.checkpoint import restore_for_inference

    tmp, _, hf_dir, _, _ = pretrained
    run = fine_tune(pretrained, "lora", **{"lora.rank": 4, "lora.alpha": 8.0})
    assert all(np.isfinite(_losses(run)))
    adapted, _, tok = restore_for_inference(run)
    want_adapted = jaxlm_logits(adapted, TOKENS)
    lora.merge(adapted)
    assert hf_command("export", run, "--out", tmp / "lora_merged") == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp / "lora_merged").eval()
    assert rel(hf_logits(merged, TOKENS), jaxlm_logits(adapted, TOKENS)) < 1e-5
    assert AutoTokenizer.from_pretrained(tmp / "lora_merged")(TEXTS[0])["input_ids"] == encode_prompt(tok, TEXTS[0])
    # import -> fine-tune -> lora merge -> export keeps tokenizer_config.json (issue 46, item 17: the data
    # preparation dropped it, so AutoTokenizer had no bos/eos)
    assert cli.run(lora_cli.main, ["merge", str(run), "--out", str(tmp / "lora_run_merged")]) == 0
    assert hf_command("export", tmp / "lora_run_merged", "--out", tmp / "lora_run_merged_hf") == 0
    exported = AutoTokenizer.from_pretrained(tmp / "lora_run_merged_hf")
    assert (exported.bos_token, exported.eos_token) == ("<s>", "<|endoftext|>")
    assert hf_command("export", run, "--out", tmp / "lora_adapters", "--adapters") == 0
    config = json.loads((tmp / "lora_adapters" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(hf_dir) and config["r"] == 4
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf_dir), tmp / "lora_adapters").eval()
    assert rel(hf_logits(peft, TOKENS), want_adapted) < 1e-5
    assert rel(hf_logits(peft, TOKENS), hf_logits(AutoModelForCausalLM.from_pretrained(hf_dir), TOKENS)) > 1e-3


# QLoRA and QAT on an imported model repeat the kinds' own tests (tests/lib/test_peft.py) on other weights: extended.
@pytest.mark.slow
@pytest.mark.parametrize("name, extra", [
    pytest.param("qlora", {"lora.rank": 4, "lora.base": '"nf4"', "lora.block_size": 16}, marks=pytest.mark.extended),
    pytest.param("qat", {"qat.weight_bits": 8}, marks=pytest.mark.extended),
    ("full", {}),
])
def test_qlora_qat_and_full_fine_tunes_of_an_imported_model_train(pretrained, name, extra):
    run = fine_tune(pretrained, name, **extra)
    losses, evals = _losses(run), _losses(run, "eval")  # measured: 7.1-7.2 -> 4.7-5.8, evaluations 4.9-6.3 -> 4.6-5.9
    assert len(losses) == 8 and all(np.isfinite(losses)) and losses[-1] < losses[0] - 1.0, losses
    assert evals[-1] < evals[0], evals  # the held-out loss falls too
    if name == "full":  # post-training quantisation reads the fine-tuned run like any other
        from jaxlm.cli import quantize

        assert cli.run(quantize.main, [str(run), "--bits", "8", "--tokens", "256"]) == 0
