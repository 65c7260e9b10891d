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
from pathlib import Path

import numpy as np

from jaxlm import cli
from jaxlm.bench.timing import withheld
from jaxlm.core.extras import require
from jaxlm.core.files import write_json

RECIPE = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "shakespeare_char.toml"


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
    torch = require("torch")
    from jaxlm.core.host import limit_cpu_threads, tune_for_cpu_backend
    from jaxlm.data.prepare import ensure_prepared, read_meta
    from parity import nanogpt_loop as loop

    if args.threads:
        torch.set_num_threads(limit_cpu_threads(args.threads))  # torch is loaded already: tell it too
    data_dir = ensure_prepared(cfg.data)
    meta = read_meta(data_dir)
    train_tokens = np.memmap(data_dir / "train.bin", dtype=meta["dtype"], mode="r")
    if args.framework == "both":
        tune_for_cpu_backend()
        out = loop.side_by_side(cfg, train_tokens, max(1, args.steps // cfg.train.steps_per_call))
        print(side_by_side_table(out))
    else:
        steps = cfg.train.steps if args.full else args.warmup + args.steps
        model, out = loop.train(cfg, train_tokens, steps, args.warmup, args.compile)
        if args.full:
            out["val_loss"] = loop.val_loss(model, data_dir, cfg.data.batch_size, cfg.model.context_length,
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
