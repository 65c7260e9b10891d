"""The training loop: build the run, train, evaluate, sample and checkpoint (the command is jaxlm/cli/train.py).

    python -m jaxlm.train --config experiments/configs/quickstart.toml [--preset NAME] [--set section.key=value ...]

Each call runs `steps_in_call` optimizer steps in one jitted, donated function
(the batch of global step s is a pure function of (seed, s)); the previous
call's metrics are then checked (a non-finite loss stops the run without
saving) and logged, and evaluation, sampling and checkpoints follow their
schedules. SIGTERM / SIGINT (a flag, `jaxlm.core.stop`) finish the current call,
save and exit; during start-up they stop before the first step, and a second
SIGINT stops at once. A run that is already complete writes nothing.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxlm.analysis import flops
from jaxlm.core import sharding
from jaxlm.core.config import Config
from jaxlm.core.errors import TrainingDiverged
from jaxlm.core.host import tune_for_cpu_backend
from jaxlm.core.stop import StopFlag
from jaxlm.data.loader import eval_batches, train_batches
from jaxlm.data.prepare import load_tokenizer_from_meta
from jaxlm.nn.decode import Generator, SamplingParams, encode_prompt
from jaxlm.nn.lora import memory_summary
from jaxlm.training.checkpoint import Checkpointer, load_base_weights, saved_steps, write_run_files
from jaxlm.training.optim import make_optimizer
from jaxlm.training.preflight import check_disk, check_memory, launch, resumed_changes, run_identity
from jaxlm.training.step import TrainState, init_state, make_eval_step, make_multi_step, make_train_step
from jaxlm.training.tracking import Profiler, Tracker, peak_memory_bytes


class JittedSteps(NamedTuple):
    """A run's train and eval steps jitted for one mesh, and the train state they take (graph, maker, layout)."""

    graphdef: Any
    make_state: Callable  # () -> a fresh TrainState (call under jit with out_shardings)
    shardings: TrainState  # a NamedSharding per state leaf
    abstract: TrainState  # ShapeDtypeStructs (with shardings): the restore target
    step_fn: Callable  # jitted, donated (state, x, y) -> (state, metrics)
    multi_fn: Callable  # jitted, donated (state, xs, ys) -> (state, metrics stacked): n steps in one call
    eval_fn: Callable  # jitted (state, x, y, mask) -> {"loss_sum", "correct", "tokens"}


def build(cfg: Config, mesh) -> JittedSteps:
    """Init, shardings, the train step (one and n per call) and the eval step, jitted for `mesh` (whose layout
    the caller checked: `sharding.check_layout`)."""
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    graphdef, make_state = init_state(cfg, tx)
    abstract = jax.eval_shape(make_state)
    shardings = sharding.state_shardings(abstract, mesh)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    bsh, ssh, rep = sharding.batch_sharding(mesh), sharding.stacked_batch_sharding(mesh), sharding.replicated(mesh)
    train_step = make_train_step(graphdef, tx, schedule, cfg.train.grad_accum)

    def jit(fn, **kw):
        return sharding.on_mesh(jax.jit(fn, **kw), mesh)

    step_fn = jit(train_step, in_shardings=(shardings, bsh, bsh), out_shardings=(shardings, rep), donate_argnums=0)
    multi_fn = jit(make_multi_step(train_step), in_shardings=(shardings, ssh, ssh), out_shardings=(shardings, rep),
                   donate_argnums=0)
    eval_fn = jit(make_eval_step(graphdef), in_shardings=(shardings, bsh, bsh, bsh), out_shardings=rep)
    return JittedSteps(graphdef, make_state, shardings, abstract, step_fn, multi_fn, eval_fn)


def steps_in_call(step: int, cfg: Config) -> int:
    """Optimizer steps in the jitted call that starts at global step `step`: up to train.steps_per_call,
    cut so that every eval, checkpoint and sample step ends a call, and the profiled steps run one per call."""
    n = min(cfg.train.steps_per_call - step % cfg.train.steps_per_call, cfg.train.steps - step)
    for every in (cfg.train.eval_every, cfg.checkpoint.every, cfg.log.sample_every):
        if every:
            n = min(n, every - step % every)
    if cfg.log.profile_steps:
        first, last = cfg.log.profile_steps
        n = min(n, first - step) if step < first else (1 if step <= last else n)
    return n


@dataclass
class Window:
    """Training metrics since the last log line."""

    losses: list[float] = field(default_factory=list)
    t0: float = field(default_factory=time.time)


@dataclass
class Loop:
    """What the loop carries from one call to the next; the functions below read and update it."""

    cfg: Config
    mesh: Any
    jitted: JittedSteps
    state: TrainState
    step: int  # optimizer steps done
    data_dir: Path
    tokenizer: Any
    batches: Any
    ckpt: Checkpointer
    tracker: Tracker
    profiler: Profiler
    bar: Any
    lead: bool  # process 0: the one that writes and prints
    lock: Any  # train.out_dir's DirLock (process 0)
    pending: list = field(default_factory=list)  # (first step, n, device metrics) not yet checked
    window: Window = field(default_factory=Window)
    train_loss: float | None = None
    eval_step: int | None = None
    eval_loss: float | None = None

    def close(self) -> None:
        """Close everything, the checkpointer's wait included, even when one of them fails; the lock last."""
        with contextlib.ExitStack() as stack:
            for closer in (getattr(self.lock, "release", None), self.tracker.close, self.ckpt.close,
                           self.profiler.close, getattr(self.batches, "close", None), self.bar.close):
                if closer is not None:
                    stack.callback(closer)


def start(cfg: Config, stop: StopFlag) -> Loop:
    """The run's lock, checks and data (`preflight.launch`), compiled steps, the state (restored or fresh), the
    run files, trackers. A run already complete gets none of the writers: nothing in it changes."""
    lock, mesh, data_dir = launch(cfg, stop)  # before anything is created or compiled
    try:
        stop.check("the first step")
        tune_for_cpu_backend()  # queries the backend, so only after jax.distributed.initialize()
        jitted = build(cfg, mesh)
        run_dir, lead = Path(cfg.train.out_dir), jax.process_index() == 0
        latest = (saved_steps(run_dir) or [None])[-1] if cfg.checkpoint.resume else None
        if latest is None or latest < cfg.train.steps:  # before anything is created or allocated
            check_disk(cfg, sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(jitted.abstract)))
            compile_first_call(cfg, jitted, mesh, latest or 0)
        stop.check("the first step")
        ckpt = Checkpointer(run_dir, cfg.checkpoint)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    try:
        state, step = restore_or_init(cfg, jitted, ckpt, mesh)
        complete = step >= cfg.train.steps
        changes = resumed_changes(cfg, step) if step and not complete else {}  # before config.toml is rewritten
        if lead and not complete:
            write_run_files(run_dir, cfg, data_dir)
        tracker = Tracker(run_dir, tensorboard=cfg.log.tensorboard, enabled=lead and not complete, start_step=step)
        if not complete:
            tracker.start(step, changes)
            report_memory(state, tracker, lead, fresh=step == 0)
    except BaseException:
        with contextlib.ExitStack() as stack:
            if lock is not None:
                stack.callback(lock.release)
            ckpt.close()
        raise
    batches = None if complete else train_batches(
        data_dir, cfg.data.batch_size, cfg.model.context_length, cfg.train.seed, start_step=step,
        process_index=jax.process_index(), process_count=jax.process_count(), num_workers=cfg.data.num_workers,
        prefetch=cfg.data.prefetch)
    from tqdm import tqdm

    bar = tqdm(total=cfg.train.steps, initial=step, disable=not (cfg.log.progress and lead and not complete),
               dynamic_ncols=True)
    return Loop(cfg, mesh, jitted, state, step, data_dir, load_tokenizer_from_meta(data_dir), batches, ckpt, tracker,
                Profiler(cfg.log.profile_steps, tracker.tb_dir), bar, lead, lock)


def compile_first_call(cfg: Config, jitted: JittedSteps, mesh, step: int) -> None:
    """Compile the first call's step ahead of time (the call reuses the executable) and hold its memory
    against the device's (preflight.check_memory) before any state is allocated."""
    n = steps_in_call(step, cfg)
    shape = (cfg.data.batch_size, cfg.model.context_length)
    fn, shape, where = ((jitted.step_fn, shape, sharding.batch_sharding(mesh)) if n == 1 else
                        (jitted.multi_fn, (n, *shape), sharding.stacked_batch_sharding(mesh)))
    x = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=where)
    compiled = fn.lower(jitted.abstract, x, x).compile()
    check_memory(cfg, compiled, sharding.batch_size_over(mesh) * cfg.train.grad_accum * cfg.parallel.microbatches)


def restore_or_init(cfg: Config, jitted: JittedSteps, ckpt: Checkpointer, mesh) -> tuple[TrainState, int]:
    """(state, optimizer steps done): the newest checkpoint that restores when resuming, else a fresh state
    (with the weights of train.init_from when set, placed with the state's shardings: a fresh optimizer
    and schedule on them)."""
    if not (cfg.checkpoint.resume and ckpt.latest_step() is not None):
        base = load_base_weights(cfg.train.init_from, cfg) if cfg.train.init_from else None
        if base is not None:
            base = jax.device_put(base, sharding.state_shardings(base, mesh))
            print(f"initialised from the weights of {cfg.train.init_from}", file=sys.stderr)
        return jax.jit(jitted.make_state, out_shardings=jitted.shardings)(base), 0
    state, meta = ckpt.restore(jitted.abstract)
    step = int(meta["data_step"])
    where, done = f"{ckpt.dir}/{meta['step']}", f"step {step} of train.steps = {cfg.train.steps}"
    print(f"resumed from {where} ({done})" if step < cfg.train.steps else f"the run in {cfg.train.out_dir} is "
          f"already complete ({done}, checkpoint {where}): nothing was trained or changed; raise train.steps to "
          "continue it, or choose another train.out_dir to start over", file=sys.stderr)
    return state, step


def report_memory(state: TrainState, tracker: Tracker, lead: bool, fresh: bool) -> None:
    """One line (and a metrics.jsonl row at step 0) on what is trained and what it costs in memory."""
    m = memory_summary(state.params, state.opt_state, state.non_trainable)
    total = m["trainable_params"] + m["frozen_params"]
    if fresh:
        tracker.scalars(0, {f"params/{k}": v for k, v in m.items()}, "params")
    if lead:
        frozen = (f"; frozen weights {m['frozen_bytes'] / 2**20:.2f} MiB ({m['frozen_bytes_per_param']:.2f} bytes per "
                  "parameter)") if m["frozen_params"] else ""
        if m["quantised_bytes_per_param"]:
            frozen += f", the quantised base {m['quantised_bytes_per_param']:.3f} bytes per parameter"
        share = 100 * m["trainable_params"] / total
        n, kind = jax.device_count(), jax.devices()[0].device_kind
        print(f"trainable parameters {m['trainable_params']:,} of {total:,} ({share:.2f} %)"
              f"; gradients {m['grad_bytes'] / 2**20:.2f} MiB, optimizer state {m['optimizer_bytes'] / 2**20:.2f} MiB"
              f"{frozen}; on {n} {kind} device{'s' if n > 1 else ''} ({jax.default_backend()} backend)",
              file=sys.stderr)


def run_call(loop: Loop) -> None:
    """One jitted call of `steps_in_call` steps; its metrics stay on the device until `drain`."""
    n = steps_in_call(loop.step, loop.cfg)
    xs, ys = zip(*(next(loop.batches) for _ in range(n)))
    b, mesh = loop.jitted, loop.mesh
    loop.profiler.before_step(loop.step)
    with loop.profiler.annotation(loop.step):
        if n == 1:
            loop.state, metrics = b.step_fn(loop.state, sharding.global_batch(xs[0], mesh),
                                            sharding.global_batch(ys[0], mesh))
        else:
            loop.state, metrics = b.multi_fn(loop.state, sharding.global_batch(np.stack(xs), mesh, stacked=True),
                                             sharding.global_batch(np.stack(ys), mesh, stacked=True))
    loop.profiler.after_step(loop.step, loop.state)
    drain(loop)  # the previous call's metrics: one call stays in flight
    loop.pending.append((loop.step, n, metrics))
    loop.step += n
    loop.bar.update(n)


def drain(loop: Loop) -> None:
    """Fetch the queued metrics, stop on a non-finite loss, log at log steps."""
    while loop.pending:
        first, n, metrics = loop.pending.pop(0)
        stacked = jax.device_get(metrics)
        for i in range(n):
            log_step(loop, first + i + 1, {k: float(v[i] if n > 1 else v) for k, v in stacked.items()})


def log_step(loop: Loop, done: int, m: dict[str, float]) -> None:
    """Check one step's metrics and add them to the log window; write the window at log steps."""
    if not (math.isfinite(m["loss"]) and math.isfinite(m["param_norm"])):
        last = loop.ckpt.latest_step()
        where = (f"the last good checkpoint is step {last} in {loop.ckpt.dir}" if last is not None
                 else "no checkpoint was written")
        raise TrainingDiverged(f"loss {m['loss']}, parameter norm {m['param_norm']} at step {done} "
                               f"(grad_norm {m['grad_norm']:.3g}, lr {m['lr']:.3g}); stopped without saving, {where}; "
                               "lower optim.lr or check the data")
    loop.window.losses.append(m["loss"])
    loop.train_loss = m["loss"]
    cfg = loop.cfg
    if done % cfg.log.every and done != cfg.train.steps:
        return
    B, T = cfg.data.batch_size, cfg.model.context_length
    dt, k = time.time() - loop.window.t0, len(loop.window.losses)
    tok_s = k * B * T / max(dt, 1e-9)
    device = jax.devices()[0].device_kind
    values = {
        "train/loss": float(np.mean(loop.window.losses)), "train/grad_norm": m["grad_norm"],
        "train/param_norm": m["param_norm"], "train/lr": m["lr"], "perf/tokens_per_s": tok_s,
        "perf/step_time_s": dt / k, "perf/peak_memory_bytes": peak_memory_bytes(),
        "perf/mfu": flops.mfu(tok_s, cfg.model, T, device, jax.device_count(), cfg.compute.dtype, cfg.log.peak_flops),
    }
    loop.tracker.scalars(done, values, "train")
    loop.bar.set_postfix(loss=f"{values['train/loss']:.3f}", tok_s=f"{tok_s:,.0f}")
    loop.window = Window()


def evaluate(loop: Loop) -> dict[str, float]:
    """Loss, perplexity and accuracy over the data.eval_tokens validation targets of `eval_batches`
    (the same targets at every batch size), and how many were scored."""
    cfg, mesh = loop.cfg, loop.mesh
    B, T = cfg.data.batch_size // cfg.train.grad_accum, cfg.model.context_length
    totals = {"loss_sum": 0.0, "correct": 0.0, "tokens": 0.0}
    for batch in eval_batches(loop.data_dir, "val", B, T, cfg.data.eval_tokens,
                              process_index=jax.process_index(), process_count=jax.process_count()):
        out = loop.jitted.eval_fn(loop.state, *(sharding.global_batch(a, mesh) for a in batch))
        for k, v in jax.device_get(out).items():
            totals[k] += float(v)
    n = totals["tokens"]
    loss = totals["loss_sum"] / n
    return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 80.0)), "eval/accuracy": totals["correct"] / n,
            "eval/tokens": n}


def evaluate_and_log(loop: Loop) -> None:
    drain(loop)
    ev = evaluate(loop)
    loop.eval_step, loop.eval_loss = loop.step, ev["eval/loss"]
    loop.tracker.scalars(loop.step, ev, "eval")
    if loop.lead:
        loop.bar.write(f"step {loop.step}: val loss {ev['eval/loss']:.4f}, ppl {ev['eval/perplexity']:.2f}, "
                       f"acc {ev['eval/accuracy']:.3f}")


def save(loop: Loop) -> None:
    """Checkpoint the state after the pending metrics proved it finite (with the val loss if just measured)."""
    drain(loop)
    val = loop.eval_loss if loop.eval_step == loop.step else None
    meta = {"step": loop.step, "data_step": loop.step, "seed": loop.cfg.train.seed, "identity": run_identity(loop.cfg)}
    loop.ckpt.save(loop.state, meta, val_loss=val)


def write_sample(loop: Loop) -> str:
    """A text sample from the current weights (the decoding Generator, sliding past the context), logged."""
    cfg, tok = loop.cfg, loop.tokenizer
    out = Generator(loop.state.model(loop.jitted.graphdef), tok.vocab_size).generate(
        [encode_prompt(tok, cfg.log.sample_prompt)], cfg.log.sample_tokens,
        SamplingParams(temperature=cfg.log.sample_temperature), seed=cfg.train.seed)
    text = cfg.log.sample_prompt + tok.decode(out.tokens[0])
    loop.tracker.text(loop.step, "samples/text", text)
    return text


def on_schedule(loop: Loop, stop: StopFlag) -> bool:
    """Evaluate, sample and checkpoint where due after a call; True when a signal asks to stop."""
    cfg, done = loop.cfg, loop.step
    final = done == cfg.train.steps
    if done % cfg.train.eval_every == 0 or final:
        evaluate_and_log(loop)
    if cfg.log.sample_every and cfg.log.sample_tokens and done % cfg.log.sample_every == 0 and not final:
        write_sample(loop)
    if done % cfg.checkpoint.every == 0 or final or stop.signal is not None:
        if stop.signal is not None and loop.lead:
            loop.bar.write(f"{stop.signal}: saving a checkpoint at step {done} "
                           "(Ctrl-C again stops at once, without it)")
        save(loop)
    return stop.signal is not None


def train(cfg: Config, stop: StopFlag | None = None) -> dict:
    """Run (or continue) the training run `cfg` describes; returns a summary of the end state. `stop`: the
    signal flag the command installed before importing JAX (else one is installed here)."""
    if stop is None:
        with StopFlag() as stop:
            return train(cfg, stop)
    t_start = time.time()
    loop = start(cfg, stop)
    stop.on_abort.append(loop.ckpt.abort_note)
    sample, complete = None, loop.step >= cfg.train.steps
    try:
        while loop.step < cfg.train.steps:
            run_call(loop)
            if on_schedule(loop, stop):
                break
        drain(loop)
        if loop.step == cfg.train.steps and not complete and stop.signal is None and cfg.log.sample_tokens:
            sample = write_sample(loop)
    finally:
        loop.close()  # waits for the last checkpoint: only then is it reported saved
        stop.on_abort.remove(loop.ckpt.abort_note)
    if loop.lead and sample is not None:
        print(f"\n--- sample after {loop.step} steps ---\n{sample}\n---")
    stopped = f"{stop.signal}: checkpoint {loop.step} saved in {loop.ckpt.dir}" if stop.signal and not complete and \
        loop.step < cfg.train.steps else None
    return {"step": loop.step, "train_loss": loop.train_loss, "val_loss": loop.eval_loss, "sample": sample,
            "wall_s": time.time() - t_start, "run_dir": str(cfg.train.out_dir), "stopped": stopped}
