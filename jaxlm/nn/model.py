"""The Transformer LM of docs/spec.md in Flax NNX: attention, blocks, the LM, its KV cache (its loss:
`jaxlm/nn/loss.py`).

Parameter paths equal torchref's `state_dict()` keys with "/" for "." (e.g.
``layers/0/attn/q_proj/weight``), weights are stored (d_out, d_in) like torch
and there are no biases, so conversion (parity/convert.py) is a table of names.
The layers it is built from (Linear, Embedding, RMSNorm, RoPE, the FFNs) are in
`jaxlm/nn/layers.py`; `LinearKinds` chooses, when the model is built, the kind of every block
projection: plain, LoRA / QLoRA (`jaxlm/nn/lora.py`) or quantisation-aware (`jaxlm/nn/quant.py`).

`ModelConfig` fixes what the network computes; `ComputeConfig` how it runs.

Precision policy (the one place it is decided: `Precision` in `jaxlm/nn/layers.py`, built
once from ``compute.dtype`` in `TransformerLM.__init__` and handed to every layer):
  * parameters are stored in float32;
  * `Precision.cast` converts parameters and activations to the compute dtype
    (``compute.dtype``) at use, inside `Linear` and `Embedding`; the residual stream
    runs in the compute dtype;
  * RMSNorm, RoPE rotations, the attention softmax and the loss compute in
    float32 and cast back.

Remat policy: ``compute.remat`` wraps the one per-layer function of every layout
(`jaxlm/nn/remat.py` says what each policy keeps, unrolled and scanned).

Layer layout: unrolled (``layers/0/...``, a Python loop) or, with ``compute.scan_layers``,
stacked on a leading layers axis and run by `lax.scan` (``layers/attn/...``, `jaxlm/nn/scan.py`),
through a GPipe schedule when the mesh has a pipeline axis.

Shapes: B batch, T sequence, D d_model, N heads, K key/value heads, H head_dim, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlm.core.config import ComputeConfig, LoraConfig, ModelConfig, QatConfig
from jaxlm.core.sharding import constrain
from jaxlm.nn import pipeline, remat, scan
from jaxlm.nn.attention import attention
from jaxlm.nn.layers import (
    FFNS,
    Embedding,
    Linear,
    MakeLinear,
    Precision,
    RMSNorm,
    RotaryEmbedding,
    apply_rope,
    dense,
    dropout,
    tied_embedding_std,
)
from jaxlm.nn.lora import LoRALinear
from jaxlm.nn.quant import QATLinear

# --------------------------------------------------------------------------- linear kinds


@dataclasses.dataclass(frozen=True)
class LinearKinds:
    """The one place a block projection's kind is chosen, when the model is built: LoRA / QLoRA on
    ``lora.targets`` (rank > 0), quantisation-aware with ``qat.*`` bits set, else the plain `Linear`.

    Every kind draws its weight as `Linear` does (the same base numbers) and keeps its path
    (``.../q_proj/weight``; QLoRA ``codes`` and ``scales``), so checkpoints and the torch conversion
    read them by name. The output head is not a block projection: it stays a plain float32 weight.
    """

    precision: Precision = dataclasses.field(default_factory=Precision)
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    qat: QatConfig = dataclasses.field(default_factory=QatConfig)

    def __call__(self, name: str, d_in: int, d_out: int, axes: tuple[str, str], rngs: nnx.Rngs) -> nnx.Module:
        if self.lora.rank and name in self.lora.targets:
            return LoRALinear(d_in, d_out, axes, self.lora, precision=self.precision, rngs=rngs)
        if self.qat.weight_bits or self.qat.activation_bits:
            return QATLinear(d_in, d_out, axes, self.qat, precision=self.precision, rngs=rngs)
        return Linear(d_in, d_out, axes=axes, precision=self.precision, rngs=rngs)


class CausalSelfAttention(nnx.Module):
    """Causal self-attention with N query heads and K key/value heads (K = N: multi-head; K < N: grouped-query,
    each key/value head serving N / K consecutive query heads) of width H; RoPE on q and k when the caller
    passes tables."""

    def __init__(self, cfg: ModelConfig, implementation: str = "xla", *, linear: MakeLinear, rngs: nnx.Rngs):
        d, q, kv = cfg.d_model, cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.q_proj = linear("q_proj", d, q, ("heads", "embed"), rngs)
        self.k_proj = linear("k_proj", d, kv, ("kv_heads", "embed"), rngs)
        self.v_proj = linear("v_proj", d, kv, ("kv_heads", "embed"), rngs)
        self.output_proj = linear("output_proj", q, d, ("embed", "heads"), rngs)
        self.num_heads, self.window, self.implementation = cfg.num_heads, cfg.window, implementation
        self.kv_heads, self.head_dim = cfg.kv_heads, cfg.head_dim
        self.dropout_rate = cfg.dropout

    def _qkv(self, x: jax.Array, rope) -> tuple[jax.Array, jax.Array, jax.Array]:
        """x (B, T, D) -> q (B, T, N, H), k and v (B, T, K, H), RoPE applied to q and k."""
        B, T, _ = x.shape
        N, K, H = self.num_heads, self.kv_heads, self.head_dim
        q = constrain(self.q_proj(x).reshape(B, T, N, H), "batch", "seq", "heads", "head_dim")  # (B, T, N, H)
        k = constrain(self.k_proj(x).reshape(B, T, K, H), "batch", "seq", "kv_heads", "head_dim")  # (B, T, K, H)
        v = constrain(self.v_proj(x).reshape(B, T, K, H), "batch", "seq", "kv_heads", "head_dim")  # (B, T, K, H)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def __call__(
        self, x: jax.Array, rope: tuple[jax.Array, jax.Array] | None = None, dropout_key: jax.Array | None = None
    ) -> jax.Array:
        """x (B, T, D) -> (B, T, D). rope: (cos, sin) for the T positions; dropout_key: training only."""
        B, T, _ = x.shape
        q, k, v = self._qkv(x, rope)  # (B, T, N, H), 2 x (B, T, K, H)
        train = dropout_key is not None and self.dropout_rate > 0.0
        out = attention(
            q,
            k,
            v,
            implementation=self.implementation,
            causal=True,
            window=self.window,
            dropout_rate=self.dropout_rate if train else 0.0,
            dropout_rng=dropout_key if train else None,
        )  # (B, T, N, H)
        return self.output_proj(out.reshape(B, T, -1))  # (B, T, D)

    def extend(
        self, x: jax.Array, rope, kv: tuple[jax.Array, jax.Array], start: jax.Array, visible: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Attention of T new tokens per row against a key/value cache (evaluation only).

        x (B, T, D): the new tokens; kv: (k, v) buffers (B*K, S, H) (see `KVCache`);
        start (B,) int: row b's new keys go to cache slots start[b] ... start[b]+T-1;
        visible (B, 1, T, S) bool: which cache slots each new query may attend (built by
        `TransformerLM.extend`, causal + window already folded in).
        Returns the output (B, T, D) and the updated buffers.
        """
        B, T, _ = x.shape
        q, k, v = self._qkv(x, rope)  # (B, T, N, H), 2 x (B, T, K, H)
        k_buf, v_buf = (_write_rows(buf, new.astype(buf.dtype), start) for buf, new in zip(kv, (k, v)))  # (B*K, S, H)
        # attention takes (B, S, K, H) views; its XLA path swaps them back, so the dots read the buffers as they are.
        k_seq, v_seq = (jnp.swapaxes(buf.reshape(B, -1, *buf.shape[1:]), 1, 2) for buf in (k_buf, v_buf))
        out = attention(q, k_seq, v_seq, implementation=self.implementation, causal=False, mask=visible)  # (B, T, N, H)
        return self.output_proj(out.reshape(B, T, -1)), (k_buf, v_buf)


def _write_rows(buf: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """buf (B*K, S, H) with new (B, T, K, H) written at slots start[b] ... start[b]+T-1 of each row b.

    One `dynamic_update_slice` per row, so XLA updates the buffer in place inside the decode
    loop (a vmapped one becomes a scatter whose bounds check reads the old slots, which cost a
    copy of the whole cache per step). A start that would run past S is clamped; callers keep
    start[b] + T <= S (generation stops at the cache's end).
    """
    B, T, K, H = new.shape
    new = jnp.swapaxes(new, 1, 2).reshape(B * K, T, H)  # (B*K, T, H)
    for b in range(B):
        buf = jax.lax.dynamic_update_slice(buf, new[b * K:(b + 1) * K], (b * K, start[b], 0))  # (B*K, S, H)
    return buf


class TransformerBlock(nnx.Module):
    """pre: h = x + attn(ln1 x), out = h + ffn(ln2 h); post: h = ln1(x + attn x), out = ln2(h + ffn h);
    none: no norms."""

    def __init__(self, cfg: ModelConfig, attention: str = "xla", *, linear: MakeLinear, rngs: nnx.Rngs):
        self.norm = cfg.norm
        if cfg.norm != "none":
            self.ln1 = RMSNorm(cfg.d_model, cfg.eps)
            self.ln2 = RMSNorm(cfg.d_model, cfg.eps)
        self.attn = CausalSelfAttention(cfg, attention, linear=linear, rngs=rngs)
        self.ffn = FFNS[cfg.ffn](cfg.d_model, cfg.d_ff, linear=linear, rngs=rngs)
        self.dropout_rate = cfg.dropout

    def __call__(self, x: jax.Array, rope=None, dropout_key: jax.Array | None = None) -> jax.Array:
        """x (B, T, D) -> (B, T, D). dropout_key None: evaluation (no dropout anywhere)."""
        k_probs = k_attn = k_ffn = None
        if dropout_key is not None:
            k_probs, k_attn, k_ffn = jax.random.split(dropout_key, 3)

        def attn(y):
            return dropout(self.attn(y, rope, k_probs), self.dropout_rate, k_attn)

        def ffn(y):
            return dropout(self.ffn(y), self.dropout_rate, k_ffn)

        return self._residual(x, attn, ffn)

    def extend(self, x: jax.Array, rope, kv, start: jax.Array, visible: jax.Array):
        """The block on T new tokens per row with a KV cache: (out (B, T, D), updated kv). Evaluation only."""
        new_kv = []

        def attn(y):  # called exactly once by _residual
            out, updated = self.attn.extend(y, rope, kv, start, visible)
            new_kv.append(updated)
            return out

        out = self._residual(x, attn, self.ffn)
        return out, new_kv[0]

    def _residual(self, x: jax.Array, attn: Callable, ffn: Callable) -> jax.Array:
        """The norm placement around the two branches, shared by the full and the cached forward."""
        if self.norm == "pre":
            h = x + attn(self.ln1(x))  # (B, T, D)
            return h + ffn(self.ln2(h))  # (B, T, D)
        if self.norm == "post":
            h = self.ln1(x + attn(x))  # (B, T, D)
            return self.ln2(h + ffn(h))  # (B, T, D)
        h = x + attn(x)
        return h + ffn(h)


def _block_forward(block: TransformerBlock, x, rope, dropout_key):
    return constrain(block(x, rope, dropout_key), "batch", "seq", "embed")  # (B, T, D)


class TransformerLM(nnx.Module):
    """Embeddings -> blocks -> ln_final (absent when norm='none') -> lm_head (or the tied embedding).

    rngs: ``params`` draws the weights, ``dropout`` the dropout stream, ``adapters`` LoRA's A
    matrices and adapter dropout (with ``nnx.Rngs(seed)`` all come from one stream).
    lora, qat: the kinds of the block projections (`LinearKinds`); off by default.
    """

    def __init__(self, cfg: ModelConfig, compute: ComputeConfig = ComputeConfig(), *, rngs: nnx.Rngs,
                 lora: LoraConfig = LoraConfig(), qat: QatConfig = QatConfig(), microbatches: int = 1):
        self.cfg, self.compute = cfg, compute
        self.microbatches = microbatches  # GPipe micro-batches when the mesh has a pipeline axis (scanned layers)
        precision = Precision.from_config(compute)
        self.precision = precision
        std = tied_embedding_std(cfg.d_model) if cfg.tie_embeddings else 1.0  # a tied one is the output head too
        self.token_embeddings = Embedding(cfg.vocab_size, cfg.d_model, std=std, precision=precision, rngs=rngs)
        linear = LinearKinds(precision, lora, qat)
        blocks = [TransformerBlock(cfg, compute.attention, linear=linear, rngs=rngs) for _ in range(cfg.num_layers)]
        self.layers = scan.stack(blocks) if compute.scan_layers else nnx.List(blocks)  # same numbers either way
        if cfg.norm != "none":
            self.ln_final = RMSNorm(cfg.d_model, cfg.eps)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(cfg.d_model, cfg.vocab_size, axes=("vocab", "embed"), precision=precision, rngs=rngs)
        if cfg.rope:
            self.rope = RotaryEmbedding(cfg.head_dim, cfg.context_length, cfg.rope_theta, cfg.rope_scaling)
        # One dropout stream, forked after every parameter is drawn, so the initial
        # parameters do not depend on cfg.dropout. None when dropout is off.
        self.dropout_rngs = rngs["dropout"].fork() if cfg.dropout > 0.0 else None
        remat.check(compute.remat)

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None, *,
                 deterministic: bool = True) -> jax.Array:
        """tokens (B, T) int -> logits (B, T, V) in the compute dtype (the loss upcasts to float32).

        positions: (B, T) or (T,) token positions for RoPE; default 0 ... T-1.
        deterministic=False turns dropout on (training).
        """
        return self._head(self.hidden(tokens, positions, deterministic=deterministic))

    def hidden(self, tokens: jax.Array, positions: jax.Array | None = None, *, deterministic: bool = True) -> jax.Array:
        """tokens (B, T) int -> the last block's output (B, T, D), before the final norm (arguments as __call__)."""
        T = tokens.shape[-1]
        if T > self.cfg.context_length:
            raise ValueError(f"sequence length {T} exceeds context_length {self.cfg.context_length}")
        x = constrain(self.token_embeddings(tokens), "batch", "seq", "embed")  # (B, T, D)
        rope = None
        if self.cfg.rope:
            rope = self.rope(jnp.arange(T) if positions is None else positions)  # 2 x (B or -, T, H/2)
        keys = None
        if not deterministic and self.dropout_rngs is not None:
            keys = jax.random.split(self.dropout_rngs(), self.cfg.num_layers)  # (L,) keys
        return self._blocks(x, rope, keys, train=not deterministic)  # (B, T, D)

    def _blocks(self, x: jax.Array, rope, keys: jax.Array | None, train: bool) -> jax.Array:
        """Every block on x (B, T, D) in the model's layer layout; `keys` (L,) dropout keys or None."""
        fn = remat.wrap(lambda b, h, k: (_block_forward(b, h, rope, k), None), self.compute)  # per layer
        if not self.compute.scan_layers:
            for i, block in enumerate(self.layers):
                x, _ = fn(block, x, None if keys is None else keys[i])  # (B, T, D)
            return x
        if pipeline.pipeline_stages() > 1:
            return pipeline.pipeline(self.layers, fn, x, keys, microbatches=self.microbatches)  # (B, T, D)
        return scan.scan(self.layers, fn, x, keys, advance_rngs=train)[0]  # (B, T, D)

    def _head(self, x: jax.Array) -> jax.Array:
        """Final norm and output projection: (B, T, D) -> logits (B, T, V)."""
        return self.project(self.final_norm(x))

    def final_norm(self, x: jax.Array) -> jax.Array:
        return self.ln_final(x) if self.cfg.norm != "none" else x  # (B, T, D)

    def head_weight(self) -> jax.Array:
        """The output projection's weight (V, D), float32: lm_head's, or the tied embedding's."""
        return (self.token_embeddings.weight if self.cfg.tie_embeddings else self.lm_head.weight)[...]

    def project(self, x: jax.Array, w: jax.Array | None = None) -> jax.Array:
        """The output projection: (B, T, D) -> logits (B, T, V), compute dtype; w: the head weight (default: own)."""
        w = self.head_weight() if w is None else w
        logits = dense(x, self.precision.cast(w))  # (B, T, V)
        return constrain(logits, "batch", "seq", "vocab")

    # ----------------------------------------------------------------------- KV cache (generation)

    def init_cache(self, batch: int, length: int | None = None) -> "KVCache":
        """Zeroed key/value buffers for `batch` rows of `length` slots (default: context_length)."""
        length = self.cfg.context_length if length is None else length
        if not 0 < length <= self.cfg.context_length:
            raise ValueError(f"cache length {length} must be in 1 ... context_length {self.cfg.context_length}")
        shape = (batch * self.cfg.kv_heads, length, self.cfg.head_dim)  # (B*K, S, H)
        dtype = self.precision.compute
        layers = tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(self.cfg.num_layers))
        return KVCache(layers)

    def extend(self, tokens: jax.Array, cache: "KVCache", start: jax.Array) -> tuple[jax.Array, "KVCache"]:
        """Run T new tokens per row on top of a KV cache (evaluation only, no dropout).

        tokens (B, T) int; start (B,) int: row b's tokens sit at positions
        start[b] ... start[b]+T-1, which are also their cache slots (so RoPE
        positions continue from what the cache holds). Row b's query at position
        p attends cache slots 0 ... p (and only the last `window` + 1 with a
        sliding window); slots past p may hold stale or padding values and are
        masked. A prefill is `extend(prompt, cache, zeros)`, a decode step
        `extend(last_token[:, None], cache, lengths)`.
        Returns logits (B, T, V) and the cache with the new keys/values written.
        """
        B, T = tokens.shape
        S = cache.length
        start = jnp.asarray(start, jnp.int32)
        positions = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]  # (B, T)
        slots = jnp.arange(S, dtype=jnp.int32)  # (S,)
        visible = slots[None, None, :] <= positions[:, :, None]  # (B, T, S)
        if self.cfg.window is not None:
            visible &= slots[None, None, :] >= positions[:, :, None] - self.cfg.window
        visible = visible[:, None]  # (B, 1, T, S): broadcast over heads
        x = self.token_embeddings(tokens)  # (B, T, D)
        rope = self.rope(positions) if self.cfg.rope else None  # 2 x (B, T, H/2)
        if self.compute.scan_layers:
            kv = jax.tree.map(lambda *a: jnp.stack(a), *cache.layers)  # 2 x (L, B*K, S, H)
            x, kv = scan.scan(self.layers, lambda b, h, c: b.extend(h, rope, c, start, visible), x, kv)
            return self._head(x), KVCache(tuple((kv[0][i], kv[1][i]) for i in range(self.cfg.num_layers)))
        layers = []
        for block, kv in zip(self.layers, cache.layers):
            x, kv = block.extend(x, rope, kv, start, visible)  # (B, T, D)
            layers.append(kv)
        return self._head(x), KVCache(tuple(layers))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Preallocated per-layer key/value buffers: layers[i] = (k, v), each (B*K, S, H), row b's key/value head n at
    b*K + n (K = model.num_kv_heads: grouped-query attention stores N / K times fewer than the N query heads).

    A plain pytree (no positions inside): the caller tracks each row's length and
    passes it as `start` to `TransformerLM.extend`. Keys are stored after RoPE.
    Why (B*K, S, H): it is the operand layout of the XLA attention's batched dots, so a
    decode step reads the cache where it lies. Stored (B, S, N, H), each layer's cache
    was copied whole into that layout at every step; stored (B, N, S, H), XLA:CPU still
    copied it, to reshape the freshly written buffer for the dot.
    """

    layers: tuple[tuple[jax.Array, jax.Array], ...]

    @property
    def length(self) -> int:
        return self.layers[0][0].shape[1]

