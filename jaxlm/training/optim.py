"""The optimizer of docs/spec.md as one optax transform, built from `OptimConfig`.

    clip_by_global_norm(grad_clip) -> scale_by_spec_adam(b1, b2, eps)
        -> add_decayed_weights(weight_decay) -> scale_by_learning_rate(schedule)

Choices written down here (the spec is silent or differs only in rounding):
  * The Adam step is the specification's (and torchref's): alpha_t m / (sqrt(v) + eps) with
    alpha_t = lr sqrt(1 - b2^t) / (1 - b1^t). optax.adamw adds eps to the
    bias-corrected sqrt(v_hat) instead, which differs where sqrt(v) ~ eps, e.g.
    rows of a tied embedding whose tokens never occur; there the two drift apart
    by ~1e-3 in loss within 20 steps, while this transform tracks torchref to 1e-5.
  * Decay uses the pre-update parameters, scaled by lr (PyTorch's order).
  * Weight decay is passed explicitly (optax's default is 1e-4, torch's 1e-2) and
    applies to every parameter, norms and embeddings included, as in torchref.
  * optax scales clipped gradients by ``M / max(|g|, M)``; the specification's ``M / (|g| + 1e-6)``
    differs only in rounding.
  * The schedule is evaluated at the optimizer's update count t = 0, 1, ... so the
    very first update uses lr(0) = 0 when warmup_steps > 0 (as torchref does).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlm.core.config import OptimConfig


class SpecAdamState(NamedTuple):
    count: jax.Array  # updates applied so far (int32)
    mu: optax.Updates  # first moment m
    nu: optax.Updates  # second moment v


def scale_by_spec_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """The specification's Adam direction: sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)."""

    def init(params):
        zeros = lambda: jax.tree.map(lambda p: jnp.zeros_like(p, dtype=jnp.float32), params)  # noqa: E731
        return SpecAdamState(jnp.zeros([], jnp.int32), zeros(), zeros())

    def update(grads, state, params=None):
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
        t = state.count + 1
        tf = t.astype(jnp.float32)
        alpha = jnp.sqrt(1 - b2**tf) / (1 - b1**tf)
        updates = jax.tree.map(lambda m, v: alpha * m / (jnp.sqrt(v) + eps), mu, nu)
        return updates, SpecAdamState(t, mu, nu)

    return optax.GradientTransformation(init, update)


def adamw(schedule, b1: float, b2: float, eps: float, weight_decay: float) -> optax.GradientTransformation:
    """The specification's AdamW with decoupled decay: theta -= lr_t * (adam_step + weight_decay * theta)."""
    return optax.chain(
        scale_by_spec_adam(b1, b2, eps),
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(schedule),
    )


def make_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    """Warmup then cosine (docs/spec.md): optax's schedule equals the formula to float32 rounding (tested).

    The cosine must span at least one step, so T_c is raised to T_w + 1 when a run is shorter than its warmup.
    """
    cosine_steps = cfg.cosine_steps or total_steps
    return optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.warmup_steps, max(cosine_steps, cfg.warmup_steps + 1),
                                              cfg.min_lr)


def make_optimizer(cfg: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, callable]:
    """(transform, schedule): optional global-norm clipping, then AdamW on the schedule."""
    schedule = make_schedule(cfg, total_steps)
    parts = []
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    parts.append(adamw(schedule, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay))
    return optax.chain(*parts), schedule
