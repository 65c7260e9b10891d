"""`python -m parity.bench nanogpt`: nanoGPT's CPU recipe as a plain torchref training loop.

The baseline `python -m jaxlm.train --config experiments/configs/shakespeare_char.toml`
is compared with: the same model, batch, learning-rate schedule, AdamW and clipping
(from the same config flags; default that config), a plain torch loop on the same
token files. Times --steps steps after --warmup untimed ones and extrapolates to the
config's train.steps; --full trains the whole run and reports the final validation
loss too. Prints one JSON line.

`--framework both` times jaxlm's train step beside the loop, as the trainer compiles it
(`jaxlm.training.loop.build`: train.steps_per_call steps per jitted call) on batches drawn
the same way: the two alternate in blocks of steps_per_call steps, each block settled
first (`jaxlm.bench.core.settle`), and `jax_torch` is the median over the blocks of the
loop's time per step / jaxlm's in the same round.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from jaxlm import cli
from jaxlm.core.extras import require

torch = require("torch")  # this module is imported only when the command runs, inside cli.run
from jaxlm.data.loader import eval_batches  # noqa: E402
from jaxlm.data.prepare import ensure_prepared, read_meta  # noqa: E402
from parity.convert import torch_config  # noqa: E402
from torchref.data import get_batch  # noqa: E402
from torchref.model import TransformerLM  # noqa: E402
from torchref.optim import AdamW, clip_grad_norm, cross_entropy, lr_cosine_schedule  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "shakespeare_char.toml"


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


def add_args(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    cli.add_config_args(p, base="experiments/configs/shakespeare_char.toml")
    p.add_argument("--steps", metavar="N", type=int, default=200, help="timed training steps")
    p.add_argument("--warmup", metavar="N", type=int, default=10, help="untimed steps before timing")
    p.add_argument("--full", action="store_true", help="train the config's whole run (train.steps) and report "
                   "the final validation loss; the steps after --warmup are timed")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--threads", metavar="N", type=int, help="run on N CPUs (Linux; default: every CPU the process may use)")
    p.add_argument("--framework", default="torch", choices=["torch", "both"],
                   help="both: jaxlm's train step timed beside the loop, block by block")


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
    rng = np.random.default_rng(cfg.train.seed)
    t0 = t_timed = time.perf_counter()
    for t in range(steps):
        if t == warmup:
            t_timed = time.perf_counter()
        loss = step(t, *get_batch(train_tokens, B, T, "cpu", rng))
    timed, n = time.perf_counter() - t_timed, steps - warmup
    return model, {"threads": torch.get_num_threads(), "compile": compile, "timed_steps": n,
                   "step_time_s": timed / n, "tokens_per_s": n * B * T / timed,
                   "extrapolated_total_s": timed / n * total, "train_loss": loss.item(),
                   "wall_s": time.perf_counter() - t0}


def side_by_side(cfg, train_tokens, blocks: int) -> dict:
    """jaxlm's train step (the trainer's, steps_per_call per call) and the torchref loop, in alternating blocks."""
    import statistics

    import jax

    from jaxlm.bench.core import settle
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
    for r in range(blocks + 1):  # block 0: compile and warm up, untimed
        for name, block in ((("jax", jax_block), ("torch", torch_block)) if r % 2 == 0 else
                            (("torch", torch_block), ("jax", jax_block))):
            settle(block)
            t = time.perf_counter()
            block()
            if r:
                times[name].append((time.perf_counter() - t) / n)
    return {"steps_per_block": n, "blocks": blocks, "jax_step_time_s": statistics.median(times["jax"]),
            "torch_step_time_s": statistics.median(times["torch"]),
            "jax_torch": statistics.median(t / j for j, t in zip(times["jax"], times["torch"])),
            "jax_train_loss": state["loss"], "torch_train_loss": torch_block.loss}


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


def main(args: argparse.Namespace) -> int:
    cli.check_option(args.steps >= 1, "--steps", args.steps, "must be >= 1")
    cli.check_option(args.warmup >= 0, "--warmup", args.warmup, "must be >= 0")
    cli.check_option(args.threads is None or args.threads >= 1, "--threads", args.threads, "must be >= 1")
    cfg = cli.load_config_from_args(args, path=RECIPE)
    if args.full:
        cli.check_option(cfg.train.steps > args.warmup, "--warmup", args.warmup,
                    f"must be below train.steps ({cfg.train.steps}) with --full")
    cli.check_option(not (args.full and args.framework == "both"), "--framework", args.framework,
                     "times the two side by side for --steps; leave out --full")
    from jaxlm.core.host import limit_cpu_threads, tune_for_cpu_backend

    if args.threads:
        limit_cpu_threads(args.threads)
    data_dir = ensure_prepared(cfg.data)
    meta = read_meta(data_dir)
    train_tokens = np.memmap(data_dir / "train.bin", dtype=meta["dtype"], mode="r")
    if args.framework == "both":
        tune_for_cpu_backend()
        out = side_by_side(cfg, train_tokens, max(1, args.steps // cfg.train.steps_per_call))
        print(json.dumps(out))
        return 0
    steps = cfg.train.steps if args.full else args.warmup + args.steps
    model, out = train(cfg, train_tokens, steps, args.warmup, args.compile)
    if args.full:
        out["val_loss"] = val_loss(model, data_dir, cfg.data.batch_size, cfg.model.context_length, cfg.data.eval_tokens)
    print(json.dumps(out))
    return 0
