"""The library's side of the benchmarks: the steps training runs, compiled apart, and what is read from them.

The train step is training's own: `jaxlm.training.loop.build` on one device, from the run's config with the
row's model, compute and batch (optimizer and schedule, gradient accumulation, LoRA / QAT, donation, remat,
precision and loss as `python -m jaxlm.train` runs them); forward and forward+backward are the same model
(the state that build makes) and the same loss (`lm_loss`). Each step is compiled ahead of time
(`jit(f).lower(*args).compile()`), so compile time is measured on its own and `memory_analysis()` /
`cost_analysis()` are available before anything runs. The timing is `jaxlm.bench.measure`'s.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlm.analysis.memory import compiled_memory
from jaxlm.bench.timing import timed
from jaxlm.core import sharding
from jaxlm.core.config import ComputeConfig, Config, ModelConfig, ParallelConfig
from jaxlm.nn.loss import lm_loss
from jaxlm.nn.model import TransformerLM
from jaxlm.training.loop import build
from jaxlm.training.tracking import peak_memory_bytes


def device_kind() -> str:
    d = jax.devices()[0]
    return d.device_kind if d.platform != "cpu" else "cpu"


@dataclass
class Step:
    """A jitted step, example arguments, and how to feed one call's outputs into the next."""

    jitted: Any
    args: tuple
    advance: Callable[[tuple, Any], tuple]  # (args, outputs) -> next args


def batch_arrays(cfg: ModelConfig, batch: int, context: int, seed: int = 0):
    key = jax.random.key(seed)
    tokens = jax.random.randint(key, (batch, context + 1), 0, cfg.vocab_size, dtype=jnp.int32)
    return tokens[:, :-1], tokens[:, 1:]  # (B, T) inputs, (B, T) targets


def run_config(cfg: ModelConfig, compute: ComputeConfig, batch: int, seed: int = 0,
               run: Config | None = None) -> Config:
    """`run` (default: Config()) with this row's model, compute, batch and seed, on one device."""
    run = run or Config()
    return dataclasses.replace(run, model=cfg, compute=compute, data=dataclasses.replace(run.data, batch_size=batch),
                               train=dataclasses.replace(run.train, seed=seed), parallel=ParallelConfig())


def build_step(mode: str, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, seed: int = 0,
               run: Config | None = None) -> Step:
    """forward -> logits; forward_backward -> (loss, grads); train_step -> (train state, metrics): training's
    step for `run` (default Config()) at this model, compute and batch."""
    full = run_config(cfg, compute, batch, seed, run)
    built = build(full, sharding.make_mesh(jax.devices()[:1], full.parallel))
    tokens, targets = batch_arrays(cfg, batch, context, seed)
    if mode == "train_step":
        state = jax.jit(built.make_state, out_shardings=built.shardings)()
        return Step(built.step_fn, (state, tokens, targets), lambda a, out: (out[0], *a[1:]))
    # The same initial weights, without an optimizer state (never allocated: jit drops what it does not return).
    weights = jax.jit(lambda: (lambda s: (s.params, s.non_trainable))(built.make_state()),
                      out_shardings=(built.shardings.params, built.shardings.non_trainable))()
    graphdef = built.graphdef

    def loss_fn(params, non_trainable, x, y):
        return lm_loss(nnx.merge(graphdef, params, non_trainable), x, y)

    if mode == "forward":
        forward = lambda params, non_trainable, x: nnx.merge(graphdef, params, non_trainable)(x)  # (B, T, V)
        return Step(jax.jit(forward), (*weights, tokens), lambda args, out: args)
    if mode == "forward_backward":
        return Step(jax.jit(jax.value_and_grad(loss_fn)), (*weights, tokens, targets), lambda args, out: args)
    raise ValueError(f"unknown mode {mode!r}")


def compiled_flops(compiled) -> float | None:
    """XLA's own FLOP count (cost_analysis()['flops']: matmuls plus elementwise work)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per device program
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


# A matmul in compiled HLO text: an XLA dot (inside fusions too) or a cuBLAS call; group 1 is its output dtype.
_MATMUL = re.compile(r"= \(?(\w+)\[[^\]]*\](?:\{[^}]*\})? (?:dot\(|custom-call\(.*custom_call_target=\"__cublas)")


def compiled_matmuls(compiled) -> dict:
    """What the backend will run, read from the compiled executable: the number of matmuls (remat's
    recomputation shows as more of them) and their output dtypes (bfloat16 computed through float32 shows as f32)."""
    try:
        text = compiled.as_text()
    except Exception:
        return {}
    dtypes = _MATMUL.findall(text or "")
    return {"hlo_dots": len(dtypes), "matmul_dtypes": sorted(set(dtypes))}


def compile_step(step: Step):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers.*")
        return step.jitted.lower(*step.args).compile()


def prepare(setting, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, opts, row: dict):
    """Compile one setting's step, filling the row's compile time, compiled memory and FLOPs; returns its
    (call, wait, finish) (`jaxlm.bench.measure.Prepared`), or None when the row is already decided (OOM by
    the compiled estimate)."""
    step = build_step(setting.mode, cfg, compute, batch, context, opts.seed, opts.run)
    compiled, row["compile_s"] = timed(lambda: compile_step(step))
    row["compiled"] = True
    estimate = getattr(compiled_memory(compiled), "total", None)
    row["estimate_gb"] = estimate / 1e9 if estimate is not None else None
    row["xla_flops"] = compiled_flops(compiled)
    row.update(compiled_matmuls(compiled))
    if opts.memory_limit_gb is not None and estimate is not None and estimate > opts.memory_limit_gb * 1e9:
        row["status"] = "OOM"
        row["memory_source"] = "memory_analysis"
        row["error"] = f"estimated {estimate / 1e9:.3f} GB > --memory-limit-gb {opts.memory_limit_gb}"
        return None
    args = [step.args]

    def call():
        """One step; its outputs feed the next (a donated train state)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*donated buffers.*")
            out = compiled(*args[0])
        args[0] = step.advance(args[0], out)
        return out

    def finish() -> None:
        peak = peak_memory_bytes()
        if peak is not None:
            row["memory_gb"], row["memory_source"] = peak / 1e9, "memory_stats"
        else:
            row["memory_gb"], row["memory_source"] = row["estimate_gb"], "memory_analysis"
        args.clear()

    return call, jax.block_until_ready, finish


def matmul_call(product: Callable, a, b) -> Callable[[], Any]:
    """`product(a, b)` (a `jaxlm.bench.matmul.FORMS` form) jitted on numpy operands: a call that returns the
    product once it is computed."""
    a, b = jax.device_put(a), jax.device_put(b)
    compiled = jax.jit(product).lower(a, b).compile()
    return lambda: compiled(a, b).block_until_ready()


def decode_runner(model: TransformerLM, compute: ComputeConfig, prompts: list[list[int]], new_tokens: int,
                  use_cache: bool) -> tuple[Callable[[], list[list[int]]], Callable[[], dict]]:
    """(run, compiled): run() is one greedy generation of `prompts` (the new tokens of each row);
    compiled() the Generator's compilation counts."""
    from jaxlm.nn.decode import Generator, SamplingParams

    gen = Generator(model)
    greedy = SamplingParams(temperature=0.0)
    return (lambda: gen.generate(prompts, new_tokens, greedy, use_cache=use_cache).tokens), gen.compiled_sizes
