"""Small Llama checkpoints built with transformers from a config with random weights (nothing downloaded), and
the jaxlm side of the comparisons: the tests of Hugging Face import and export (tests/parity/test_hf*.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from jaxlm import cli
from jaxlm.cli import hf as hf_cli

BASE = dict(vocab_size=67, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
# The four shapes: multi-head; grouped-query (8 query / 2 key-value heads); tied embeddings; Llama 3 RoPE scaling
# with a head width apart from d_model / num_heads whose halves are odd (18 = 2 x 9; RoPE needs an even width).
SHAPES = {
    "multi_head": dict(),
    "grouped_query": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2),
    "tied": dict(tie_word_embeddings=True),
    "llama3_rope": dict(head_dim=18, num_key_value_heads=2, rope_theta=500000.0, rope_scaling=LLAMA3),
}
PROMPT = [[1, 5, 9, 3, 7, 2, 11, 4, 8, 6, 10, 12, 33, 40, 17, 60, 2, 2, 9, 51]]


def llama(directory: Path, seed: int = 0, max_shard_size: str | None = None, **overrides):
    """A LlamaForCausalLM with random weights of scale 0.2 (norm weights 1 +- 0.1, so their mapping shows),
    saved to `directory` as safetensors; returns the (float32, eval) model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kw)
    return model


def hf_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


def rel(a, b) -> float:
    """max |a - b| / max |b|: the logits' difference relative to their scale."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def hf_command(*argv) -> int:
    return cli.run(hf_cli.main, [str(a) for a in argv])


def jaxlm_model(run, dtype: str = "float32"):
    """The run's model (and config), computing in `dtype`."""
    import dataclasses

    from jaxlm.training.checkpoint import load_for_generation, read_run_config

    cfg = read_run_config(run)
    cfg = dataclasses.replace(cfg, compute=dataclasses.replace(cfg.compute, dtype=dtype))
    model, _ = load_for_generation(run, cfg, tokenizer="bytes")
    return model, cfg


def jaxlm_logits(model, tokens) -> np.ndarray:
    import jax.numpy as jnp

    return np.asarray(model(jnp.asarray(tokens)), np.float32)


def params(run) -> dict:
    """{path: numpy array} of the run's parameters."""
    from flax import nnx

    from jaxlm.training.checkpoint import restore_for_inference

    model, _, _ = restore_for_inference(run)
    return {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
