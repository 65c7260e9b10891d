"""`python -m jaxlm.bench nanogpt` (a command of parity's plugin): nanoGPT's CPU recipe as a plain torchref loop.

The baseline `python -m jaxlm.train --config experiments/configs/shakespeare_char.toml`
is compared with: the same model, batch, learning-rate schedule, AdamW and clipping
(from the same config flags; default that config), a plain torch loop on the same
token files. Times --steps steps after --warmup untimed ones and extrapolates to the
config's train.steps; --full trains the whole run and reports the final validation
loss too. Prints a table; --json writes the figures. Needs the 'torch' extra.

`--framework both` times jaxlm's train step beside the loop, as the trainer compiles it
(`jaxlm.training.loop.build`: train.steps_per_call steps per jitted call) on batches drawn
the same way: the two alternate in blocks of steps_per_call steps, each block settled
first (jaxlm's timing loop), and the speedup is the median over the blocks of the loop's
time per step / jaxlm's in the same block; the table shows the ratio of the two medians
beside it, and withholds both when other processes kept the machine busy.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np

from jaxlm import cli
from jaxlm.bench.timing import Load, time_calls, timed, withheld
from jaxlm.core.extras import require
from jaxlm.core.files import write_json

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
    p.add_argument("--threads", metavar="N", type=int,
                   help="run on N CPUs (Linux; default: every CPU the process may use)")
    p.add_argument("--framework", default="torch", choices=["torch", "both"],
                   help="both: jaxlm's train step timed beside the loop, block by block")
    p.add_argument("--json", metavar="PATH", help="also write the figures here")


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
        torch.set_num_threads(limit_cpu_threads(args.threads))  # torch is loaded already: tell it too
    data_dir = ensure_prepared(cfg.data)
    meta = read_meta(data_dir)
    train_tokens = np.memmap(data_dir / "train.bin", dtype=meta["dtype"], mode="r")
    if args.framework == "both":
        tune_for_cpu_backend()
        out = side_by_side(cfg, train_tokens, max(1, args.steps // cfg.train.steps_per_call))
        print(side_by_side_table(out))
    else:
        steps = cfg.train.steps if args.full else args.warmup + args.steps
        model, out = train(cfg, train_tokens, steps, args.warmup, args.compile)
        if args.full:
            out["val_loss"] = val_loss(model, data_dir, cfg.data.batch_size, cfg.model.context_length,
                                       cfg.data.eval_tokens)
        print(loop_table(out, cfg.train.steps))
    if args.json:
        print(f"wrote {write_json(args.json, out)}")
    return 0


def loop_table(out: dict, total_steps: int) -> str:
    lines = [f"nanoGPT's recipe as a plain torchref loop ({'torch.compile' if out['compile'] else 'eager'}, "
             f"{out['threads']} threads), {out['timed_steps']} timed steps:",
             f"  {1e3 * out['step_time_s']:10.1f} ms per step",
             f"  {out['tokens_per_s']:10,.0f} tokens/s",
             f"  {out['extrapolated_total_s']:10.1f} s for train.steps = {total_steps} (extrapolated)",
             f"  {out['train_loss']:10.3f} training loss at the last step"]
    if "val_loss" in out:
        lines.append(f"  {out['val_loss']:10.3f} validation loss after the whole run")
    return "\n".join(lines)


def side_by_side_table(out: dict) -> str:
    """Each side's median time per step, and which ratio the speedup is (withheld on a busy machine)."""
    lines = [f"{out['blocks']} blocks of {out['steps_per_block']} steps each side, alternating, each block "
             "settled first:",
             f"  {'':26} {'ms per step (median)':>20} {'last training loss':>18}",
             f"  {'jaxlm train step':26} {1e3 * out['jax_step_time_s']:20.2f} {out['jax_train_loss']:18.3f}",
             f"  {'torchref loop (nanoGPT)':26} {1e3 * out['torch_step_time_s']:20.2f} {out['torch_train_loss']:18.3f}"]
    note = withheld("speedup of jaxlm over the loop", [out])
    if note:
        return "\n".join([*lines, note])
    low, high = out["speedup_iqr"]
    return "\n".join([*lines, f"speedup of jaxlm over the loop: {out['speedup']:.2f}x, the median over the blocks of "
                      f"(the loop's time / jaxlm's in the same block), interquartile range {low:.2f}-{high:.2f}; the "
                      f"ratio of the two medians above is {out['speedup_of_medians']:.2f}x"])
