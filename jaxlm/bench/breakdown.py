"""Where the time goes: attention vs feed-forward vs output head, each jitted and timed standalone.

Each component is the model's own module (jaxlm.nn.model) at the model's shapes:
attention = CausalSelfAttention with RoPE (projections + core), feed-forward =
the SwiGLU / SiLU block, head = ln_final + lm_head + cross-entropy. Attention and
feed-forward times are per layer, multiplied by num_layers. Backward time is
(forward+backward) - forward, where forward+backward is `value_and_grad` of the
output's sum with respect to the parameters and the input. Standalone timing
misses fusion across component boundaries and the residual adds and norms, so
the parts need not add up to the whole step; their *shares* are what to compare
with the analytic FLOP shares.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxlm.analysis import flops
from jaxlm.bench.timing import time_calls
from jaxlm.core.config import ComputeConfig, ModelConfig
from jaxlm.nn.layers import FFNS, Linear, Precision, RMSNorm, RotaryEmbedding
from jaxlm.nn.loss import cross_entropy
from jaxlm.nn.model import CausalSelfAttention, LinearKinds


def mean_seconds(fn, args, warmup: int, steps: int) -> float:
    """Mean seconds of `fn(*args)` over `steps` calls after `warmup`, each waited for."""
    return float(np.mean(time_calls(lambda: fn(*args), steps, warmup=warmup, wait=jax.block_until_ready).seconds))


class _Head(nnx.Module):
    def __init__(self, cfg: ModelConfig, precision: Precision, rngs: nnx.Rngs):
        self.ln_final = RMSNorm(cfg.d_model, cfg.eps)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, precision=precision, rngs=rngs)

    def __call__(self, x, targets):
        return cross_entropy(self.lm_head(self.ln_final(x)), targets)


def _components(cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int):
    """name -> (module, call(module, x) -> array, layers it stands for)."""
    rngs = nnx.Rngs(0)
    precision = Precision.from_config(compute)
    linear = LinearKinds(precision)
    rope = None
    if cfg.rope:
        tables = RotaryEmbedding(cfg.head_dim, context, cfg.rope_theta)(jnp.arange(context))
        rope = tables
    targets = jax.random.randint(jax.random.key(1), (batch, context), 0, cfg.vocab_size)
    return {
        "attention": (CausalSelfAttention(cfg, compute.attention, linear=linear, rngs=rngs), lambda m, x: m(x, rope),
                      cfg.num_layers),
        "ffn": (FFNS[cfg.ffn](cfg.d_model, cfg.d_ff, linear=linear, rngs=rngs), lambda m, x: m(x), cfg.num_layers),
        "lm_head": (_Head(cfg, precision, rngs), lambda m, x: m(x, targets), 1),
    }


def component_breakdown(cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, *, warmup: int = 3,
                        steps: int = 10) -> dict:
    """Per component: forward / backward seconds (whole model: x num_layers), their shares, and FLOP shares."""
    x = jax.random.normal(jax.random.key(0), (batch, context, cfg.d_model), jnp.dtype(compute.dtype))  # (B, T, D)
    fwd_flops = flops.forward_flops(cfg, context)
    analytic = {"attention": fwd_flops.attention, "ffn": fwd_flops.ffn, "lm_head": fwd_flops.lm_head}
    out = {"dtype": compute.dtype, "attention_impl": compute.attention, "context": context, "batch": batch,
           "components": {}}
    for name, (module, call, layers) in _components(cfg, compute, batch, context).items():
        graphdef, params = nnx.split(module)

        def f(p, x, graphdef=graphdef, call=call):
            return jnp.sum(call(nnx.merge(graphdef, p), x).astype(jnp.float32))

        fwd = jax.jit(f).lower(params, x).compile()
        fwd_bwd = jax.jit(jax.value_and_grad(f, argnums=(0, 1))).lower(params, x).compile()
        t_f = mean_seconds(fwd, (params, x), warmup, steps) * layers
        t_fb = mean_seconds(fwd_bwd, (params, x), warmup, steps) * layers
        out["components"][name] = {
            "forward_s": t_f, "backward_s": max(t_fb - t_f, 0.0), "flops_forward": batch * analytic[name],
        }
    comps = out["components"]
    tot_f = sum(c["forward_s"] for c in comps.values())
    tot_b = sum(c["backward_s"] for c in comps.values())
    tot_flops = sum(c["flops_forward"] for c in comps.values())
    for c in comps.values():
        c["forward_share"] = c["forward_s"] / tot_f if tot_f else None
        c["backward_share"] = c["backward_s"] / tot_b if tot_b else None
        c["flop_share"] = c["flops_forward"] / tot_flops
        c["forward_tflops"] = c["flops_forward"] / c["forward_s"] / 1e12 if c["forward_s"] else None
    return out


def format_breakdown(result: dict) -> str:
    lines = [f"{'component':>10}  {'fwd ms':>9}  {'bwd ms':>9}  {'fwd share':>9}  {'bwd share':>9}  "
             f"{'FLOP share':>10}  {'fwd TFLOP/s':>11}"]
    for name, c in result["components"].items():
        share = lambda v: f"{100 * v:.1f}%" if v is not None else "-"
        lines.append(
            f"{name:>10}  {1e3 * c['forward_s']:9.3f}  {1e3 * c['backward_s']:9.3f}  {share(c['forward_share']):>9}  "
            f"{share(c['backward_share']):>9}  {share(c['flop_share']):>10}  {c['forward_tflops'] or 0:11.4f}"
        )
    return "\n".join(lines)
