"""The PyTorch side of the shakespeare_char benchmark: nanoGPT's CPU recipe with torchref.

Same model sizes, batch, learning-rate schedule, AdamW and clipping as the jaxlm
config (default experiments/configs/shakespeare_char.toml), a plain torch loop on
the same token files. Times `--steps` steps after `--warmup` untimed ones and
extrapolates to the config's train.steps; `--steps 0` trains the full run and
reports the final validation loss too.

    python -m experiments.nanogpt_cpu_baseline [--config CONFIG] [--steps 200] [--compile] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from jaxlm.extras import exit_unless_installed

exit_unless_installed("torch")
import torch  # noqa: E402

from jaxlm import cli
from jaxlm.data.prepare import ensure_prepared, read_meta
from torchref.data import get_batch
from torchref.model import TransformerLM
from torchref.optim import AdamW, clip_grad_norm, cross_entropy, lr_cosine_schedule

DEFAULT_CONFIG = "experiments/configs/shakespeare_char.toml"


@torch.no_grad()
def val_loss(model, val, B, T, max_batches):
    model.eval()
    losses = []
    n = (len(val) - 1) // T
    for b in range(0, min(n - B + 1, max_batches * B), B):
        idx = (np.arange(b, b + B)[:, None] * T) + np.arange(T + 1)[None, :]
        w = torch.from_numpy(np.asarray(val[idx], np.int64))
        losses.append(float(cross_entropy(model(w[:, :-1]).reshape(-1, model.cfg.vocab_size), w[:, 1:].reshape(-1))))
    model.train()
    return float(np.mean(losses))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.nanogpt_cpu_baseline", description=__doc__.split("\n\n")[0],
                                 formatter_class=cli.HelpFormatter, epilog=f"--config defaults to {DEFAULT_CONFIG}")
    cli.add_config_args(ap)
    ap.add_argument("--steps", type=int, default=200, help="timed steps (0: the full run with final val loss)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = cli.load_config_from_args(args, path=DEFAULT_CONFIG)
    data_dir = ensure_prepared(cfg.data)
    meta = read_meta(data_dir)
    train = np.memmap(data_dir / "train.bin", dtype=meta["dtype"], mode="r")
    val = np.memmap(data_dir / "val.bin", dtype=meta["dtype"], mode="r")
    torch.manual_seed(cfg.train.seed)
    model = TransformerLM(cfg.model)
    o = cfg.optim
    opt = AdamW(model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
    fwd = torch.compile(model) if args.compile else model
    B, T, total = cfg.data.batch_size, cfg.model.context_length, cfg.train.steps
    rng = np.random.default_rng(cfg.train.seed)
    n_steps = total if args.steps == 0 else args.warmup + args.steps
    t0 = t_timed = time.perf_counter()
    loss = None
    for t in range(n_steps):
        if t == args.warmup:
            t_timed = time.perf_counter()
        lr = lr_cosine_schedule(t, o.lr, o.min_lr, o.warmup_steps, o.cosine_steps or total)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = get_batch(train, B, T, "cpu", rng)
        loss = cross_entropy(fwd(x).reshape(-1, cfg.model.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if o.grad_clip > 0:
            clip_grad_norm(model.parameters(), o.grad_clip)
        opt.step()
    timed = time.perf_counter() - t_timed
    steps_timed = n_steps - args.warmup
    out = {
        "threads": torch.get_num_threads(), "compile": args.compile, "timed_steps": steps_timed,
        "step_time_s": timed / steps_timed, "tokens_per_s": steps_timed * B * T / timed,
        "extrapolated_total_s": timed / steps_timed * total, "train_loss": loss.item(),
        "wall_s": time.perf_counter() - t0,
    }
    if args.steps == 0:
        out["val_loss"] = val_loss(model, val, B, T, cfg.train.eval_batches)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
