"""The GPU campaign's measuring steps: each `run(ctx) -> dict` (JSON-safe, with "rows") and an H100 time estimate
(compile time per layer, 15 steps at 40 % MFU: upper-end guesses); under `ctx.smoke` a tiny model, on a CPU."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp

from deliverables.gpu import predict
from jaxlm.analysis import flops, memory
from jaxlm.analysis.devices import DEVICES
from jaxlm.bench import measure
from jaxlm.bench.timing import time_calls
from jaxlm.core.config import ModelConfig
from jaxlm.nn.attention import attention

H100 = DEVICES["h100-80gb"].peak_flops
MFU_GUESS = 0.4
COMPILE_S_PER_LAYER = {"forward": 0.10, "forward_backward": 0.25, "train_step": 0.30}
PREDICT_S = 1.5  # a timed row's prediction: its program lowered again and loaded from the compilation cache
TARGET_VAL_LOSS = 1.47
TINY = ModelConfig(vocab_size=257, context_length=64, d_model=64, num_layers=2, num_heads=4)
NO_CUDNN = "cuDNN attention needs an NVIDIA GPU; this is {}"


@dataclass
class Context:
    """What a step runs with: where it writes, at which size, until when."""

    out: Path
    smoke: bool
    deadline: float  # time.monotonic() after which long steps stop between rows
    scratch: Path | None = None  # bulky outputs (traces, runs, the compilation cache), not the committed report
    warmup: int = field(init=False)
    steps: int = field(init=False)
    device: str = field(init=False)
    gpu: bool = field(init=False)

    def __post_init__(self):
        from jaxlm.bench.steps import device_kind

        self.warmup, self.steps = (1, 2) if self.smoke else (5, 10)
        self.device, self.gpu = device_kind(), jax.devices()[0].platform == "gpu"
        self.scratch = self.scratch or (self.out if self.smoke else Path("runs/gpu_campaign"))

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def no_cudnn(self, attention: str) -> str | None:
        """Why a row of `attention` cannot run here, or None."""
        return NO_CUDNN.format(self.device) if attention == "cudnn" and not self.gpu else None


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    run: Callable[[Context], dict]
    seconds: float  # estimated on an H100
    smoke_seconds: float
    cuts: bool = True  # stops between rows at its deadline, keeping the rows done (a partial run is worth having)

    def estimate(self, smoke: bool) -> float:
        return self.smoke_seconds if smoke else self.seconds


def models(smoke: bool, names: tuple[str, ...] = ("small", "medium", "large")) -> dict[str, ModelConfig]:
    return {"tiny": TINY} if smoke else {n: ModelConfig.from_name(n) for n in names}


def contexts(smoke: bool) -> tuple[int, ...]:
    return (32,) if smoke else (128, 256, 512, 1024)


def _rows(ctx: Context, cases, rows_of) -> dict:
    """{"rows": the rows of each case (`rows_of(*case)`, a list)}, with "cut" when the deadline came first."""
    rows = []
    for case in cases:
        if ctx.out_of_time():
            return {"rows": rows, "cut": "the budget ran out"}
        rows += rows_of(*case)
    return {"rows": rows}


def row_seconds(cfg: ModelConfig, mode: str, dtype: str, batch: int, context: int) -> float:
    run = 15 * flops.step_flops(cfg, batch, context, mode) / (H100[dtype] * MFU_GUESS)
    return 1.0 + COMPILE_S_PER_LAYER[mode] * cfg.num_layers + run


# --------------------------------------------------------------------------- 1. attention kernels

# (contexts, window, tokens per call, heads, head dim): at full size and under --smoke
ATTN_SIZES = {False: ((128, 256, 512, 1024, 2048, 4096, 8192), 256, 16384, 12, 64), True: ((32,), 16, 128, 2, 16)}
ATTENTION_SECONDS = len(ATTN_SIZES[False][0]) * 2 * 5.0  # 10 small compiles and ~60 short calls per case


def _timed(fn, args, warmup: int, steps: int) -> tuple[float, float]:
    """Mean and std milliseconds of `fn(*args)` (jaxlm.bench's timing loop)."""
    seconds = time_calls(lambda: fn(*args), steps, warmup=warmup, wait=jax.block_until_ready).seconds
    return 1e3 * statistics.fmean(seconds), 1e3 * statistics.pstdev(seconds)


def attention_fns(impl: str, window: int | None):
    """(forward, gradient of q, k, v for a cotangent), both jitted."""
    fwd = jax.jit(lambda q, k, v: attention(q, k, v, implementation=impl, causal=True, window=window))
    loss = lambda q, k, v, ct: jnp.sum(fwd(q, k, v).astype(jnp.float32) * ct)
    return fwd, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def attention_inputs(seed: int, shape: tuple, window: int | None):
    """(bfloat16 (q, k, v), cotangent, errors(fwd, bwd)): the relative errors of an implementation's output and
    (worst) gradient against float32 xla attention on the same (upcast) inputs."""
    keys = jax.random.split(jax.random.key(seed), 4)
    q, k, v, ct = (jax.random.normal(kk, shape, jnp.float32) for kk in keys)
    args = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
    ref_fwd, ref_bwd = attention_fns("xla", window)
    up = tuple(x.astype(jnp.float32) for x in args)
    ref_out, ref_grads = ref_fwd(*up), ref_bwd(*up, ct)

    def rel_error(a, b) -> float:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))

    def errors(fwd, bwd) -> dict:
        return {"out_rel_err": rel_error(fwd(*args), ref_out),
                "grad_rel_err": max(rel_error(g, r) for g, r in zip(bwd(*args, ct), ref_grads))}

    return args, ct, errors


def _attention_case(ctx: Context, T: int, window: int | None, shape: tuple) -> list[dict]:
    """xla and cudnn at bfloat16 against the float32 xla reference on the same (upcast) inputs."""
    args, ct, errors = attention_inputs(T, shape, window)
    rows = []
    for impl in ("xla", "cudnn"):
        row = dict(context=T, window=window, batch=shape[0], implementation=impl, dtype="bfloat16")
        if ctx.no_cudnn(impl):
            rows.append({**row, "status": "skipped", "reason": ctx.no_cudnn(impl)})
            continue
        try:
            fwd, bwd = attention_fns(impl, window)
            row.update(errors(fwd, bwd))
            row["fwd_ms"], row["fwd_ms_std"] = _timed(fwd, args, ctx.warmup, ctx.steps)
            row["fwd_bwd_ms"], row["fwd_bwd_ms_std"] = _timed(bwd, (*args, ct), ctx.warmup, ctx.steps)
            row["predicted_fwd_ms"] = predict.program_ms(fwd, args)
            row["predicted_fwd_bwd_ms"] = predict.program_ms(bwd, (*args, ct))
            row["status"] = "ok"
        except Exception as e:
            row.update(status="OOM" if measure.is_oom(e) else "error",
                       reason=f"{type(e).__name__}: {str(e).strip()[:200]}")
        rows.append(row)
    return rows


def run_attention(ctx: Context) -> dict:
    ctxs, window, tokens, heads, hd = ATTN_SIZES[ctx.smoke]
    cases = [(T, w, (max(tokens // T, 1), T, heads, hd)) for T in ctxs for w in (None, window)]
    res = _rows(ctx, cases, lambda *case: _attention_case(ctx, *case))
    return res if "cut" in res else {**res, "tokens_per_call": tokens, "heads": heads, "head_dim": hd}


# --------------------------------------------------------------------------- 2-3. bench table and techniques

def _sweep(ctx: Context, name: str, cfg: ModelConfig, settings, context: int, batch: int) -> list[dict]:
    """jaxlm.bench's rows (one per setting), each with jaxlm.memory's estimate and the roofline's prediction."""
    opts = measure.Options(warmup=ctx.warmup, steps=ctx.steps, model_name=name)
    rows = measure.run_sweep(cfg, settings, [context], [batch], opts)
    for s, r in zip(settings, rows):
        if r.get("status") == "ok" or r.get("estimate_gb") is not None:
            cfg_r, compute = s.configs(cfg, context)
            r["jaxlm_memory_estimate_gb"] = memory.estimate(cfg_r, batch, context, compute, r["mode"]).total / 1e9
            r.update(predict.for_row(r, cfg_r, compute))
    return rows


def table_run(dtype: str):
    def run(ctx: Context) -> dict:
        modes = ("train_step",) if ctx.smoke and dtype == "float32" else flops.MODES
        settings = [measure.BenchCase(mode=m, dtype=dtype) for m in modes]
        cases = [(name, cfg, T) for name, cfg in models(ctx.smoke).items() for T in contexts(ctx.smoke)]
        res = _rows(ctx, cases, lambda name, cfg, T: _sweep(ctx, name, cfg, settings, T, 2 if ctx.smoke else 4))
        if "cut" in res:
            return res
        from deliverables.report.charts import bench_figures

        try:
            (ctx.out / f"bench_{dtype}").mkdir(parents=True, exist_ok=True)
            bench_figures(res["rows"], ctx.out / f"bench_{dtype}")
        except Exception as e:  # a missing plotting extra must not cost the table
            print(f"warning: no plots for bench_{dtype}: {e}", file=sys.stderr)
        return res

    return run


def table_seconds(dtype: str) -> float:
    return sum(row_seconds(cfg, m, dtype, 4, T) + PREDICT_S for cfg in models(False).values()
               for T in contexts(False) for m in flops.MODES)


TECHNIQUES = tuple(measure.BenchCase(mode="train_step", dtype="bfloat16", attention=a, remat=r)
                   for a, r in (("xla", "none"), ("xla", "full"), ("xla", "dots_saveable"), ("cudnn", "none")))


def run_techniques(ctx: Context) -> dict:
    """Train steps at bfloat16 per technique; rows ordered by estimated memory so that the device's
    process-wide peak rises row by row (a row whose peak did not rise is marked so)."""
    T, batch = (32, 2) if ctx.smoke else (1024, 4)

    def rows_of(name: str, cfg: ModelConfig, s) -> list[dict]:
        if ctx.no_cudnn(s.attention):
            return [{"model": name, "mode": s.mode, "dtype": s.dtype, "attention": s.attention, "remat": s.remat,
                     "context": T, "status": "skipped", "error": ctx.no_cudnn(s.attention)}]
        return _sweep(ctx, name, cfg, [s], T, batch)

    cases = [(name, cfg, s) for name, cfg in models(ctx.smoke, ("small", "large")).items()
             for s in sorted(TECHNIQUES, key=lambda s: _estimated(s, cfg, batch, T))]
    res, best = _rows(ctx, cases, rows_of), 0.0  # the device's peak is process-wide: rows say whether theirs rose
    for r in res["rows"]:
        peak = r.get("memory_gb") if r.get("memory_source") == "memory_stats" else None
        if peak is not None:
            r["peak_is_this_row"], best = peak > best, max(best, peak)
    return res


def _estimated(setting, cfg: ModelConfig, batch: int, context: int) -> float:
    model, compute = setting.configs(cfg, context)
    return memory.estimate(model, batch, context, compute).total


def techniques_seconds() -> float:
    return sum(row_seconds(ModelConfig.from_name(n), "train_step", "bfloat16", 4, 1024)
               * (1.3 if s.remat != "none" else 1) + PREDICT_S for n in ("small", "large") for s in TECHNIQUES)


def run_max_batch(ctx: Context) -> dict:
    """Largest batch per technique at context 1024 (`small`): jaxlm.memory's prediction for this device, then
    one-step runs searched around it (jaxlm.analysis.memory.search_largest) up to the largest batch that runs."""
    cfg, T = (TINY, 32) if ctx.smoke else (ModelConfig.from_name("small"), 1024)
    capacity = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
    rows = []
    for s in TECHNIQUES:
        model, compute = s.configs(cfg, T)
        row = {"attention": s.attention, "remat": s.remat, "context": T}
        if ctx.no_cudnn(s.attention):
            rows.append({**row, "status": "skipped", "reason": ctx.no_cudnn(s.attention)})
            continue
        predicted = memory.largest_batch(model, T, capacity * memory.DEFAULT_USABLE, compute) if capacity else None
        fits, probed = measure.batch_fits(s, cfg, T, measure.Options(warmup=0, steps=1, model_name="small")), []

        def probe(b: int) -> bool:
            if ctx.out_of_time():
                raise TimeoutError("the budget ran out")
            probed.append(b)
            return fits(b)

        try:
            largest = memory.search_largest(probe, 1 if ctx.smoke else 4096, predicted or 8)
        except TimeoutError as e:
            rows.append({**row, "status": "cut", "reason": str(e), "predicted": predicted, "probed": probed})
            continue
        rows.append({**row, "status": "ok", "predicted": predicted, "probed": probed, "largest_ok": largest})
    return {"rows": rows, "device_bytes": capacity}


def max_batch_seconds() -> float:
    return 4 * 4 * row_seconds(ModelConfig.from_name("small"), "train_step", "bfloat16", 32, 1024)


# --------------------------------------------------------------------------- 6. shakespeare (5. profile: profile.py)

def run_shakespeare(ctx: Context) -> dict:
    """The shakespeare GPU recipe (experiments/plans/_shakespeare.toml, size gpu) as a `jaxlm.train`
    subprocess; time to the first evaluation with validation loss <= 1.47."""
    from deliverables.gpu.carry import REPO
    from jaxlm.core.typedconfig import flatten_tree, read_toml

    recipe = read_toml(REPO / "experiments/plans/_shakespeare.toml")  # the repository's, wherever the call runs
    size = recipe["sizes"]["cpu" if ctx.smoke else "gpu"]
    sets = {**flatten_tree(recipe["defaults"].get("set", {})), **flatten_tree(size.get("set", {}))}
    run_dir = ctx.scratch / "shakespeare_run"
    sets.update({"train.out_dir": str(run_dir), "checkpoint.every": 100000, "log.tensorboard": False})
    if ctx.smoke:
        sets.update({"data.dir": str(ctx.out / "data"), "train.steps": 4, "train.eval_every": 2,
                     "data.eval_tokens": 1024, "log.sample_tokens": 0})
    config = REPO / size.get("config", recipe["defaults"]["config"])
    cmd = [sys.executable, "-m", "jaxlm.train", "--config", str(config),
           *(a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}"))]
    timeout = max(ctx.deadline - time.monotonic(), 10.0)
    launched = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        status = f"stopped at the budget ({timeout:.0f} s)"
    else:
        if proc.returncode != 0:  # the step failed: not a result
            raise RuntimeError(f"python -m jaxlm.train exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        status = "ok"
    wall = time.time() - launched
    metrics = run_dir / "metrics.jsonl"  # evaluations: seconds since launch, data and compilation included
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    evals = [{"step": r["step"], "val_loss": r["eval/loss"], "seconds": r["time"] - launched}
             for r in records if r.get("kind") == "eval" and "eval/loss" in r]
    hit = next((e for e in evals if e["val_loss"] <= TARGET_VAL_LOSS), None)
    return {"rows": evals, "status": status, "wall_s": wall, "target": TARGET_VAL_LOSS,
            "reached": hit, "command": " ".join(["python", *cmd[1:]])}

