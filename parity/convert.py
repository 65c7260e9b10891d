"""Weights between torchref's `state_dict()` and a jaxlm `TransformerLM`: a table of names.

Both sides use the specification's names (docs/spec.md) and (d_out, d_in) weights, so the mapping
is "." <-> "/" in the parameter path and nothing else: no transposes, no
reshapes. A tied head (`cfg.tie_embeddings`) has no `lm_head` in JAX; torch's
`state_dict()` lists `lm_head.weight` as the same tensor as
`token_embeddings.weight`, so `jax_to_torch` emits both keys (one tensor) and
`torch_to_jax` checks they agree. Scanned layers (``compute.scan_layers``) hold every
block's weight in one array with a leading layers axis (``layers/attn/q_proj/weight``,
(L, d_out, d_in)): slice i is torch's ``layers.i.attn.q_proj.weight``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

import torchref
from jaxlm.core.config import ModelConfig
from jaxlm.core.errors import ConfigError

# jaxlm's keys for Hugging Face checkpoints that torchref does not have (grouped-query attention, a head width of its
# own, Llama 3 RoPE scaling): transformers is their reference (tests/parity/test_hf.py).
JAXLM_ONLY = ("num_kv_heads", "head_size", "rope_scaling")
# jaxlm ModelConfig field -> torchref ModelConfig field: the architecture, name for name.
CONFIG_FIELDS = {f.name: f.name for f in dataclasses.fields(ModelConfig) if f.name not in JAXLM_ONLY}


def torch_config(cfg: ModelConfig) -> torchref.ModelConfig:
    """The torchref config of the same architecture; a ConfigError for a key torchref cannot represent."""
    for key in JAXLM_ONLY:
        if getattr(cfg, key) is not None:
            raise ConfigError(f"model.{key} = {getattr(cfg, key)!r}: torchref has no equivalent; compare such a "
                              "model against transformers (docs/hf.md)")
    return torchref.ModelConfig(**{t: getattr(cfg, j) for j, t in CONFIG_FIELDS.items()})


def torch_name(path: tuple) -> str:
    """('layers', 0, 'attn', 'q_proj', 'weight') -> 'layers.0.attn.q_proj.weight'."""
    return ".".join(str(p) for p in path)


def _stacked(path: tuple) -> bool:
    """A scanned model's layer weight: ('layers', 'attn', ...) rather than ('layers', 0, 'attn', ...)."""
    return path[0] == "layers" and not isinstance(path[1], int)


def _names(path: tuple, shape: tuple) -> list[str]:
    """The torch keys one JAX parameter holds: one, or L for a stacked layer weight."""
    if _stacked(path):
        return [torch_name(("layers", i, *path[1:])) for i in range(shape[0])]
    return [torch_name(path)]


def _tied(model) -> bool:
    return bool(getattr(getattr(model, "cfg", None), "tie_embeddings", False))


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
        t = t.float()
    return t.numpy()


def torch_to_jax(state_dict: dict[str, torch.Tensor], model: nnx.Module) -> nnx.Module:
    """Load a torchref state dict into `model` in place (and return it).

    Every nnx.Param must have a tensor of the same shape; unknown keys are an error.
    Values are cast to each JAX parameter's dtype (float32).
    """
    flat = list(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    expected = {n for path, var in flat for n in _names(path, tuple(var.shape))}
    extra = set(state_dict) - expected
    if _tied(model) and "lm_head.weight" in extra:
        extra.discard("lm_head.weight")
        if "token_embeddings.weight" in state_dict and not torch.equal(
            state_dict["lm_head.weight"], state_dict["token_embeddings.weight"]
        ):
            raise ValueError("tie_embeddings=True but lm_head.weight differs from token_embeddings.weight")
    missing = expected - set(state_dict)
    if missing or extra:
        raise KeyError(f"state dict does not match the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
    new = []
    for path, var in flat:
        names = _names(path, tuple(var.shape))
        value = (np.stack([_to_numpy(state_dict[n]) for n in names]) if _stacked(path)
                 else _to_numpy(state_dict[names[0]]))
        if value.shape != tuple(var.shape):
            raise ValueError(f"{torch_name(path)}: torch shape {tuple(value.shape)} != jax shape {tuple(var.shape)}")
        new.append((path, var.replace(jnp.asarray(value, dtype=var.dtype))))
    nnx.update(model, nnx.from_flat_state(new))
    return model


def torch_named(state: nnx.State) -> dict[str, np.ndarray]:
    """Parameters (or their gradients) keyed by torch names; a stacked layer weight splits per layer."""
    out: dict[str, np.ndarray] = {}
    for path, var in nnx.to_flat_state(state):
        value = np.asarray(var[...])
        for name, v in zip(_names(path, value.shape), value if _stacked(path) else [value]):
            out[name] = v
    return out


def jax_to_torch(model: nnx.Module) -> dict[str, torch.Tensor]:
    """The model's parameters as a torchref `state_dict` (float32 CPU tensors, exact copies)."""
    out = {name: torch.from_numpy(np.array(v, dtype=np.float32, copy=True))
           for name, v in torch_named(nnx.state(model, nnx.Param)).items()}
    if _tied(model):
        out["lm_head.weight"] = out["token_embeddings.weight"]
    return out
