"""The PyTorch reference's side of `python -m jaxlm.bench` (found through parity/bench_plugin.py):
torchref with the same architecture, batch and mode as jaxlm's rows.

- torch.compile on the model-plus-loss function unless `--no-compile`;
  the first call (which compiles) is reported as `compile_s`.
- bfloat16 rows run under `torch.autocast(dtype=torch.bfloat16)` with float32
  parameters, the same policy as jaxlm's `compute.dtype`.
- Fused attention: any attention but "xla" (cudnn, auto) means torchref's
  `F.scaled_dot_product_attention`, the counterpart of cuDNN; "xla" rows run torchref's
  explicit softmax(QK^T)V (`reference_compute`).
- Train step: the AdamW of docs/spec.md (betas 0.9/0.95, wd 0.1, eps 1e-8) after
  global-norm clipping at 1.0. By default `torch.optim.AdamW` (foreach, fused on
  CUDA) with `clip_grad_norm_`, PyTorch's fastest equivalent of torchref.AdamW /
  torchref.clip_grad_norm (same update, same ordering); `--torch-optimizer
  torchref` uses torchref's own (a Python loop per parameter, and a host
  sync in the clipping).
- Timing: jaxlm's loop (`jaxlm.bench.timing`), each step followed by a device
  synchronize (on CPU torch is synchronous). Memory: `torch.cuda.max_memory_allocated`
  after `reset_peak_memory_stats`; on CPU there is no allocator peak, so the
  column is None with memory_source "n/a (cpu)".
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import torch

import torchref
from jaxlm.analysis import memory
from jaxlm.bench.timing import time_calls, timed
from jaxlm.core.config import ComputeConfig, ModelConfig
from parity.convert import jax_to_torch, torch_config
from torchref.generate import generate


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_kind() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def synchronize(_out=None) -> None:
    """Wait for the device's queued work (the `wait` of jaxlm's timing loop)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def release_memory() -> None:
    """After an out-of-memory row: hand the cached blocks back so that the next row starts clean."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def reference_compute(compute: ComputeConfig) -> ComputeConfig:
    """What torchref reads of a row's compute config: the dtype, and whether the attention is fused."""
    return ComputeConfig(dtype=compute.dtype, attention="xla" if compute.attention == "xla" else "auto")


def autocast(dtype: str):
    if dtype == "bfloat16":
        return torch.autocast(device_type=device().type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_step(mode: str, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, *, compile: bool = True,
               seed: int = 0, optimizer: str = "torch"):
    """A zero-argument callable running one step of `mode` (returns a tensor to keep alive)."""
    dev = device()
    torch.manual_seed(seed)
    model = torchref.TransformerLM(torch_config(cfg), device=dev, fused_attention=compute.attention != "xla")
    tokens = torch.randint(0, cfg.vocab_size, (batch, context + 1), device=dev)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()  # (B, T), (B, T)

    def loss_fn(x, y):
        return torchref.cross_entropy(model(x), y)

    fwd = torch.compile(model) if compile else model
    loss = torch.compile(loss_fn) if compile else loss_fn

    if mode == "forward":
        model.eval()

        def step():
            with torch.no_grad(), autocast(compute.dtype):
                return fwd(x)

        return step
    if mode == "forward_backward":

        def step():
            model.zero_grad(set_to_none=True)
            with autocast(compute.dtype):
                out = loss(x, y)
            out.backward()
            return out

        return step
    if mode == "train_step":
        if optimizer == "torchref":
            opt = torchref.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
            clip = lambda: torchref.clip_grad_norm(model.parameters(), 1.0)
        else:
            fused = dev.type == "cuda"
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                    fused=fused or None, foreach=None if fused else True)
            clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast(compute.dtype):
                out = loss(x, y)
            out.backward()
            clip()
            opt.step()
            return out

        return step
    raise ValueError(f"unknown mode {mode!r}")


def prepare(setting, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, opts, row: dict):
    """Build, compile (the first call, reported as compile_s) one torch setting; returns its (call, wait, finish)
    for `jaxlm.bench.measure.run_group`, or None when the row is OOM by the analytic estimate."""
    compute = reference_compute(compute)
    estimate = memory.estimate(cfg, batch, context, compute, setting.mode, fused=compute.attention != "xla").total
    row["estimate_gb"] = estimate / 1e9
    if opts.memory_limit_gb is not None and estimate > opts.memory_limit_gb * 1e9:
        row["status"], row["memory_source"] = "OOM", "analytic estimate"
        row["error"] = f"estimated {estimate / 1e9:.3f} GB > --memory-limit-gb {opts.memory_limit_gb}"
        return None
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    row["compiled"] = not opts.side_args.get("no_compile", False)
    step = build_step(setting.mode, cfg, compute, batch, context, compile=row["compiled"], seed=opts.seed,
                      optimizer=opts.side_args.get("torch_optimizer", "torch"))
    _, row["compile_s"] = timed(lambda: synchronize(step()))  # first call: tracing + compilation (+ one step)

    def finish() -> None:
        if cuda:
            row["memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
            row["memory_source"] = "torch.cuda.max_memory_allocated"
            torch.cuda.empty_cache()
        else:
            row["memory_gb"], row["memory_source"] = None, "n/a (cpu)"

    return step, synchronize, finish


def memory_snapshot(cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, out: Path) -> Path:
    """A CUDA allocation history over two train steps (pytorch.org/memory_viz); a note on CPU."""
    if not torch.cuda.is_available():
        note = out / "torch_memory_snapshot_skipped.txt"
        note.write_text("torch memory snapshots (torch.cuda.memory._record_memory_history) need CUDA; "
                        "this run had none, so none was written.\n")
        return note
    step = build_step("train_step", cfg, reference_compute(compute), batch, context, compile=False)
    step()  # first step allocates the optimizer state; the recorded steps show the steady state
    torch.cuda.synchronize()
    path = out / "torch_train_step_snapshot.pickle"
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return path


def matmul_call(product, a, b):
    """`product(a, b)` (a `jaxlm.bench.matmul.FORMS` form) on numpy operands as torch tensors, as
    `jaxlm.bench.steps.matmul_call`: a call that returns the product once it is computed."""
    a, b = torch.from_numpy(a).to(device()), torch.from_numpy(b).to(device())

    def call():
        out = product(a, b)
        synchronize()
        return out

    return call


def decode_runner(model, compute: ComputeConfig, prompts: list[list[int]], new_tokens: int, use_cache: bool):
    """(run, compiled): run() is torchref's greedy generation (`torchref.generate`: one prompt at a time,
    eager) of the JAX `model`'s weights, returning each row's new tokens; compiled() is empty (nothing compiles)."""
    reference = torchref.TransformerLM(torch_config(model.cfg), device=device(),
                                       fused_attention=compute.attention != "xla")
    reference.load_state_dict(jax_to_torch(model))

    def run():
        with autocast(compute.dtype):
            return [generate(reference, p, new_tokens, temperature=0.0, use_cache=use_cache) for p in prompts]

    return run, dict


_WRAPPERS = ("CompiledFunction", "CompiledFunctionBackward", "Optimizer.step#", "## Call CompiledFxGraph",
             "Torch-Compiled Region", "ProfilerStep", "autograd::engine")
_LAYOUT_ONLY = {"clone", "transpose", "view", "unsafe", "permute", "expand", "select", "slice", "unsqueeze", "squeeze"}


def op_category(name: str, phase: str) -> str:
    """The `jaxlm.bench.op_profile.CATEGORIES` entry of one profiled torch op, given its phase
    ("forward", "backward" or "optimizer": inside neither pass)."""
    if name.startswith(_WRAPPERS):
        return "dispatch and bookkeeping"
    if phase == "optimizer":
        return "optimizer, clipping, metrics"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
        return f"{'attention' if 'bmm' in name else 'projection'} matmuls, {phase}"
    if re.search(r"gather|scatter|_log_|log_softmax|nll", name):
        return "loss (logits to cross-entropy)"
    fused = re.sub(r"^graph_\d+_cpp_fused_", "", name)
    parts = {p for p in re.sub(r"_\d+$", "", fused).split("_") if p} if fused != name else set()
    copies = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy")
    if name in copies or (parts and parts <= _LAYOUT_ONLY):
        return "copies and transposes"
    return f"element-wise and reductions, {phase}"


def op_profile(mode: str, cfg: ModelConfig, compute: ComputeConfig, batch: int, context: int, *, steps: int,
               warmup: int, top: int, statistic: str) -> dict:
    """torch.profiler over `steps` calls of the torch.compile'd step (after `warmup` and the compiling call):
    each op's exclusive time, placed by its name and by the pass it ran in."""
    from torch._inductor import config as inductor_config
    from torch.profiler import ProfilerActivity, profile

    from jaxlm.bench.op_profile import summarize

    inductor_config.cpp.enable_kernel_profile = True  # inductor's C++ kernels appear by name
    step = build_step(mode, cfg, compute, batch, context)
    time_calls(step, 0, warmup=warmup + 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = sum(time_calls(step, steps).seconds)
    events = list(prof.events())
    passes = [(e.time_range.start, e.time_range.end, "backward" if e.name.endswith("Backward") else "forward")
              for e in events if e.name in ("CompiledFunction", "CompiledFunctionBackward")]
    times, places = {}, {}
    for e in sorted(events, key=lambda e: e.time_range.start):
        phase = next((p for lo, hi, p in passes if lo <= e.time_range.start < hi), "optimizer")
        label = f"{e.name} ({phase})"
        places[label] = op_category(e.name, phase)
        times.setdefault(label, []).append(e.self_cpu_time_total / 1e6)
    return summarize(times, places.get, lambda label: label, steps, wall, top, statistic)
