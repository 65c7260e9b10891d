"""The first loss of every preset, tied and untied, is within 0.5 nats of ln(vocab): a model that knows
nothing predicts every token at about 1 / vocab. Each preset with its vocabulary at a tiny width, one block
and a narrow feed-forward; the `extended` variant at the preset's own width (what sets the scale of the first
logits of a tied head)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxlm.core.config import PRESETS, load_config
from jaxlm.nn.loss import lm_loss
from jaxlm.training.step import build_model

TINY = ["model.d_model=64", "model.num_heads=4"]


@pytest.mark.parametrize("width", ["tiny", pytest.param("own", marks=pytest.mark.extended)])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_first_loss_is_about_ln_vocab(preset, tied, width):
    sets = [f"model.tie_embeddings={str(tied).lower()}", "model.num_layers=1", "model.d_ff=64",
            "model.context_length=32", "train.seed=1", *(TINY if width == "tiny" else [])]
    run = load_config(None, sets, preset=preset)
    cfg, model = run.model, build_model(run)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (8, 33)), jnp.int32)
    loss = float(lm_loss(model, tokens[:, :-1], tokens[:, 1:]))
    assert abs(loss - math.log(cfg.vocab_size)) < 0.5, (preset, tied, loss, math.log(cfg.vocab_size))
