"""LoRA against torchref: the adapted logits, which parameters train, their gradients, and the merge."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

import torchref
from jaxlm.nn import lora
from jaxlm.nn.loss import cross_entropy
from jaxlm.training.step import split_model
from parity.convert import jax_to_torch, torch_config
from tests.lib.test_peft import CFG, TOKENS, lora_model


def test_lora_matches_torchref():
    _, model = lora_model(alpha=8.0)
    for _, layer in nnx.iter_graph(model):
        if isinstance(layer, lora.LoRALinear):
            layer.lora_b = nnx.LoRAParam(0.05 * jax.random.normal(jax.random.key(5), layer.lora_b.shape))
    ref = torchref.apply_lora(torchref.TransformerLM(torch_config(CFG)), rank=4, alpha=8.0)
    ref.load_state_dict(jax_to_torch(model), strict=False)
    assert not any(k not in dict(ref.named_parameters()) for k in jax_to_torch(model) if "lora" in k)
    x = torch.from_numpy(np.array(TOKENS)).long()
    y = torch.roll(x, -1, dims=1)
    logits = ref(x)
    forward = nnx.jit(lambda m, t: m(t))  # one compiled program, not op-by-op dispatch (each op compiled alone)
    np.testing.assert_allclose(logits.detach().numpy(), np.asarray(forward(model, TOKENS)), atol=2e-5, rtol=0)
    torchref.cross_entropy(logits.reshape(-1, CFG.vocab_size), y.reshape(-1)).backward()
    trainable = {n for n, p in ref.named_parameters() if p.requires_grad}
    assert trainable == {n for n in jax_to_torch(model) if n.endswith(("lora_a", "lora_b"))}
    graphdef, params, rest = split_model(model)

    def loss(params):
        return cross_entropy(nnx.merge(graphdef, params, rest)(TOKENS), jnp.roll(TOKENS, -1, axis=1))

    grads = jax.jit(jax.grad(loss))(params)
    for path, g in nnx.to_flat_state(grads):
        name = ".".join(map(str, path))
        np.testing.assert_allclose(np.asarray(g[...]), dict(ref.named_parameters())[name].grad.numpy(), atol=2e-6)
    torchref.merge_lora(ref)
    np.testing.assert_allclose(ref(x).detach().numpy(), logits.detach().numpy(), atol=1e-5)
