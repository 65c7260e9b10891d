"""A compact PyTorch reference of the Transformer LM and its training utilities, written from docs/spec.md.

It depends on PyTorch alone, so it can check an implementation without sharing its code."""

from torchref.checkpoint import load_checkpoint, save_checkpoint
from torchref.data import get_batch
from torchref.lora import LoRALinear, apply_lora, merge_lora
from torchref.model import (
    Embedding,
    Linear,
    ModelConfig,
    MultiHeadSelfAttention,
    RMSNorm,
    RotaryEmbedding,
    SiLUFFN,
    SwiGLU,
    TransformerBlock,
    TransformerLM,
    causal_mask,
    scaled_dot_product_attention,
    silu,
    softmax,
)
from torchref.optim import AdamW, clip_grad_norm, cross_entropy, lr_cosine_schedule

__all__ = [
    "AdamW", "apply_lora", "causal_mask", "clip_grad_norm", "cross_entropy", "Embedding", "get_batch", "Linear",
    "load_checkpoint", "LoRALinear", "lr_cosine_schedule", "merge_lora", "ModelConfig", "MultiHeadSelfAttention",
    "RMSNorm", "RotaryEmbedding", "save_checkpoint", "scaled_dot_product_attention", "silu", "SiLUFFN", "softmax",
    "SwiGLU", "TransformerBlock", "TransformerLM",
]
