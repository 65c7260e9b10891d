"""The CS336 adapter interface (docs/spec.md#adapter-interface): glue from the test suite to torchref.

Each function builds the torchref piece, loads the given weights and calls it;
no logic lives here.  The tokenizer entries call jaxlm.data (framework-free),
the project's one implementation of the tokenizer (docs/spec.md#tokenizer).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import IO, Any, BinaryIO

import numpy.typing as npt
import torch
from torch import Tensor

import torchref
from jaxlm.data.bpe import train_bpe
from jaxlm.data.tokenizer import Tokenizer
from torchref import ModelConfig


def run_linear(d_in: int, d_out: int, weights: Tensor, in_features: Tensor) -> Tensor:
    layer = torchref.Linear(d_in, d_out)
    layer.load_state_dict({"weight": weights})
    return layer(in_features)


def run_embedding(vocab_size: int, d_model: int, weights: Tensor, token_ids: Tensor) -> Tensor:
    layer = torchref.Embedding(vocab_size, d_model)
    layer.load_state_dict({"weight": weights})
    return layer(token_ids)


def run_swiglu(d_model: int, d_ff: int, w1_weight: Tensor, w2_weight: Tensor, w3_weight: Tensor,
               in_features: Tensor) -> Tensor:
    ffn = torchref.SwiGLU(d_model, d_ff)
    ffn.load_state_dict({"w1.weight": w1_weight, "w2.weight": w2_weight, "w3.weight": w3_weight})
    return ffn(in_features)


def run_scaled_dot_product_attention(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    return torchref.scaled_dot_product_attention(Q, K, V, mask)


def _attention(d_model, num_heads, rope, q_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight):
    attn = torchref.MultiHeadSelfAttention(d_model, num_heads, rope=rope)
    attn.load_state_dict(
        {"q_proj.weight": q_proj_weight, "k_proj.weight": k_proj_weight, "v_proj.weight": v_proj_weight,
         "output_proj.weight": o_proj_weight}
    )
    return attn


def run_multihead_self_attention(
    d_model: int, num_heads: int, q_proj_weight: Tensor, k_proj_weight: Tensor, v_proj_weight: Tensor,
    o_proj_weight: Tensor, in_features: Tensor
) -> Tensor:
    return _attention(d_model, num_heads, None, q_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight)(in_features)


def run_multihead_self_attention_with_rope(
    d_model: int,
    num_heads: int,
    max_seq_len: int,
    theta: float,
    q_proj_weight: Tensor,
    k_proj_weight: Tensor,
    v_proj_weight: Tensor,
    o_proj_weight: Tensor,
    in_features: Tensor,
    token_positions: Tensor | None = None,
) -> Tensor:
    rope = torchref.RotaryEmbedding(theta, d_model // num_heads, max_seq_len)
    attn = _attention(d_model, num_heads, rope, q_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight)
    return attn(in_features, token_positions)


def run_rope(d_k: int, theta: float, max_seq_len: int, in_query_or_key: Tensor, token_positions: Tensor) -> Tensor:
    return torchref.RotaryEmbedding(theta, d_k, max_seq_len)(in_query_or_key, token_positions)


def run_transformer_block(
    d_model: int, num_heads: int, d_ff: int, max_seq_len: int, theta: float, weights: dict[str, Tensor],
    in_features: Tensor
) -> Tensor:
    cfg = ModelConfig(vocab_size=1, context_length=max_seq_len, d_model=d_model, num_layers=1, num_heads=num_heads,
                      d_ff=d_ff, rope_theta=theta)
    block = torchref.TransformerBlock(cfg, torchref.RotaryEmbedding(theta, cfg.head_dim, max_seq_len))
    block.load_state_dict(weights)
    return block(in_features)


def run_transformer_lm(
    vocab_size: int,
    context_length: int,
    d_model: int,
    num_layers: int,
    num_heads: int,
    d_ff: int,
    rope_theta: float,
    weights: dict[str, Tensor],
    in_indices: Tensor,
) -> Tensor:
    cfg = ModelConfig(
        vocab_size=vocab_size, context_length=context_length, d_model=d_model, num_layers=num_layers,
        num_heads=num_heads, d_ff=d_ff, rope_theta=rope_theta
    )
    model = torchref.TransformerLM(cfg)
    model.load_state_dict(weights)
    return model(in_indices)


def run_rmsnorm(d_model: int, eps: float, weights: Tensor, in_features: Tensor) -> Tensor:
    norm = torchref.RMSNorm(d_model, eps)
    norm.load_state_dict({"weight": weights})
    return norm(in_features)


def run_silu(in_features: Tensor) -> Tensor:
    return torchref.silu(in_features)


def run_get_batch(dataset: npt.NDArray, batch_size: int, context_length: int, device: str) -> tuple[Tensor, Tensor]:
    return torchref.get_batch(dataset, batch_size, context_length, device)


def run_softmax(in_features: Tensor, dim: int) -> Tensor:
    return torchref.softmax(in_features, dim)


def run_cross_entropy(inputs: Tensor, targets: Tensor) -> Tensor:
    return torchref.cross_entropy(inputs, targets)


def run_gradient_clipping(parameters: Iterable[torch.nn.Parameter], max_l2_norm: float) -> None:
    torchref.clip_grad_norm(parameters, max_l2_norm)


def get_adamw_cls() -> type[torch.optim.Optimizer]:
    return torchref.AdamW


def run_get_lr_cosine_schedule(it: int, max_learning_rate: float, min_learning_rate: float, warmup_iters: int,
                               cosine_cycle_iters: int) -> float:
    return torchref.lr_cosine_schedule(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters)


def run_save_checkpoint(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, iteration: int,
    out: str | os.PathLike | BinaryIO | IO[bytes]
) -> None:
    torchref.save_checkpoint(model, optimizer, iteration, out)


def run_load_checkpoint(src: str | os.PathLike | BinaryIO | IO[bytes], model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer) -> int:
    return torchref.load_checkpoint(src, model, optimizer)


def get_tokenizer(vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]],
                  special_tokens: list[str] | None = None) -> Any:
    return Tokenizer(vocab, merges, special_tokens)


def run_train_bpe(
    input_path: str | os.PathLike, vocab_size: int, special_tokens: list[str], **kwargs
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    return train_bpe(input_path, vocab_size, special_tokens, **kwargs)
