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
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch may share the GPU

from jaxlm.core.extras import exit_unless_installed  # noqa: E402

exit_unless_installed("torch")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

import torchref  # noqa: E402
from jaxlm import cli  # noqa: E402
from jaxlm.core.config import ComputeConfig, Config, LoraConfig, ModelConfig, OptimConfig, TrainConfig  # noqa: E402
from jaxlm.core.errors import UsageError  # noqa: E402
from jaxlm.core.files import writable_dir_problem, write_json  # noqa: E402
from jaxlm.core.host import tune_for_cpu_backend  # noqa: E402
from jaxlm.nn.loss import block_positions, lm_loss  # noqa: E402
from jaxlm.nn.model import TransformerLM  # noqa: E402
from jaxlm.training.optim import make_optimizer  # noqa: E402
from jaxlm.training.preflight import check_attention  # noqa: E402
from jaxlm.training.step import TrainState, build_model, make_train_step, split_model  # noqa: E402
from parity.convert import jax_to_torch, torch_config, torch_named, torch_to_jax  # noqa: E402

# Thresholds by compute dtype. float32 ones come from the issue; bfloat16 ones are
# set a few times above what bfloat16's 8-bit mantissa gives on the default config.
THRESHOLDS = {
    "float32": dict(logits_max_rel_err=1e-5, loss_abs_err=1e-5, grad_max_rel_err=1e-4, train_loss_max_abs_diff=1e-3),
    "bfloat16": dict(logits_max_rel_err=5e-2, loss_abs_err=2e-2, grad_max_rel_err=2e-1, train_loss_max_abs_diff=1e-1),
}

DEFAULT_CONFIG = Path(__file__).with_name("default.toml")  # used when no --config is given


@dataclass
class Setup:
    model: ModelConfig
    compute: ComputeConfig
    optim: OptimConfig
    batch: int
    seq: int
    seed: int
    device: str
    lora: LoraConfig = LoraConfig()  # rank > 0: both models get adapters (B drawn nonzero), only they train


def corpus_tokens(vocab_size: int) -> np.ndarray:
    """Bytes of Python's bundled docs (present in every install), folded into the vocabulary."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    return np.frombuffer(text, dtype=np.uint8).astype(np.int64) % vocab_size


def batches(setup: Setup, n: int) -> np.ndarray:
    """n batches of (batch, seq + 1) windows at seeded offsets: inputs [:, :-1], targets [:, 1:]."""
    data = corpus_tokens(setup.model.vocab_size)
    rng = np.random.default_rng(setup.seed)
    starts = rng.integers(0, len(data) - setup.seq - 1, size=(n, setup.batch))
    return data[starts[..., None] + np.arange(setup.seq + 1)]  # (n, B, T+1)


def lr_at(step: int, optim: OptimConfig, total: int) -> float:
    return torchref.lr_cosine_schedule(step, optim.lr, optim.min_lr, optim.warmup_steps, optim.cosine_steps or total)


def build_pair(setup: Setup) -> tuple[torch.nn.Module, TransformerLM]:
    torch.manual_seed(setup.seed)
    ref = torchref.TransformerLM(torch_config(setup.model)).to(setup.device)
    lo = setup.lora
    if lo.rank:
        torchref.apply_lora(ref, lo.rank, lo.alpha, lo.targets, lo.dropout)
        for name, p in ref.named_parameters():
            if name.endswith("lora_b"):  # zero B would hide the adapters from the comparison
                torch.nn.init.normal_(p, std=0.02)
    run = Config(model=setup.model, compute=setup.compute, train=TrainConfig(seed=setup.seed), lora=lo)
    model = (build_model(run) if lo.rank
             else TransformerLM(setup.model, setup.compute, rngs=nnx.Rngs(setup.seed)))
    torch_to_jax({k: v.cpu() for k, v in ref.state_dict().items()}, model)
    return ref, model


def compare_forward(setup: Setup) -> dict[str, float | bool]:
    ref, model = build_pair(setup)
    window = batches(setup, 1)[0]
    x_np, y_np = window[:, :-1], window[:, 1:]
    x_t, y_t = torch.from_numpy(x_np).to(setup.device), torch.from_numpy(y_np).to(setup.device)

    logits_t = ref(x_t)
    loss_t = torchref.cross_entropy(logits_t, y_t)
    loss_t.backward()

    x_j, y_j = jnp.asarray(x_np, jnp.int32), jnp.asarray(y_np, jnp.int32)
    loss_j, grads, logits_j = _loss_grads_logits(model, x_j, y_j)
    lt = logits_t.detach().cpu().double().numpy()
    lj = np.asarray(logits_j, dtype=np.float64)
    grad_j = _flat_grads(grads)
    grad_rel = 0.0
    for name, p in ref.named_parameters():
        if not p.requires_grad:  # a LoRA run's frozen base
            continue
        gt = p.grad.detach().cpu().double().numpy()
        gj = grad_j[name]
        grad_rel = max(grad_rel, float(np.abs(gj - gt).max() / max(np.abs(gt).max(), 1e-30)))
    return dict(
        logits_max_abs_err=float(np.abs(lj - lt).max()),
        logits_max_rel_err=float(np.abs(lj - lt).max() / np.abs(lt).max()),
        loss_abs_err=abs(float(loss_j) - loss_t.item()),
        grad_max_rel_err=grad_rel,
        loss=loss_t.item(),
        round_trip_exact=round_trip_exact(ref, model),
    )


@nnx.jit  # one compiled program: op-by-op dispatch of the same graph compiles each op alone (3x slower on a CPU)
def _loss_grads_logits(model: TransformerLM, x: jax.Array, y: jax.Array):
    loss, grads = nnx.value_and_grad(lambda m: lm_loss(m, x, y))(model)  # in blocks with compute.loss_chunk
    return loss, grads, model(x)  # (), grads like model's params, (B, T, V)


def _flat_grads(grads) -> dict[str, np.ndarray]:
    return {name: np.asarray(v, dtype=np.float64) for name, v in torch_named(grads).items()}


def compare_training(setup: Setup, steps: int) -> dict[str, float]:
    """Both frameworks train `steps` steps on identical batches; jaxlm uses its real optimizer and train step."""
    ref, model = build_pair(setup)
    o = setup.optim
    data = batches(setup, steps)

    trainable = [p for p in ref.parameters() if p.requires_grad]
    opt_t = torchref.AdamW(trainable, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
    tx, schedule = make_optimizer(o, steps)
    graphdef, _, _ = split_model(model)
    state = TrainState.create(model, tx)
    step_j = jax.jit(make_train_step(graphdef, tx, schedule), donate_argnums=0)

    losses_t, losses_j = [], []
    for t in range(steps):
        x_np, y_np = data[t][:, :-1], data[t][:, 1:]
        for g in opt_t.param_groups:
            g["lr"] = lr_at(t, o, steps)
        x_t, y_t = (torch.from_numpy(a).to(setup.device) for a in (x_np, y_np))
        loss_t = torchref.cross_entropy(ref(x_t), y_t)
        opt_t.zero_grad()
        loss_t.backward()
        if o.grad_clip > 0:
            torchref.clip_grad_norm(trainable, o.grad_clip)
        opt_t.step()
        losses_t.append(loss_t.item())
        state, metrics = step_j(state, jnp.asarray(x_np, jnp.int32), jnp.asarray(y_np, jnp.int32))
        losses_j.append(float(metrics["loss"]))
    diffs = np.abs(np.array(losses_j) - np.array(losses_t))
    return dict(
        train_loss_max_abs_diff=float(diffs.max()),
        train_loss_first=losses_t[0],
        train_loss_last_torch=losses_t[-1],
        train_loss_last_jax=losses_j[-1],
    )


def round_trip_exact(ref: torch.nn.Module, model: TransformerLM) -> bool:
    """jax -> torch gives back exactly the torch weights the JAX model was loaded from."""
    back = jax_to_torch(model)
    return all(torch.equal(back[k], v.cpu()) for k, v in ref.state_dict().items())


def parse_args(argv=None) -> tuple[Setup, argparse.Namespace]:
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
    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 on GPUs: compare true float32
    tune_for_cpu_backend()
    setup, args = parse_args(argv)
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
