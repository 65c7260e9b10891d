"""Decoding against torchref: jaxlm's cache, no-cache path and sliding window equal torchref's full forward and
generate, on the same weights; torchref's own cache equals its full forward; the top-k/top-p filters agree."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import torchref
from jaxlm.nn.decode import Generator, filter_logits
from jaxlm.nn.model import TransformerLM
from parity.convert import torch_config, torch_to_jax
from tests.lib.test_generate import CFG, GREEDY, PROMPTS
from torchref.generate import filter_logits as torch_filter_logits
from torchref.generate import generate as torch_generate


@pytest.fixture(scope="module")
def torch_model():
    torch.manual_seed(0)
    return torchref.TransformerLM(torch_config(CFG)).eval()


@pytest.fixture(scope="module")
def gen(torch_model):
    """A Generator over the same weights as `torch_model`, traced at highest matmul precision by its callers."""
    return Generator(torch_to_jax(torch_model.state_dict(), TransformerLM(CFG, rngs=nnx.Rngs(1))))


def torch_cropped_greedy(model, prompt, n: int) -> list[int]:
    """nanoGPT's loop: each next token is the argmax of a full forward over the last context_length tokens."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(torch.argmax(model(torch.tensor([seq[-CFG.context_length:]]))[0, -1])))
    return seq[len(prompt):]


def test_window_slides_like_a_cropped_full_forward(gen, torch_model):
    """70 new tokens on a context of 40, rows of 2 to 60 prompt tokens: the cache equals torchref's full forward
    over each row's last 40 tokens (the no-cache path equals the cache: tests/lib/test_generate.py)."""
    prompts = [*PROMPTS, list(np.arange(60) % 67)]
    with jax.default_matmul_precision("highest"):
        cached = gen.generate(prompts, 70, GREEDY).tokens
    assert cached == [torch_cropped_greedy(torch_model, p, 70) for p in prompts]


def test_torchref_cache_equals_no_cache(torch_model):
    for p in PROMPTS:
        assert torch_generate(torch_model, p, 24, temperature=0) == torch_generate(
            torch_model, p, 24, temperature=0, use_cache=False
        )


def test_torchref_cache_logits_equal_full_forward(torch_model):
    x = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        full = torch_model(x)
        cache = torchref.model.KVCache(CFG.num_layers)
        parts = [torch_model(x[:, :9], kv_cache=cache)]
        parts += [torch_model(x[:, t : t + 1], kv_cache=cache) for t in range(9, 22)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)


def test_jax_equals_torchref_greedy(gen, torch_model):
    with jax.default_matmul_precision("highest"):
        got = gen.generate(PROMPTS, 24, GREEDY).tokens
    expected = [torch_generate(torch_model, p, 24, temperature=0) for p in PROMPTS]
    assert [len(t) for t in expected] == [24, 24, 18]  # torchref.generate stops at the context window
    assert [t[: len(e)] for t, e in zip(got, expected)] == expected


def test_torch_and_jax_filters_agree():
    x = np.random.default_rng(0).normal(size=(6, 67)).astype(np.float32) * 3
    for k, p in [(0, 0.9), (5, 1.0), (7, 0.5), (0, 0.0), (1, 1.0)]:
        j = np.asarray(filter_logits(x, k, p))
        t = torch_filter_logits(torch.from_numpy(x), k, p).numpy()
        np.testing.assert_array_equal(np.isfinite(j), np.isfinite(t))
        np.testing.assert_array_equal(j[np.isfinite(j)], t[np.isfinite(t)])
