"""`python -m jaxlm.train`: train a Transformer LM from a config (the loop is jaxlm.training.loop).

    python -m jaxlm.train --config experiments/configs/quickstart.toml [--preset NAME] [--set section.key=value ...]
"""

from __future__ import annotations

import argparse

from jaxlm import cli
from jaxlm.core.stop import StopFlag


def parse_args(argv=None) -> argparse.Namespace:
    ap = cli.ArgumentParser(command="jaxlm.train", description="Train a Transformer LM.")
    cli.add_config_args(ap)
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                    help="continue from the run directory's newest checkpoint (default: checkpoint.resume)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    extra = [] if args.resume is None else [f"checkpoint.resume={'true' if args.resume else 'false'}"]
    cfg = cli.load_config_from_args(args, extra)
    # From here a signal is a flag checked at safe points (jaxlm.core.stop), so JAX is imported under it.
    with StopFlag() as stop, cli.traceback_in(cfg.train.out_dir):
        from jaxlm.training.loop import train

        stop.check("the first step")
        summary = train(cfg, stop)
    if summary["stopped"]:
        print(f"stopped at step {summary['step']} ({summary['stopped']}); run the same command to resume")
        return 0
    val = "not evaluated in this invocation" if summary["val_loss"] is None else f"{summary['val_loss']:.4f}"
    print(f"done: step {summary['step']}, val loss {val}, {summary['wall_s']:.1f} s, run dir {summary['run_dir']}")
    return 0
