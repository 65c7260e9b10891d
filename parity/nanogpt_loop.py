"""The torch side of `python -m jaxlm.bench nanogpt` (parity/nanogpt.py): nanoGPT's loop on torchref, and jaxlm's
train step timed beside it. Needs torch; the command's front (its flags, --help) does not."""

from __future__ import annotations

import statistics

import numpy as np
import torch

from jaxlm.bench.timing import Load, time_calls, timed
from jaxlm.data.loader import eval_batches
from parity.convert import torch_config
from torchref.data import get_batch
from torchref.model import TransformerLM
from torchref.optim import AdamW, clip_grad_norm, cross_entropy, lr_cosine_schedule


@torch.no_grad()
def val_loss(model, data_dir, B, T, eval_tokens):
    """Mean loss over the validation targets jaxlm's evaluation scores (`eval_batches`: data.eval_tokens)."""
    model.eval()
    total, n = 0.0, 0
    for x, y, mask in eval_batches(data_dir, "val", B, T, eval_tokens):
        keep = torch.from_numpy(mask.reshape(-1) > 0)
        logits = model(torch.from_numpy(x).long()).reshape(-1, model.cfg.vocab_size)[keep]
        total += float(cross_entropy(logits, torch.from_numpy(y).long().reshape(-1)[keep])) * int(keep.sum())
        n += int(keep.sum())
    model.train()
    return total / n


def loop_step(cfg, compile: bool):
    """nanoGPT's step on torchref: (model, step(t, x, y) -> loss) with the recipe's AdamW, learning-rate
    schedule (at step t) and clipping."""
    torch.manual_seed(cfg.train.seed)
    model = TransformerLM(torch_config(cfg.model))
    o = cfg.optim
    opt = AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
    fwd = torch.compile(model) if compile else model

    def step(t: int, x, y):
        for g in opt.param_groups:
            g["lr"] = lr_cosine_schedule(t, o.lr, o.min_lr, o.warmup_steps, o.cosine_steps or cfg.train.steps)
        loss = cross_entropy(fwd(x).reshape(-1, cfg.model.vocab_size), y.reshape(-1))  # x, y (B, T)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if o.grad_clip > 0:
            clip_grad_norm(model.parameters(), o.grad_clip)
        opt.step()
        return loss

    return model, step


def train(cfg, train_tokens, steps: int, warmup: int, compile: bool) -> tuple[torch.nn.Module, dict]:
    """nanoGPT's loop on torchref: (model, timings of the steps after `warmup`, last training loss)."""
    model, step = loop_step(cfg, compile)
    B, T, total = cfg.data.batch_size, cfg.model.context_length, cfg.train.steps
    rng, done, last = np.random.default_rng(cfg.train.seed), [0], [None]

    def call():
        last[0] = step(done[0], *get_batch(train_tokens, B, T, "cpu", rng))
        done[0] += 1

    timing, wall = timed(lambda: time_calls(call, steps - warmup, warmup=warmup))
    timed_s, n = sum(timing.seconds), steps - warmup
    return model, {"threads": torch.get_num_threads(), "compile": compile, "timed_steps": n,
                   "step_time_s": timed_s / n, "tokens_per_s": n * B * T / timed_s,
                   "extrapolated_total_s": timed_s / n * total, "train_loss": last[0].item(), "wall_s": wall}


def side_by_side(cfg, train_tokens, blocks: int) -> dict:
    """jaxlm's train step (the trainer's, steps_per_call per call) and the torchref loop, in alternating blocks."""
    import jax

    from jaxlm.core import sharding
    from jaxlm.training.loop import build

    n, B, T = cfg.train.steps_per_call, cfg.data.batch_size, cfg.model.context_length
    built = build(cfg, sharding.make_mesh(jax.devices()[:1], cfg.parallel))
    rng = np.random.default_rng(cfg.train.seed)
    state = {"s": built.make_state()}

    def jax_block():
        xy = [get_batch(train_tokens, B, T, "cpu", rng) for _ in range(n)]
        xs, ys = (np.stack([b[i].numpy() for b in xy]) for i in (0, 1))  # (n, B, T) each
        step = built.multi_fn if n > 1 else lambda s, x, y: built.step_fn(s, x[0], y[0])
        state["s"], metrics = step(state["s"], xs, ys)
        state["loss"] = float(np.ravel(metrics["loss"])[-1])

    torch_block = torch_steps(cfg, train_tokens, n)
    times = {"jax": [], "torch": []}
    with Load() as load:
        for r in range(blocks + 1):  # block 0: compile and warm up, untimed
            for name, block in ((("jax", jax_block), ("torch", torch_block)) if r % 2 == 0 else
                                (("torch", torch_block), ("jax", jax_block))):
                (seconds,) = time_calls(block, 1, settled=True).seconds
                if r:
                    times[name].append(seconds / n)
    ratios = [t / j for j, t in zip(times["jax"], times["torch"])]
    ratios = statistics.quantiles(ratios, n=4, method="inclusive") if blocks > 1 else ratios * 3
    jax_s, torch_s = statistics.median(times["jax"]), statistics.median(times["torch"])
    return load.mark({"steps_per_block": n, "blocks": blocks, "jax_step_time_s": jax_s, "torch_step_time_s": torch_s,
                      "speedup": ratios[1], "speedup_iqr": [ratios[0], ratios[2]],
                      "speedup_of_medians": torch_s / jax_s,
                      "jax_train_loss": state["loss"], "torch_train_loss": torch_block.loss})


def torch_steps(cfg, train_tokens, n: int):
    """A call that runs the next n steps of the loop (its `loss` attribute: the last step's)."""
    _, step = loop_step(cfg, compile=False)
    rng, done = np.random.default_rng(cfg.train.seed), [0]

    def block():
        for _ in range(n):
            loss = step(done[0], *get_batch(train_tokens, cfg.data.batch_size, cfg.model.context_length, "cpu", rng))
            done[0] += 1
        block.loss = loss.item()  # the float() of a loss is a host sync either side, as in a logging loop

    return block
