"""A tiny sampler for training-time samples: full forward per token, no KV cache.

`sample_text` is the one function the training loop calls; `jaxlm.generate`
(KV-cache generation) can replace it without touching the loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def sample_text(model, tokenizer, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8, seed: int = 0) -> str:
    """Continue `prompt`: greedy when temperature == 0, else softmax(logits / temperature) sampling.

    The window has a fixed length (context_length), so one compiled function
    serves every position: tokens after the cursor are padding the causal mask hides.
    """
    T = model.cfg.context_length
    ids = list(tokenizer.encode(prompt)) or [tokenizer.eot_id or 0]
    graphdef, state = nnx.split(model)

    @jax.jit
    def next_token(state, window, pos, key):
        logits = nnx.merge(graphdef, state)(window[None], deterministic=True)[0, pos].astype(jnp.float32)  # (V,)
        greedy = jnp.argmax(logits)
        sampled = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6))
        return jnp.where(temperature > 0, sampled, greedy)

    key = jax.random.key(seed)
    out = []
    for _ in range(max_new_tokens):
        ctx = ids[-T:]
        window = np.zeros(T, np.int32)
        window[: len(ctx)] = ctx
        key, sub = jax.random.split(key)
        tok = int(next_token(state, window, len(ctx) - 1, sub))
        ids.append(tok)
        out.append(tok)
    return prompt + tokenizer.decode(out)
