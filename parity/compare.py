"""The comparisons of `python -m parity.check` (parity/check.py): torchref and jaxlm on the same weights and tokens.

Needs torch; the command's front (its flags, --help) does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

import torchref
from jaxlm.core.config import ComputeConfig, Config, LoraConfig, ModelConfig, OptimConfig, TrainConfig
from jaxlm.nn.loss import lm_loss
from jaxlm.nn.model import TransformerLM
from jaxlm.training.optim import make_optimizer
from jaxlm.training.step import TrainState, build_model, make_train_step, split_model
from parity.convert import jax_to_torch, torch_config, torch_named, torch_to_jax


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
