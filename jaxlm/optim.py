"""The optimizer of SPEC section 2 as one optax transform, built from `OptimConfig`.

    clip_by_global_norm(optim.grad_clip)  ->  adamw(schedule, b1, b2, eps, weight_decay)

Choices written down here (the spec is silent or differs only in rounding):
  * Weight decay is passed explicitly (optax's default is 1e-4, torch's 1e-2) and
    applies to every parameter, norms and embeddings included, as in torchref.
  * optax scales clipped gradients by ``M / max(|g|, M)``; SPEC's ``M / (|g| + 1e-6)``
    differs only in rounding.
  * The schedule is evaluated at the optimizer's update count t = 0, 1, ... so the
    very first update uses lr(0) = 0 when warmup_steps > 0 (as torchref does).
"""

from __future__ import annotations

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


def make_schedule(cfg: OptimConfig, total_steps: int):
    return warmup_cosine(cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.cosine_steps or total_steps)


def make_optimizer(cfg: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, callable]:
    """(transform, schedule): optional global-norm clipping, then AdamW on the schedule."""
    schedule = make_schedule(cfg, total_steps)
    parts = []
    if cfg.grad_clip > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip))
    parts.append(optax.adamw(schedule, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay))
    return optax.chain(*parts), schedule
