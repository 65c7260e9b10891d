"""Fold a LoRA (or QLoRA) run's adapters into its weights: a plain run that loads everywhere.

    python -m jaxlm.lora merge RUN_DIR --out DIR

DIR gets the run's config with LoRA off, its tokenizer, and one checkpoint (at the same step)
of the merged float32 weights W + (alpha / r) B A with a fresh optimizer state: `jaxlm.generate`,
`jaxlm.bench`, `parity.check` and `train.init_from` read it like any run. The merged model's
logits are compared with the adapted model's on a random batch and the difference printed.
The merge reads the run under a shared lock and writes DIR under its own (jaxlm.core.lock): no trainer writes
either meanwhile; a read-only run needs no lock.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxlm import cli
from jaxlm.core.errors import UsageError
from jaxlm.core.files import path_problem
from jaxlm.core.lock import DirLock, new_directory


def merge_run(src: str | Path, out: str | Path) -> float:
    """Write the merged run to `out`; returns max |logits(merged) - logits(adapted)| on a random batch."""
    from jaxlm.training.checkpoint import find_run_dir

    out, run_dir = Path(out), find_run_dir(src)[0]
    if problem := path_problem(out):
        raise UsageError(f"--out {out}: {problem}; choose a new directory")
    if out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents:
        raise UsageError(f"--out {out}: inside the run being merged ({run_dir}); write the merged run to a new "
                         "directory beside it")
    with DirLock(run_dir, str(src), shared=True), new_directory(out, f"--out {out}"):
        return _merge(src, out)


def _merge(src: str | Path, out: Path) -> float:
    """`merge_run` under the two locks."""
    import jax
    import numpy as np

    from jaxlm.core.config import CheckpointConfig, LoraConfig
    from jaxlm.nn import lora
    from jaxlm.training.checkpoint import (
        Checkpointer,
        find_run_dir,
        restore_for_inference,
        saved_steps,
        write_run_files,
    )
    from jaxlm.training.optim import make_optimizer
    from jaxlm.training.step import TrainState

    run_dir, step = find_run_dir(src)
    model, cfg, _ = restore_for_inference(src)
    if not lora.has_adapters(model):
        raise UsageError(f"{src}: not a LoRA run (lora.rank = 0), nothing to merge")
    step = step if step is not None else saved_steps(run_dir)[-1]
    tokens = jax.random.randint(jax.random.key(0), (2, cfg.model.context_length), 0, cfg.model.vocab_size)
    adapted = np.asarray(model(tokens), np.float32)  # (2, T, V)
    lora.merge(model)
    diff = float(np.max(np.abs(np.asarray(model(tokens), np.float32) - adapted)))
    cfg = dataclasses.replace(cfg, lora=LoraConfig(),
                              train=dataclasses.replace(cfg.train, out_dir=str(out), init_from=None))
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    state = TrainState.create(model, tx)
    write_run_files(out, cfg, run_dir / "tokenizer")
    ckpt = Checkpointer(out, CheckpointConfig())
    try:
        ckpt.save(state, {"step": step, "data_step": step, "seed": cfg.train.seed})
    finally:
        ckpt.close()
    return diff


def main(argv=None) -> int:
    ap = cli.ArgumentParser(command="jaxlm.lora", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    m = sub.add_parser("merge", needs="the core install",
                       help="fold the adapters into the base weights: a plain run in --out")
    m.add_argument("run", metavar="RUN_DIR", help="a LoRA run directory (or one of its checkpoints)")
    m.add_argument("--out", required=True, metavar="DIR", help="the merged run's directory (new or empty)")
    args = ap.parse_args(argv)
    diff = merge_run(args.run, args.out)
    print(f"merged {args.run} into {args.out}; max |logit difference| merged vs adapted: {diff:.2e}")
    return 0
