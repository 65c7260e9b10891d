"""The optimizer of SPEC section 2 as one optax transform, built from `OptimConfig`.

    clip_by_global_norm(grad_clip) -> scale_by_spec_adam(b1, b2, eps)
        -> add_decayed_weights(weight_decay) -> scale_by_learning_rate(schedule)

Choices written down here (the spec is silent or differs only in rounding):
  * The Adam step is SPEC's (and torchref's): alpha_t m / (sqrt(v) + eps) with
    alpha_t = lr sqrt(1 - b2^t) / (1 - b1^t). optax.adamw adds eps to the
    bias-corrected sqrt(v_hat) instead, which differs where sqrt(v) ~ eps, e.g.
    rows of a tied embedding whose tokens never occur; there the two drift apart
    by ~1e-3 in loss within 20 steps, while this transform tracks torchref to 1e-5.
  * Decay uses the pre-update parameters, scaled by lr (PyTorch's order).
  * Weight decay is passed explicitly (optax's default is 1e-4, torch's 1e-2) and
    applies to every parameter, norms and embeddings included, as in torchref.
  * optax scales clipped gradients by ``M / max(|g|, M)``; SPEC's ``M / (|g| + 1e-6)``
    differs only in rounding.
  * The schedule is evaluated at the optimizer's update count t = 0, 1, ... so the
    very first update uses lr(0) = 0 when warmup_steps > 0 (as torchref does).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxlm.config import OptimConfig


def warmup_cosine(lr_max: float, lr_min: float, warmup: int, cosine_steps: int):
    """SPEC section 2: t/T_w * lr_max, then cosine from lr_max to lr_min at T_c, then lr_min."""
    warmup = int(warmup)
    cosine_steps = max(int(cosine_steps), warmup)

    def schedule(t):
        t = jnp.asarray(t, jnp.float32)
        warm = lr_max * t / max(warmup, 1)
        span = max(cosine_steps - warmup, 1)
        frac = jnp.clip((t - warmup) / span, 0.0, 1.0)
        cos = lr_min + 0.5 * (1.0 + jnp.cos(jnp.pi * frac)) * (lr_max - lr_min)
        return jnp.where(t < warmup, warm, jnp.where(t <= cosine_steps, cos, lr_min))

    return schedule


class SpecAdamState(NamedTuple):
    count: jax.Array  # updates applied so far (int32)
    mu: optax.Updates  # first moment m
    nu: optax.Updates  # second moment v


def scale_by_spec_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
    """Adam direction of SPEC section 2: sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)."""

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
    """SPEC's AdamW with decoupled decay: theta -= lr_t * (adam_step + weight_decay * theta)."""
    return optax.chain(
        scale_by_spec_adam(b1, b2, eps),
        optax.add_decayed_weights(weight_decay),
        optax.scale_by_learning_rate(schedule),
    )


def make_schedule(cfg: OptimConfig, total_steps: int):
    return warmup_cosine(cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.cosine_steps or total_steps)


def make_optimizer(cfg: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, callable]:
    """(transform, schedule): optional global-norm clipping, then AdamW on the schedule."""
    schedule = make_schedule(cfg, total_steps)
    parts = []
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    parts.append(adamw(schedule, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay))
    return optax.chain(*parts), schedule
