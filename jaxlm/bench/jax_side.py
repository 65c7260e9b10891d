"""JAX half of a benchmark row: build a jitted step, compile it apart, time it, read its memory.

Each mode is a pure function of arrays, jitted once and compiled ahead of time
(`jit(f).lower(*args).compile()`), so compile time is measured on its own and
`memory_analysis()` / `cost_analysis()` are available before anything runs.
The train step is training's own (`jaxlm.training.step.make_train_step` with
`jaxlm.training.optim.make_optimizer` at the default `OptimConfig`), donated as in training,
so a benchmark row measures exactly what `python -m jaxlm.train` runs.
"""

from __future__ import annotations

import re
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxlm.analysis.memory import compiled_memory
from jaxlm.core.config import ComputeConfig, ModelConfig, OptimConfig
from jaxlm.nn.loss import lm_loss
from jaxlm.nn.model import TransformerLM
from jaxlm.training.optim import make_optimizer
from jaxlm.training.step import TrainState, make_train_step, split_model
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


def build_step(mode: str, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, seed: int = 0) -> Step:
    """forward -> logits; forward_backward -> (loss, grads); train_step -> (train state, metrics)."""
    model = TransformerLM(cfg, compute, rngs=nnx.Rngs(seed))
    graphdef, params, rest = split_model(model)
    tokens, targets = batch_arrays(cfg, batch, context, seed)

    def loss_fn(p, r, x, y):
        return lm_loss(nnx.merge(graphdef, p, r), x, y)

    if mode == "forward":

        def forward(p, r, x):
            return nnx.merge(graphdef, p, r)(x)  # (B, T, V)

        return Step(jax.jit(forward), (params, rest, tokens), lambda args, out: args)
    if mode == "forward_backward":
        return Step(jax.jit(jax.value_and_grad(loss_fn)), (params, rest, tokens, targets), lambda args, out: args)
    if mode == "train_step":
        tx, schedule = make_optimizer(OptimConfig(), total_steps=1000)
        state = TrainState.create(model, tx)
        jitted = jax.jit(make_train_step(graphdef, tx, schedule), donate_argnums=0)
        return Step(jitted, (state, tokens, targets), lambda a, out: (out[0], *a[1:]))
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
    """Compile and warm up one JAX setting, filling the row's compile time, compiled memory and FLOPs; returns
    its (run, finish) pair (`jaxlm.bench.core.run_group` says how they are called), or None when the row is
    already decided (OOM by the compiled estimate)."""
    step = build_step(setting.mode, cfg, compute, batch, context, opts.seed)
    t0 = time.perf_counter()
    compiled = compile_step(step)
    row["compile_s"] = time.perf_counter() - t0
    estimate = getattr(compiled_memory(compiled), "total", None)
    row["estimate_gb"] = estimate / 1e9 if estimate is not None else None
    row["xla_flops"] = compiled_flops(compiled)
    row.update(compiled_matmuls(compiled))
    if opts.memory_limit_gb is not None and estimate is not None and estimate > opts.memory_limit_gb * 1e9:
        row["status"] = "OOM"
        row["memory_source"] = "memory_analysis"
        row["error"] = f"estimated {estimate / 1e9:.3f} GB > --memory-limit-gb {opts.memory_limit_gb}"
        return None
    state = {"args": step.args, "cpu": 0.0}

    def run(n: int, timed: bool = True) -> list[float]:
        """n steps, each to completion: wall seconds per step (their CPU seconds summed when `timed`)."""
        times = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*donated buffers.*")
            for _ in range(n):
                t, cpu = time.perf_counter(), time.process_time()
                out = compiled(*state["args"])
                jax.block_until_ready(out)
                times.append(time.perf_counter() - t)
                state["cpu"] += (time.process_time() - cpu) if timed else 0.0
                state["args"] = step.advance(state["args"], out)
        return times

    def finish(times: list[float]) -> None:
        # This process's CPU time per timed step: steadier than wall time under load.
        row["step_cpu_ms"] = 1e3 * state["cpu"] / len(times)
        peak = peak_memory_bytes()
        if peak is not None:
            row["memory_gb"], row["memory_source"] = peak / 1e9, "memory_stats"
        else:
            row["memory_gb"], row["memory_source"] = row["estimate_gb"], "memory_analysis"
        state.clear()

    run(opts.warmup, timed=False)
    return run, finish


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
