"""The train state, one pure train step (with accumulation) and the eval step.

The train state is a plain dict pytree, so it jits, shards and checkpoints as is:

    {"step": int32 scalar,          # optimizer updates done = next global step
     "params": nnx.State,           # nnx.Param leaves, float32
     "opt_state": optax state,      # clip + AdamW moments, float32
     "rest": nnx.State}             # everything else in the model (RoPE tables, dropout RNG)

`train_step(state, x, y) -> (state, metrics)` does forward, loss, backward,
global-norm clipping and the AdamW update; with ``grad_accum = A`` the batch
(B, T) is cut into A micro-batches of B/A rows (rows j, j+A, j+2A, ... form
micro-batch j, so every device keeps its own rows) and their gradients are
averaged by a `lax.scan`, which equals one step on the whole batch up to rounding.
Metrics: ``loss`` (mean over the batch), ``grad_norm`` (before clipping),
``param_norm`` (after the update), ``lr`` (used by this update).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxlm.config import ModelConfig
from jaxlm.model import TransformerLM, cross_entropy, token_accuracy

TrainState = dict[str, Any]


def build_model(cfg: ModelConfig, seed: int) -> TransformerLM:
    return TransformerLM(cfg, rngs=nnx.Rngs(params=seed, dropout=seed + 1))


def split_model(model: nnx.Module):
    """(graphdef, params, rest): the trainable nnx.Param leaves apart from every other variable."""
    return nnx.split(model, nnx.Param, ...)


def init_state(model_cfg: ModelConfig, tx: optax.GradientTransformation, seed: int):
    """(graphdef, state-maker): call the maker under `jax.jit(..., out_shardings=...)` to build it sharded."""
    graphdef, _, _ = split_model(nnx.eval_shape(lambda: build_model(model_cfg, seed)))

    def make() -> TrainState:
        _, params, rest = split_model(build_model(model_cfg, seed))
        return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params), "rest": rest}

    return graphdef, make


def make_train_step(graphdef, tx: optax.GradientTransformation, schedule: Callable, grad_accum: int = 1):
    """The pure step function (not jitted: the caller jits it with shardings and donation)."""

    def loss_fn(params, rest, x, y):
        # Fresh Variable objects at this trace level: the dropout RNG counter is mutated below,
        # and nnx refuses to mutate Variables created outside the grad trace.
        rest = jax.tree.map(lambda v: v, rest)
        model = nnx.merge(graphdef, params, rest)
        loss = cross_entropy(model(x, deterministic=False), y)
        _, _, rest = split_model(model)  # dropout RNG counters advance
        return loss, rest

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, x: jax.Array, y: jax.Array):
        params, rest = state["params"], state["rest"]
        if grad_accum == 1:
            (loss, rest), grads = grad_fn(params, rest, x, y)
        else:
            B, T = x.shape
            A = grad_accum
            xs = x.reshape(B // A, A, T).swapaxes(0, 1)  # (A, B/A, T): micro-batch j = rows j, j+A, ...
            ys = y.reshape(B // A, A, T).swapaxes(0, 1)

            def micro(carry, xy):
                rest, gsum, lsum = carry
                (l, rest), g = grad_fn(params, rest, *xy)
                return (rest, jax.tree.map(jnp.add, gsum, g), lsum + l), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            (rest, gsum, lsum), _ = jax.lax.scan(micro, (rest, zeros, jnp.zeros((), jnp.float32)), (xs, ys))
            grads = jax.tree.map(lambda g: g / A, gsum)
            loss = lsum / A
        grad_norm = optax.global_norm(grads)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        params = optax.apply_updates(params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "param_norm": optax.global_norm(params),
            "lr": jnp.asarray(schedule(state["step"]), jnp.float32),
        }
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state, "rest": rest}
        return new_state, metrics

    return train_step


def make_eval_step(graphdef):
    """(params, rest, x, y) -> {"loss", "accuracy"} means over the batch, no dropout."""

    def eval_step(params, rest, x, y):
        logits = nnx.merge(graphdef, params, rest)(x, deterministic=True)
        return {"loss": cross_entropy(logits, y), "accuracy": token_accuracy(logits, y)}

    return eval_step


def merge_model(graphdef, state: TrainState) -> TransformerLM:
    return nnx.merge(graphdef, state["params"], state["rest"])
