"""Hugging Face Llama tensors <-> jaxlm parameters: names, the rotary layout, safetensors files.

Names: ``model.layers.{i}.self_attn.q_proj.weight`` is ``layers/{i}/attn/q_proj/weight`` and so on
(`NAMES`); both store a linear weight (d_out, d_in) and neither has biases, so a tensor is copied as it is,
but for one permutation. Hugging Face's Llama rotates the two halves of each head against each other
(``rotate_half``: dimension k pairs with k + H/2), jaxlm rotates interleaved pairs (2k, 2k + 1), as Meta's
original Llama code does. The same rotation applied to rows reordered within each head gives the same
scores q . k, so the q and k projections' rows are reordered at import (`to_interleaved`) and back at
export (`to_halves`); the model itself never changes.

Files are written with the `safetensors` library's numpy API (the hf extra): one ``model.safetensors``, or
shards listed by ``model.safetensors.index.json`` (they are read by `jaxlm.hf.files`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from jaxlm.core.errors import WriteFailed
from jaxlm.core.extras import require
from jaxlm.core.files import write_cause

# Hugging Face name (with {i} for the layer) -> jaxlm parameter path (with {i})
NAMES = {
    "model.embed_tokens.weight": "token_embeddings/weight",
    "model.norm.weight": "ln_final/weight",
    "lm_head.weight": "lm_head/weight",
    "model.layers.{i}.input_layernorm.weight": "layers/{i}/ln1/weight",
    "model.layers.{i}.post_attention_layernorm.weight": "layers/{i}/ln2/weight",
    "model.layers.{i}.self_attn.q_proj.weight": "layers/{i}/attn/q_proj/weight",
    "model.layers.{i}.self_attn.k_proj.weight": "layers/{i}/attn/k_proj/weight",
    "model.layers.{i}.self_attn.v_proj.weight": "layers/{i}/attn/v_proj/weight",
    "model.layers.{i}.self_attn.o_proj.weight": "layers/{i}/attn/output_proj/weight",
    "model.layers.{i}.mlp.gate_proj.weight": "layers/{i}/ffn/w1/weight",
    "model.layers.{i}.mlp.up_proj.weight": "layers/{i}/ffn/w3/weight",
    "model.layers.{i}.mlp.down_proj.weight": "layers/{i}/ffn/w2/weight",
}
ROTARY = ("q_proj", "k_proj")  # the projections whose rows RoPE rotates
# jaxlm's LoRA targets by the Hugging Face module name PEFT's target_modules use
MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj", "w1": "gate_proj",
           "w3": "up_proj", "w2": "down_proj"}
IGNORED = re.compile(r".*rotary_emb\.inv_freq$")  # a buffer some older checkpoints saved: recomputed, not a weight


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(re.escape("{i}"), r"(\d+)") + "$")


_TO_JAXLM = [(_pattern(hf), jx) for hf, jx in NAMES.items()]
_TO_HF = [(_pattern(jx), hf) for hf, jx in NAMES.items()]


def _rename(name: str, table) -> str | None:
    for pattern, template in table:
        m = pattern.match(name)
        if m:
            return template.replace("{i}", m.group(1)) if m.groups() else template
    return None


def jaxlm_name(hf_name: str) -> str | None:
    return _rename(hf_name, _TO_JAXLM)


def hf_name(jaxlm_path: str) -> str | None:
    return _rename(jaxlm_path, _TO_HF)


def to_interleaved(w: np.ndarray, head_dim: int) -> np.ndarray:
    """Rows (heads * H, ...) in Hugging Face's half-split order -> jaxlm's interleaved order: within each head
    row 2k is HF's row k and row 2k + 1 is HF's row k + H/2."""
    rest = w.shape[1:]
    return w.reshape(-1, 2, head_dim // 2, *rest).swapaxes(1, 2).reshape(w.shape)


def to_halves(w: np.ndarray, head_dim: int) -> np.ndarray:
    """The inverse of `to_interleaved`: jaxlm's rows back in Hugging Face's order."""
    rest = w.shape[1:]
    return w.reshape(-1, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def is_rotary(path: str) -> bool:
    return any(f"/attn/{p}/" in path for p in ROTARY)


# --------------------------------------------------------------------------- files


def write_tensors(tensors: dict[str, np.ndarray], directory: Path, shard_bytes: int,
                  prefix: str = "model") -> list[str]:
    """PREFIX.safetensors, or PREFIX-0000k-of-0000n.safetensors shards of at most `shard_bytes` each (a larger
    tensor alone in its shard) with PREFIX.safetensors.index.json; returns the file names written."""
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if shards[-1] and size + array.nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = np.ascontiguousarray(array)
        size += array.nbytes
    if len(shards) == 1:
        _save(shards[0], directory / f"{prefix}.safetensors")
        return [f"{prefix}.safetensors"]
    names = [f"{prefix}-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    for name, shard in zip(names, shards):
        _save(shard, directory / name)
    index = {"metadata": {"total_size": sum(a.nbytes for a in tensors.values())},
             "weight_map": {t: name for name, shard in zip(names, shards) for t in shard}}
    (directory / f"{prefix}.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return [*names, f"{prefix}.safetensors.index.json"]


def _save(tensors: dict[str, np.ndarray], path: Path) -> None:
    """One safetensors file; a failed write (a full disk, `ulimit -f`) is a WriteFailed naming it and the cause."""
    safetensors = require("safetensors")
    try:
        require("safetensors.numpy").save_file(tensors, str(path), metadata={"format": "pt"})
    except (OSError, safetensors.SafetensorError) as e:
        raise WriteFailed(f"{path}: cannot be written: {write_cause(e)}") from None
