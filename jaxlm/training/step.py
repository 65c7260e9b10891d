"""The train state, one pure train step (with accumulation) and the eval step.

`train_step(state, x, y) -> (state, metrics)` does forward, loss, backward,
global-norm clipping and the AdamW update; with ``grad_accum = A`` the batch
(B, T) is cut into A micro-batches of B/A rows (rows j, j+A, j+2A, ... form
micro-batch j, so every device keeps its own rows) and their gradients are
averaged by a `lax.scan`, which equals one step on the whole batch up to rounding.
Metrics: ``loss`` (mean over the batch), ``grad_norm`` (before clipping),
``param_norm`` (after the update), ``lr`` (used by this update).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxlm.core.config import Config
from jaxlm.nn import lora as lora_lib
from jaxlm.nn.loss import lm_loss, lm_terms
from jaxlm.nn.model import TransformerLM


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class TrainState:
    """Everything a train step reads and writes; a pytree, so it jits, shards and checkpoints as is."""

    step: jax.Array  # int32 scalar: optimizer updates done = the next global step
    params: nnx.State  # the trainable leaves, float32: every nnx.Param, or only the LoRA adapters
    opt_state: Any  # optax state: clipping + AdamW moments, float32
    non_trainable: nnx.State  # every other model variable (RoPE tables, dropout RNG, a LoRA run's frozen base)

    @classmethod
    def create(cls, model: nnx.Module, tx: optax.GradientTransformation) -> "TrainState":
        """The one constructor: step 0, the model's variables, a fresh optimizer state."""
        _, params, non_trainable = split_model(model)
        return cls(jnp.zeros((), jnp.int32), params, tx.init(params), non_trainable)

    def model(self, graphdef) -> TransformerLM:
        return nnx.merge(graphdef, self.params, self.non_trainable)

    def as_dict(self) -> dict[str, Any]:
        """The checkpointed form (orbax stores dicts of arrays)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def build_model(cfg: Config, base: nnx.State | None = None):
    """The LM a run's config describes: its model and compute, drawn from train.seed, with its block projections
    of the kinds lora.* / qat.* ask for (LoRA adapters when lora.rank > 0, quantisation-aware layers when qat
    bits are set) and GPipe's parallel.microbatches; given the weights `base` (the Params of a plain model of
    the same layer layout) when set."""
    seed = cfg.train.seed
    rngs = nnx.Rngs(params=seed, dropout=seed + 1, adapters=seed + 2)
    model = TransformerLM(cfg.model, cfg.compute, rngs=rngs, lora=cfg.lora, qat=cfg.qat,
                          microbatches=cfg.parallel.microbatches)
    if base is not None:
        lora_lib.set_base(model, base)
    return model


def split_model(model: nnx.Module):
    """(graphdef, params, non_trainable): the trainable leaves apart from every other variable. Trainable are the
    LoRA adapters when the model has any (the base is then frozen: no gradient, no optimizer state),
    else every nnx.Param."""
    trainable = nnx.LoRAParam if lora_lib.has_adapters(model) else nnx.Param
    return nnx.split(model, trainable, ...)


def init_state(cfg: Config, tx: optax.GradientTransformation):
    """(graphdef, state-maker) of `build_model(cfg)`: call the maker (optionally with base weights) under
    `jax.jit(..., out_shardings=...)` to build the state sharded."""
    graphdef, _, _ = split_model(nnx.eval_shape(lambda: build_model(cfg)))
    return graphdef, lambda base=None: TrainState.create(build_model(cfg, base), tx)


def make_train_step(graphdef, tx: optax.GradientTransformation, schedule: Callable, grad_accum: int = 1):
    """The pure step function (not jitted: the caller jits it with shardings and donation)."""

    def loss_fn(params, non_trainable, x, y):
        # Fresh Variable objects at this trace level: the dropout RNG counter is mutated below,
        # and nnx refuses to mutate Variables created outside the grad trace.
        non_trainable = jax.tree.map(lambda v: v, non_trainable)
        model = nnx.merge(graphdef, params, non_trainable)
        model.set_attributes(deterministic=False, raise_if_not_found=False)  # LoRA adapter dropout
        loss = lm_loss(model, x, y, deterministic=False)
        _, _, non_trainable = split_model(model)  # dropout RNG counters advance
        return loss, non_trainable

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, x: jax.Array, y: jax.Array):
        params, non_trainable = state.params, state.non_trainable
        if grad_accum == 1:
            (loss, non_trainable), grads = grad_fn(params, non_trainable, x, y)
        else:
            B, T = x.shape
            A = grad_accum
            xs = x.reshape(B // A, A, T).swapaxes(0, 1)  # (A, B/A, T): micro-batch j = rows j, j+A, ...
            ys = y.reshape(B // A, A, T).swapaxes(0, 1)

            def micro(carry, xy):
                non_trainable, gsum, lsum = carry
                (l, non_trainable), g = grad_fn(params, non_trainable, *xy)
                return (non_trainable, jax.tree.map(jnp.add, gsum, g), lsum + l), None

            zeros = jax.tree.map(jnp.zeros_like, params)
            init = (non_trainable, zeros, jnp.zeros((), jnp.float32))
            (non_trainable, gsum, lsum), _ = jax.lax.scan(micro, init, (xs, ys))
            grads = jax.tree.map(lambda g: g / A, gsum)
            loss = lsum / A
        grad_norm = optax.global_norm(grads)
        updates, opt_state = tx.update(grads, state.opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": grad_norm,
            "param_norm": optax.global_norm(params),
            "lr": jnp.asarray(schedule(state.step), jnp.float32),
        }
        return TrainState(state.step + 1, params, opt_state, non_trainable), metrics

    return train_step


def make_multi_step(train_step):
    """(state, xs, ys) with a leading axis of n batches -> (state, metrics stacked over the n steps)."""

    def multi_step(state: TrainState, xs: jax.Array, ys: jax.Array):
        return jax.lax.scan(lambda s, xy: train_step(s, *xy), state, (xs, ys))

    return multi_step


def eval_sums(nll: jax.Array, correct: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Sums over the scored targets (mask 1) of the cross-entropy and argmax == target, each (B, T): summed,
    not averaged, so that batches of any size and a padded last batch add up to the same totals."""
    return {"loss_sum": jnp.sum(nll * mask), "correct": jnp.sum(correct.astype(jnp.float32) * mask),
            "tokens": jnp.sum(mask)}


def make_eval_step(graphdef):
    """(state, x, y, mask) -> `eval_sums` of the batch, no dropout."""

    def eval_step(state: TrainState, x, y, mask):
        return eval_sums(*lm_terms(state.model(graphdef), x, y), mask)

    return eval_step
