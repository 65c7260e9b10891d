"""compute.loss_chunk against torchref: on torchref's weights, the chunked and the whole-logits loss equal
torchref's cross-entropy, tied or not (loss and gradients chunked vs whole: tests/lib/test_loss.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchref
from parity.convert import torch_config, torch_to_jax
from tests.lib.test_loss import CHUNKS, batch, build, cfg_for, loss_and_grads


# The chunked loss equals the whole-logits one to 1e-6 (tests/lib/test_loss.py), so against torchref the whole
# logits stand for both; each chunk size against torchref directly: the extended run.
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk", [0, *(pytest.param(c, marks=pytest.mark.extended) for c in CHUNKS)])
def test_chunked_and_whole_loss_equal_torchref(chunk, tie):
    cfg = cfg_for(tie_embeddings=tie)
    torch.manual_seed(0)
    ref = torchref.TransformerLM(torch_config(cfg))
    x, y = batch()
    loss_t = torchref.cross_entropy(ref(torch.tensor(np.asarray(x))), torch.tensor(np.asarray(y)))
    loss, _ = loss_and_grads(torch_to_jax(ref.state_dict(), build(cfg, chunk)), x, y)
    np.testing.assert_allclose(loss, loss_t.item(), rtol=1e-6)
