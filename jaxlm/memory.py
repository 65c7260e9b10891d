"""Memory estimator: what one step holds per device, and the largest batch that fits a device.

    python -m jaxlm.memory --preset large --context 1024 --batch 4 --dtype bfloat16 --device h100-80gb
    python -m jaxlm.memory validate --out docs/memory.md   # estimate vs XLA's memory_analysis() on CPU

Peak bytes of a train step = parameters (float32) + gradients (float32) + AdamW
moments m and v (float32) + compute-dtype copies of the weights (bfloat16 only)
+ activations. Activations are, per layer, the tensors the backward pass needs
(counted below by component), the output head's logits, and under remat the
working set of the one block being rebuilt.

The per-component tensor counts are those of jaxlm's own forward (jaxlm.model,
jaxlm.attention "xla"): which tensors `jax.grad` saves, less what XLA fuses away,
calibrated against `compiled.memory_analysis()` of the real train step on CPU at
float32 without remat (the table in docs/memory.md gives the error of each row).
The CPU backend is faithful there, but not for remat (XLA:CPU's compiled memory
barely moves under it) nor for bfloat16 (it computes through float32): those settings
follow the policies' definitions and are estimates to check against a GPU's
measured peak. cudnn attention keeps no T x T tensor, only a log-sum-exp per row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from dataclasses import dataclass

from jaxlm import cli
from jaxlm.config import ComputeConfig, ModelConfig
from jaxlm.errors import UsageError
from jaxlm.flops import param_counts

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MODES = ("forward", "forward_backward", "train_step")

# Device memory as the driver reports it (nvidia-smi's total; bytes). Marketed sizes in the names.
GIB = 2**30
DEVICES: dict[str, float] = {
    "h100-80gb": 81559 * 2**20,
    "h100-94gb": 95830 * 2**20,
    "h200": 143771 * 2**20,
    "a100-40gb": 40960 * 2**20,
    "a100-80gb": 81920 * 2**20,
    "l4": 23034 * 2**20,
    "rtx4090": 24564 * 2**20,
    "v100-32gb": 32768 * 2**20,
}
DEFAULT_USABLE = 0.9  # share of device memory a step may plan for: CUDA context, library workspaces, fragmentation

# Tensors kept per token for the backward pass, in units of the tensor's width (D, F, or a head's T scores
# times the N heads), on the xla attention path without remat; "t" is the compute dtype, "f32" float32, "u8"
# one byte. jax.grad saves about 12 D-wide tensors per layer (residuals, norm outputs, q, k, v, RoPE halves,
# attention output); XLA fuses the cheap elementwise ones into the backward and keeps about 6, so the
# D-wide counts below are calibrated on memory_analysis() and attributed to the components they come from.
SAVED = {
    "norms": ("D", "t", 1.0),  # RMSNorm output feeding the next matmul
    "residuals": ("D", "t", 1.0),  # the residual stream at the block's input
    "qkv": ("D", "t", 3.0),  # q, k (after RoPE), v
    "attention scores/probs": ("HT", "f32", 4.0),  # masked logits, their float32 copy, exp, probabilities
    "attention mask": ("HT", "u8", 1.0),  # the causal mask, broadcast to (B, N, T, T) booleans
    "attention output": ("D", "t", 1.0),  # softmax(.) V before output_proj
    "ffn hidden": ("F", "t", 4.0),  # w1 x, w3 x, silu(w1 x), the gated product (SwiGLU)
}
WORKING: dict = {}  # beyond the saved tensors, the layer being differentiated needs no more at the peak (CPU)
HEAD = {"logits / loss": 2.0}  # per token, x V x 4 bytes: the float32 logits and their gradient


@dataclass(frozen=True)
class Mesh:
    """Devices the step runs on: the batch is split over `devices`; `fsdp` also shards the float32 state."""

    devices: int = 1
    fsdp: bool = False


@dataclass(frozen=True)
class Estimate:
    """Bytes per device: `state` (independent of the batch) and `activations` (linear in it), by component."""

    state: dict[str, float]
    activations: dict[str, float]
    batch_per_device: int

    @property
    def state_total(self) -> float:
        return sum(self.state.values())

    @property
    def activation_total(self) -> float:
        return sum(self.activations.values())

    @property
    def total(self) -> float:
        return self.state_total + self.activation_total


def _width(kind: str, cfg: ModelConfig, seq_len: int) -> int:
    return {"D": cfg.d_model, "F": cfg.d_ff, "HT": cfg.num_heads * seq_len}[kind]


def _bytes(dtype: str, compute_bytes: int) -> int:
    return {"t": compute_bytes, "f32": 4, "u8": 1}[dtype]


def _per_token(table: dict, cfg: ModelConfig, seq_len: int, a: int, fused: bool) -> dict[str, float]:
    """Bytes per token per layer of each component in `table` (the attention rows adjusted for the kernel)."""
    out = {}
    for name, (kind, dtype, count) in table.items():
        if kind == "HT" and fused:  # a fused kernel keeps one float32 log-sum-exp per head and row
            out[name] = 4.0 * cfg.num_heads if name == "attention scores/probs" else 0.0
            continue
        width = _width(kind, cfg, seq_len)
        if kind == "F" and cfg.ffn == "silu":
            count /= 2  # no w3 branch
        out[name] = count * width * _bytes(dtype, a)
    return out


def _remat_saved(per_layer: dict[str, float], cfg: ModelConfig, seq_len: int, a: int, fused: bool,
                 remat: str) -> dict[str, float]:
    """What each layer keeps under a remat policy (per token): the block input always; dots_saveable also
    the matmul outputs (q, k, v, attention scores unless fused, output_proj, w1, w3, w2); full nothing else."""
    if remat == "none":
        return per_layer
    kept = {name: 0.0 for name in per_layer}
    kept["residuals"] = a * cfg.d_model
    if remat == "dots_saveable":
        kept["qkv"] = 3.0 * a * cfg.d_model
        kept["attention output"] = a * cfg.d_model
        if not fused:
            kept["attention scores/probs"] = 4.0 * cfg.num_heads * seq_len
        gated = 2 if cfg.ffn == "swiglu" else 1
        kept["ffn hidden"] = a * (gated * cfg.d_ff + cfg.d_model)
    return kept


def activations(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig = ComputeConfig(),
                mode: str = "train_step", fused: bool | None = None) -> dict[str, float]:
    """Activation bytes at the step's peak, by component, all layers (see the module docstring).

    fused: attention is a fused kernel keeping no T x T tensor (default: compute.attention == "cudnn").
    forward keeps nothing for a backward pass: one layer's tensors and the logits.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    a = DTYPE_BYTES[compute.dtype]
    fused = compute.attention == "cudnn" if fused is None else fused
    tokens = batch * seq_len
    per_layer = _per_token(SAVED, cfg, seq_len, a, fused)
    if cfg.norm == "none":
        per_layer["norms"] = 0.0
    working = _per_token(WORKING, cfg, seq_len, a, fused)
    logits = tokens * cfg.vocab_size * (a if mode == "forward" else 4.0 * HEAD["logits / loss"])
    if mode == "forward":  # one layer live at a time, then the logits (the output)
        return {"one layer": tokens * sum(per_layer.values()), "logits / loss": logits}
    kept = _remat_saved(per_layer, cfg, seq_len, a, fused, compute.remat)
    if compute.remat == "offload":  # the saved matmul outputs live in host memory
        kept = {name: (a * cfg.d_model if name == "residuals" else 0.0) for name in kept}
    out = {"embedding": tokens * a * cfg.d_model}
    out.update({name: tokens * cfg.num_layers * value for name, value in kept.items()})
    if compute.remat != "none":  # the backward rebuilds one block at a time
        working = {k: working.get(k, 0.0) + per_layer[k] for k in per_layer}
    out["backward working set (one layer)"] = tokens * sum(working.values())
    out["logits / loss"] = logits
    return out


def estimate(cfg: ModelConfig, batch: int, seq_len: int, compute: ComputeConfig = ComputeConfig(),
             mode: str = "train_step", mesh: Mesh = Mesh(), fused: bool | None = None) -> Estimate:
    """Predicted peak bytes per device of one step; `batch` is the global batch, split over mesh.devices."""
    p = param_counts(cfg)["total"]
    shard = mesh.devices if mesh.fsdp else 1
    state = {"parameters (float32)": 4.0 * p / shard}
    if compute.dtype != "float32":
        state[f"{compute.dtype} weight copies"] = DTYPE_BYTES[compute.dtype] * p / shard
    if mode != "forward":
        state["gradients (float32)"] = 4.0 * p / shard
    if mode == "train_step":
        state["AdamW moments m, v (float32)"] = 8.0 * p / shard
    if mesh.fsdp and mesh.devices > 1:  # one layer's parameters gathered at a time
        state["FSDP gathered layer"] = DTYPE_BYTES[compute.dtype] * (p - cfg.vocab_size * cfg.d_model) / cfg.num_layers
    per_device = math.ceil(batch / mesh.devices)
    return Estimate(state, activations(cfg, per_device, seq_len, compute, mode, fused), per_device)


def largest_batch(cfg: ModelConfig, seq_len: int, capacity: float, compute: ComputeConfig = ComputeConfig(),
                  mode: str = "train_step", mesh: Mesh = Mesh(), fused: bool | None = None) -> int:
    """The largest global batch whose estimate fits `capacity` bytes per device (0 if none does).

    The estimate is affine in the per-device batch, so this is a division, not a search.
    """
    one = estimate(cfg, mesh.devices, seq_len, compute, mode, mesh, fused)
    per_seq = one.activation_total
    room = capacity - one.state_total
    return max(int(room // per_seq), 0) * mesh.devices if per_seq > 0 else 0


# --------------------------------------------------------------------------- command line

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def parse_size(text: str) -> float:
    """'24GiB', '80GB', '512 MiB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 24GiB or 80GB, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def si(x: float) -> str:
    return f"{x / 1e9:.2f} GB" if x >= 1e8 else f"{x / 1e6:.1f} MB"


def add_args(parser: argparse.ArgumentParser) -> None:
    cli.add_config_args(parser)
    s = parser.add_argument_group("the step")
    s.add_argument("--context", type=cli.bounded(int, 1), help="sequence length (default: model.context_length)")
    s.add_argument("--batch", type=cli.bounded(int, 1), help="global batch in sequences (default: data.batch_size)")
    s.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype (default: compute.dtype)")
    s.add_argument("--remat", choices=("none", "full", "dots_saveable", "offload"), help="default: compute.remat")
    s.add_argument("--attention", choices=("xla", "cudnn"), help="default: compute.attention")
    s.add_argument("--mode", choices=MODES, default="train_step", help="which step")
    s.add_argument("--devices", type=cli.bounded(int, 1), default=1,
                   help="devices the batch is split over (parallel.fsdp other than 1 also shards the state)")
    d = parser.add_argument_group("the device (for the largest batch)")
    where = d.add_mutually_exclusive_group()
    where.add_argument("--device", choices=sorted(DEVICES), help="a known device's memory")
    where.add_argument("--memory", type=parse_size, metavar="SIZE", help="memory per device, e.g. 24GiB or 80GB")
    d.add_argument("--usable", type=cli.bounded(float, 0, 1, open_low=True), default=DEFAULT_USABLE,
                   help="share of the device's memory a step may plan for")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON instead of a table")


def _configs(args) -> tuple[ModelConfig, ComputeConfig, int, int, Mesh]:
    cfg = cli.load_config_from_args(args)
    context = args.context or cfg.model.context_length
    model = dataclasses.replace(cfg.model, context_length=max(context, cfg.model.context_length))
    chosen = {k: getattr(args, k) for k in ("dtype", "remat", "attention") if getattr(args, k)}
    try:
        compute = dataclasses.replace(cfg.compute, **chosen)
    except Exception as e:  # e.g. cudnn at float32: the config's one-line reason
        raise UsageError(str(e)) from None
    return model, compute, context, args.batch or cfg.data.batch_size, Mesh(args.devices, cfg.parallel.fsdp != 1)


def report(cfg: ModelConfig, compute: ComputeConfig, context: int, batch: int, mode: str, mesh: Mesh,
           capacity: float | None, usable: float, device: str | None) -> dict:
    est = estimate(cfg, batch, context, compute, mode, mesh)
    out = {"parameters": param_counts(cfg)["total"], "mode": mode, "context": context, "batch": batch,
           "batch_per_device": est.batch_per_device, "devices": mesh.devices, "fsdp": mesh.fsdp,
           "dtype": compute.dtype, "attention": compute.attention, "remat": compute.remat,
           "state_bytes": est.state, "activation_bytes": est.activations, "peak_bytes": est.total}
    if capacity is not None:
        out.update(device=device, capacity_bytes=capacity, usable=usable, fits=est.total <= capacity * usable,
                   largest_batch=largest_batch(cfg, context, capacity * usable, compute, mode, mesh))
    return out


def format_report(r: dict, cfg: ModelConfig) -> str:
    lines = [f"model: {cfg.num_layers} layers, d_model {cfg.d_model}, {cfg.num_heads} heads, d_ff {cfg.d_ff}, "
             f"vocab {cfg.vocab_size}: {r['parameters'] / 1e6:.1f}M parameters",
             f"step: {r['mode']}, batch {r['batch']} ({r['batch_per_device']} per device on {r['devices']} "
             f"device{'s' if r['devices'] > 1 else ''}{', FSDP' if r['fsdp'] else ''}), context {r['context']}, "
             f"{r['dtype']}, attention {r['attention']}, remat {r['remat']}", "",
             f"{'estimated bytes per device':40s} {'':>10s}"]
    lines += [f"  {k:38s} {si(v):>10s}" for k, v in r["state_bytes"].items()]
    acts = r["activation_bytes"]
    lines.append(f"  {'activations':38s} {si(sum(acts.values())):>10s}")
    lines += [f"    {k:36s} {si(v):>10s}" for k, v in acts.items() if v]
    lines += [f"  {'predicted peak':38s} {si(r['peak_bytes']):>10s}"]
    if "capacity_bytes" in r:
        name = r["device"] or "the given memory"
        lines += ["", f"{name}: {si(r['capacity_bytes'])}, of which {100 * r['usable']:.0f}% usable "
                      f"({si(r['capacity_bytes'] * r['usable'])}): batch {r['batch']} "
                      f"{'fits' if r['fits'] else 'does NOT fit'}",
                  f"largest batch that fits: {r['largest_batch']} (global, at context {r['context']})"]
    return "\n".join(lines)


DESCRIPTION = """Estimate the memory of one train step per device (parameters, gradients, AdamW moments,
activations by component) and the largest batch that fits a device (docs/memory.md).
`python -m jaxlm.memory validate` compares the estimate with XLA's compiled memory_analysis() on CPU."""


def main(argv: list[str]) -> int:
    if argv and argv[0] == "validate":
        from jaxlm.bench import memory as bench_memory

        return bench_memory.validate_main(argv[1:])
    parser = cli.ArgumentParser(prog="python -m jaxlm.memory", description=DESCRIPTION,
                                formatter_class=cli.HelpFormatter)
    add_args(parser)
    args = parser.parse_args(argv)
    cfg, compute, context, batch, mesh = _configs(args)
    capacity = DEVICES[args.device] if args.device else args.memory
    r = report(cfg, compute, context, batch, args.mode, mesh, capacity, args.usable, args.device)
    print(json.dumps(r, indent=1) if args.json else format_report(r, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
