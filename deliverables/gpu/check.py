"""The offline run's correctness smoke (docs/gpu.md): is the GPU computing jaxlm's functions right before anything is
timed? Without a GPU the same code runs on the CPU, cuDNN skipped with the reason."""

from __future__ import annotations

import time
from pathlib import Path
from pydoc_data.topics import topics

import jax
import numpy as np

from deliverables.gpu.steps import NO_CUDNN, attention_fns, attention_inputs
from jaxlm.core import sharding
from jaxlm.core.config import load_config
from jaxlm.nn.decode import Generator, SamplingParams
from jaxlm.training.checkpoint import Checkpointer
from jaxlm.training.loop import build

ATTENTION_TOL = {"out": 1e-2, "grad": 2e-2}  # bfloat16 operands land between 1e-3 and 1e-2
ATTENTION_SHAPE = (2, 256, 4, 64)  # (batch, context, heads, head_dim)
ATTENTION_WINDOW = 64
TRAIN_TOL = 2e-2
TRAIN_STEPS = 12
GENERATE_TOKENS = 24
TINY = ("model.vocab_size=257", "model.context_length=64", "model.d_model=64", "model.num_layers=2",
        "model.num_heads=4", "model.d_ff=192", "data.batch_size=8", "optim.lr=3e-3", "optim.min_lr=3e-4",
        "optim.warmup_steps=2", f"train.steps={TRAIN_STEPS}")


def attention(gpu: bool, device: str) -> list[dict]:
    """One row per (implementation, window): errors against float32 XLA attention, and whether they pass."""
    rows = []
    for window in (None, ATTENTION_WINDOW):
        _, _, errors = attention_inputs(7, ATTENTION_SHAPE, window)
        for impl in ("xla", "cudnn"):
            row = {"check": "attention", "implementation": impl, "window": window, "shape": list(ATTENTION_SHAPE)}
            if impl == "cudnn" and not gpu:
                rows.append({**row, "ok": None, "reason": NO_CUDNN.format(device)})
                continue
            row.update(errors(*attention_fns(impl, window)))
            row["ok"] = row["out_rel_err"] <= ATTENTION_TOL["out"] and row["grad_rel_err"] <= ATTENTION_TOL["grad"]
            rows.append(row)
    return rows


def text_batches(batch: int, context: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` (inputs, targets) pairs of (batch, context) byte ids from Python's bundled docs, in order."""
    ids = np.frombuffer("".join(topics[k] for k in sorted(topics)).encode(), dtype=np.uint8).astype(np.int32)
    n = context + 1
    rows = ids[: steps * batch * n].reshape(steps, batch, n)
    return [(r[:, :-1], r[:, 1:]) for r in rows]


def _run(cfg, devices, batches):
    """(losses, final state, built) of training's step on `devices` from the config's initial weights."""
    mesh = sharding.make_mesh(devices=devices, cfg=cfg.parallel)
    built = build(cfg, mesh)
    state = jax.jit(built.make_state, out_shardings=built.shardings)(None)
    where = sharding.batch_sharding(mesh)
    losses = []
    for x, y in batches:
        state, metrics = built.step_fn(state, jax.device_put(x, where), jax.device_put(y, where))
        losses.append(float(metrics["loss"]))
    return losses, state, built


def _bit_equal(a, b) -> bool:
    if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        a, b = jax.random.key_data(a), jax.random.key_data(b)
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def train_and_checkpoint(scratch: Path) -> list[dict]:
    """The bfloat16 run against the float32 CPU reference, then save / restore / generate of its state."""
    cfg = load_config(None, [*TINY, "compute.dtype=bfloat16", f"train.out_dir={scratch / 'check_run'}"])
    ref_cfg = load_config(None, [*TINY, "compute.dtype=float32"])
    batches = text_batches(cfg.data.batch_size, cfg.model.context_length, TRAIN_STEPS)
    losses, state, built = _run(cfg, jax.devices()[:1], batches)
    ref, _, _ = _run(ref_cfg, jax.devices("cpu")[:1], batches)
    worst = max(abs(a - b) / b for a, b in zip(losses, ref))
    train = {"check": "train", "device": str(jax.devices()[0].platform), "steps": TRAIN_STEPS, "bf16_losses": losses,
             "f32_cpu_losses": ref, "max_rel_diff": worst, "ok": bool(worst <= TRAIN_TOL and losses[-1] < losses[0])}
    ckpt = Checkpointer(cfg.train.out_dir, cfg.checkpoint)
    try:
        t0 = time.monotonic()
        ckpt.save(state, {"step": TRAIN_STEPS, "data_step": TRAIN_STEPS})
        ckpt.wait()
        restored, meta = ckpt.restore(built.abstract)
        seconds = time.monotonic() - t0
    finally:
        ckpt.close()
    equal = all(_bit_equal(a, b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)))
    prompt = [int(t) for t in batches[0][0][0, :16]]
    greedy = Generator(restored.model(built.graphdef)).generate([prompt], GENERATE_TOKENS, SamplingParams(0.0))
    tokens = [int(t) for t in greedy.tokens[0]]
    valid = len(tokens) == GENERATE_TOKENS and max(tokens) < cfg.model.vocab_size
    saved = {"check": "checkpoint", "save_restore_s": seconds, "arrays_equal": equal, "step": meta.get("step"),
             "generated": tokens, "ok": bool(equal and valid)}
    return [train, saved]


def run_checks(scratch: Path, gpu: bool, device: str) -> dict:
    """Every check; a check that raises is a failed row (the campaign still runs: its figures say what ran)."""
    rows, t0 = [], time.monotonic()
    for name, fn in (("attention", lambda: attention(gpu, device)),
                     ("train", lambda: train_and_checkpoint(scratch))):
        try:
            rows += fn()
        except Exception as e:
            rows.append({"check": name, "ok": False, "reason": f"{type(e).__name__}: {str(e).strip()[:300]}"})
    return {"rows": rows, "ok": all(r["ok"] is not False for r in rows), "seconds": time.monotonic() - t0,
            "tolerances": {"attention": ATTENTION_TOL, "train": TRAIN_TOL}}
