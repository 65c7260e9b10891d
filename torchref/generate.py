"""Reference generation in PyTorch: the sampling rules of docs/generate.md, written plainly.

One prompt at a time (a batch is a loop over prompts), with or without the
concatenating `KVCache` of torchref.model. Random draws come from a
`torch.Generator` seeded per call, so sampled tokens are reproducible here but
are not the same draws as another framework's (different RNGs); greedy decoding is what the
two are compared on.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch

from torchref.model import KVCache, TransformerLM


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Tokens outside the top-k, then outside the nucleus, set to -inf. logits (..., V).

    Top-k (0: off) keeps the k highest logits (ties by lower id). Nucleus keeps,
    on the distribution renormalised over the top-k, the smallest prefix by
    descending probability whose mass reaches top_p (a token stays iff the mass
    before it is < top_p); the top token always stays, top_p >= 1 keeps all.
    """
    logits = logits.float()
    ranked, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (..., V)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    keep = torch.ones_like(ranked, dtype=torch.bool)
    if top_k > 0:
        keep &= rank < top_k
    ranked = ranked.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(ranked, dim=-1)
    mass_before = probs.cumsum(-1) - probs  # exclusive cumulative sum
    if top_p < 1.0:
        keep &= (mass_before < top_p) | (rank == 0)
    ranked = ranked.masked_fill(~keep, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, ranked)


def sample_token(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> int:
    """logits (V,) -> one token id; temperature 0 is greedy."""
    if temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(
    model: TransformerLM,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    eot_id: int | None = None,
    use_cache: bool = True,
) -> list[int]:
    """The new tokens continuing `prompt` (stop token excluded); prompt + output stays within the context."""
    ctx = model.cfg.context_length
    ids = [int(t) for t in prompt]
    if len(ids) > ctx - 1:
        warnings.warn(f"prompt of {len(ids)} tokens cut to its last {ctx - 1} (context window {ctx})", stacklevel=2)
        ids = ids[-(ctx - 1) :]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    cache = KVCache(len(model.layers)) if use_cache else None
    out: list[int] = []
    feed = ids  # the tokens not yet seen by the model (with a cache) / the whole sequence (without)
    try:
        while len(out) < max_new_tokens and len(ids) + len(out) <= ctx:
            x = torch.tensor([feed], device=device)
            logits = model(x, kv_cache=cache)[0, -1]  # (V,)
            tok = sample_token(logits.cpu(), temperature, top_k, top_p, gen)
            if eot_id is not None and tok == eot_id:
                break
            out.append(tok)
            if len(ids) + len(out) >= ctx:  # the next token would have no position left
                break
            feed = [tok] if use_cache else ids + out
    finally:
        model.train(was_training)
    return out
