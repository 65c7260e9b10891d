"""`python -m parity.check`: same weights, same tokens -> same logits, loss, gradients and loss curve.

torchref (float32) is the reference. jaxlm runs the same config at its compute
dtype, so at bfloat16 the figures measure bfloat16's error against float32.

Error measures (all "max over ..." so one bad element shows):
- logits_max_rel_err: max |jax - torch| / max |torch| over the whole logits tensor
  (normwise; elementwise relative error is meaningless for logits near zero);
- loss_abs_err: |loss_jax - loss_torch|, jaxlm's loss being its training loss (in blocks with compute.loss_chunk);
- grad_max_rel_err: max over parameters of max |g_jax - g_torch| / max |g_torch|;
- train_loss_max_abs_diff: max over steps of |loss_jax(t) - loss_torch(t)| when both
  train with AdamW + warmup-cosine + clipping on identical batches (jaxlm through
  `jaxlm.training.optim.make_optimizer` and `jaxlm.training.step.make_train_step`, the training code itself).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch may share the GPU

from jaxlm import cli  # noqa: E402
from jaxlm.core.errors import UsageError  # noqa: E402
from jaxlm.core.extras import require  # noqa: E402
from jaxlm.core.files import writable_dir_problem, write_json  # noqa: E402

if TYPE_CHECKING:
    from parity.compare import Setup

# Thresholds by compute dtype. float32 ones come from the issue; bfloat16 ones are
# set a few times above what bfloat16's 8-bit mantissa gives on the default config.
THRESHOLDS = {
    "float32": dict(logits_max_rel_err=1e-5, loss_abs_err=1e-5, grad_max_rel_err=1e-4, train_loss_max_abs_diff=1e-3),
    "bfloat16": dict(logits_max_rel_err=5e-2, loss_abs_err=2e-2, grad_max_rel_err=2e-1, train_loss_max_abs_diff=1e-1),
}

DEFAULT_CONFIG = Path(__file__).with_name("default.toml")  # used when no --config is given


def parse_args(argv=None) -> tuple[Setup, argparse.Namespace]:
    """The flags (--help works without torch), then torch and the comparisons' module, then the checks."""
    p = cli.ArgumentParser(command="parity.check", description=__doc__.splitlines()[0])
    cli.add_config_args(p)  # [model], [compute] and [optim] are used; default: parity/default.toml
    p.add_argument("--steps", type=cli.bounded(int, 0), default=0,
                   help="also train N steps in both frameworks and compare the losses (default: 0)")
    p.add_argument("--batch", type=cli.bounded(int, 1), default=4, help="sequences per batch (default: 4)")
    p.add_argument("--seq", type=cli.bounded(int, 1), default=None,
                   help="sequence length (default: min(context_length, 64))")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and batches (default: 0)")
    p.add_argument("--device", default="cpu", help="torch device for the reference: cpu, cuda (default: cpu)")
    p.add_argument("--json", help="write the figures to this JSON file")
    args = p.parse_args(argv)
    torch = require("torch")
    from jaxlm.training.preflight import check_attention
    from parity.compare import Setup

    cfg = cli.load_config_from_args(args, path=DEFAULT_CONFIG)
    seq = args.seq or min(cfg.model.context_length, 64)
    if seq > cfg.model.context_length:
        raise UsageError(f"--seq {seq}: longer than model.context_length = {cfg.model.context_length}")
    check_attention(cfg.model, cfg.compute)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(f"--device {args.device!r}: not a torch device (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {args.device}: torch sees no CUDA GPU here; use --device cpu")
    problem = writable_dir_problem(Path(args.json).absolute().parent) if args.json else None
    if problem:
        raise UsageError(f"--json {args.json}: cannot be written: {problem}")
    return Setup(cfg.model, cfg.compute, cfg.optim, args.batch, seq, args.seed, args.device, cfg.lora), args


def main(argv=None) -> int:
    setup, args = parse_args(argv)
    import jax

    from jaxlm.core.host import tune_for_cpu_backend
    from jaxlm.nn.loss import block_positions
    from parity.compare import compare_forward, compare_training

    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 on GPUs: compare true float32
    tune_for_cpu_backend()
    m, c = setup.model, setup.compute
    print(
        f"parity.check: d_model={m.d_model} layers={m.num_layers} heads={m.num_heads} vocab={m.vocab_size} "
        f"norm={m.norm} rope={m.rope} ffn={m.ffn} tied={m.tie_embeddings} window={m.window} "
        f"dtype={c.dtype} attention={c.attention} loss blocks of "
        f"{setup.batch} x {block_positions(c, m.vocab_size, setup.batch, setup.seq)} tokens"
        + (f" lora rank={setup.lora.rank} alpha={setup.lora.alpha} targets={','.join(setup.lora.targets)}"
           if setup.lora.rank else "")
        + f"; batch={setup.batch} seq={setup.seq}; "
        f"jax on {jax.devices()[0].device_kind}, torch on {setup.device}"
    )
    results = compare_forward(setup)
    if args.steps:
        results.update(compare_training(setup, args.steps))
    limits = THRESHOLDS[c.dtype]
    failed = [k for k, lim in limits.items() if k in results and not results[k] <= lim]
    if not results["round_trip_exact"]:
        failed.append("round_trip_exact")

    print(f"\n{'figure':<28}{'value':>14}{'threshold':>12}  ok")
    for key, value in results.items():
        lim = limits.get(key)
        ok = "" if lim is None and key != "round_trip_exact" else ("FAIL" if key in failed else "yes")
        shown = f"{value:.3e}" if isinstance(value, float) else str(value)
        print(f"{key:<28}{shown:>14}{(f'{lim:.0e}' if lim else ''):>12}  {ok}")
    if args.json:
        payload = dict(results, thresholds=limits, passed=not failed, model=asdict(m), compute=asdict(c),
                       steps=args.steps, batch=setup.batch, seq=setup.seq)
        Path(args.json).absolute().parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, payload)
    print("\nparity: " + ("PASS" if not failed else f"FAIL ({', '.join(failed)})"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
