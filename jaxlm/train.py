"""Train a Transformer LM: the loop and the command line, nothing else.

    python -m jaxlm.train --config experiments/configs/quickstart.toml [--set section.key=value ...] [--resume | --no-resume]

Each step: fetch the batch of global step s (a pure function of (seed, s)), run the
jitted, donated `train_step`, check the previous step's loss is finite, then log,
evaluate, sample and checkpoint on their schedules. SIGTERM / SIGINT finish the
current step, save a checkpoint and exit; a non-finite loss stops the run without
saving (the last good checkpoint stays).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from jaxlm import flops, parallel
from jaxlm.checkpoint import Checkpointer, write_run_files
from jaxlm.config import Config, ConfigError, load_config
from jaxlm.data.loader import eval_batches, train_batches
from jaxlm.data.prepare import ensure_prepared, load_tokenizer_from_meta, read_meta
from jaxlm.host import tune_for_cpu_backend
from jaxlm.optim import make_optimizer
from jaxlm.sample import sample_text
from jaxlm.step import init_state, make_eval_step, make_multi_step, make_train_step, merge_model
from jaxlm.tracking import Profiler, Tracker, peak_memory_bytes


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class _StopFlag:
    """Set by SIGTERM / SIGINT; a second SIGINT interrupts at once."""

    def __init__(self):
        self.signal = None
        self._old = {}

    def _handler(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


def evaluate(eval_fn, state, data_dir, cfg: Config, mesh) -> dict[str, float]:
    """Mean loss / accuracy over the first train.eval_batches windows of val.bin, and perplexity."""
    B, T = cfg.data.batch_size // cfg.train.grad_accum, cfg.model.context_length
    totals, n = {"loss": 0.0, "accuracy": 0.0}, 0
    batches = eval_batches(data_dir, "val", B, T, max_batches=cfg.train.eval_batches,
                           process_index=jax.process_index(), process_count=jax.process_count(), drop_last=True)
    for x, y in batches:
        out = eval_fn(state["params"], state["rest"], parallel.global_batch(x, mesh), parallel.global_batch(y, mesh))
        for k, v in jax.device_get(out).items():
            totals[k] += float(v)
        n += 1
    if n == 0:
        raise ValueError(f"val split in {data_dir} is shorter than one batch of {B} x {T} tokens")
    loss = totals["loss"] / n
    return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 80.0)), "eval/accuracy": totals["accuracy"] / n}


class Built(NamedTuple):
    graphdef: Any
    make_state: Callable  # () -> fresh train state (call under jit with out_shardings)
    shardings: Any  # NamedSharding per state leaf
    abstract: Any  # ShapeDtypeStructs (with shardings) of the state: the restore target
    step_fn: Callable  # jitted, donated (state, x, y) -> (state, metrics)
    multi_fn: Callable  # jitted, donated (state, xs, ys) -> (state, metrics stacked): n steps in one call
    eval_fn: Callable  # jitted (params, rest, x, y) -> {"loss", "accuracy"}


def build(cfg: Config, mesh) -> Built:
    """Everything compiled for a run on `mesh`: init, shardings, train and eval steps."""
    parallel.check_batch(cfg.data.batch_size, cfg.train.grad_accum, mesh)
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    graphdef, make_state = init_state(cfg.model, tx, cfg.train.seed)
    abstract = jax.eval_shape(make_state)
    shardings = parallel.state_shardings(abstract, mesh, cfg.parallel.fsdp)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    bsh, rep = parallel.batch_sharding(mesh), parallel.replicated(mesh)
    train_step = make_train_step(graphdef, tx, schedule, cfg.train.grad_accum)
    step_fn = jax.jit(train_step, in_shardings=(shardings, bsh, bsh), out_shardings=(shardings, rep), donate_argnums=0)
    ssh = parallel.stacked_batch_sharding(mesh)
    multi_fn = jax.jit(make_multi_step(train_step), in_shardings=(shardings, ssh, ssh), out_shardings=(shardings, rep), donate_argnums=0)
    eval_fn = jax.jit(
        make_eval_step(graphdef), in_shardings=(shardings["params"], shardings["rest"], bsh, bsh), out_shardings=rep
    )
    return Built(graphdef, make_state, shardings, abstract, step_fn, multi_fn, eval_fn)


def train(cfg: Config) -> dict:
    """Run (or continue) the training run `cfg` describes; returns a summary of the end state."""
    t_start = time.time()
    parallel.maybe_initialize_distributed(cfg.parallel)
    tune_for_cpu_backend()  # queries the backend, so only after jax.distributed.initialize()
    P, p = jax.process_count(), jax.process_index()
    lead = p == 0

    if lead:
        ensure_prepared(cfg.data)
    if P > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("data prepared")
    data_dir = ensure_prepared(cfg.data)
    meta = read_meta(data_dir)
    if meta["vocab_size"] > cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size ({cfg.model.vocab_size}) is smaller than the tokenizer's vocabulary ({meta['vocab_size']})")
    tokenizer = load_tokenizer_from_meta(data_dir)

    mesh = parallel.make_mesh()
    b = build(cfg, mesh)
    graphdef, make_state, shardings, abstract = b.graphdef, b.make_state, b.shardings, b.abstract
    step_fn, multi_fn, eval_fn = b.step_fn, b.multi_fn, b.eval_fn

    run_dir = Path(cfg.train.out_dir)
    ckpt = Checkpointer(run_dir, cfg.checkpoint)
    start = 0
    if cfg.checkpoint.resume and ckpt.latest_step() is not None:
        state, ckpt_meta = ckpt.restore(abstract)
        start = int(ckpt_meta["data_step"])
        print(f"resumed from {ckpt.dir}/{ckpt_meta['step']}", file=sys.stderr)
        if start >= cfg.train.steps:
            print(f"the run in {run_dir} is already complete (step {start} of train.steps = {cfg.train.steps}); "
                  "raise train.steps to continue it, or pass --no-resume to start over", file=sys.stderr)
    else:
        state = jax.jit(make_state, out_shardings=shardings)()
    if lead:
        write_run_files(run_dir, cfg, data_dir)

    tracker = Tracker(run_dir, tensorboard=cfg.log.tensorboard, enabled=lead)
    profiler = Profiler(cfg.log.profile_steps, tracker.tb_dir)
    B, T = cfg.data.batch_size, cfg.model.context_length
    batches = train_batches(
        data_dir, B, T, cfg.train.seed, start_step=start, process_index=p, process_count=P,
        num_workers=cfg.data.num_workers, prefetch=cfg.data.prefetch,
    )
    from tqdm import tqdm

    bar = tqdm(total=cfg.train.steps, initial=start, disable=not (cfg.log.progress and lead), dynamic_ncols=True)
    device_kind, n_dev = jax.devices()[0].device_kind, jax.device_count()

    window = {"losses": [], "t0": time.time(), "steps": 0}
    last = {"train/loss": None, "eval/loss": None}
    pending: list = []

    def drain():
        """Fetch queued step metrics, stop on a non-finite loss, log at log steps."""
        while pending:
            first, n, metrics = pending.pop(0)
            stacked = jax.device_get(metrics)
            for i in range(n):
                log_step(first + i + 1, {k: float(v[i] if n > 1 else v) for k, v in stacked.items()})

    def log_step(done: int, m: dict):
        """Check one step's metrics (stop on a non-finite loss) and log them at log steps."""
        if not (math.isfinite(m["loss"]) and math.isfinite(m["param_norm"])):
            raise TrainingDiverged(
                f"loss {m['loss']}, parameter norm {m['param_norm']} at step {done} (grad_norm {m['grad_norm']:.3g}, lr {m['lr']:.3g}); stopping "
                f"without saving: the last good checkpoint is in {ckpt.dir} (lower optim.lr or check the data)"
            )
        window["losses"].append(m["loss"])
        window["steps"] += 1
        last["train/loss"] = m["loss"]
        if done % cfg.log.every == 0 or done == cfg.train.steps:
            dt = time.time() - window["t0"]
            tok_s = window["steps"] * B * T / max(dt, 1e-9)
            values = {
                "train/loss": float(np.mean(window["losses"])),
                "train/grad_norm": m["grad_norm"],
                "train/param_norm": m["param_norm"],
                "train/lr": m["lr"],
                "perf/tokens_per_s": tok_s,
                "perf/step_time_s": dt / window["steps"],
                "perf/mfu": flops.mfu(tok_s, cfg.model, T, device_kind, n_dev, cfg.log.peak_flops),
                "perf/peak_memory_bytes": peak_memory_bytes(),
            }
            tracker.scalars(done, values, "train")
            bar.set_postfix(loss=f"{values['train/loss']:.3f}", tok_s=f"{tok_s:,.0f}")
            window.update(losses=[], t0=time.time(), steps=0)

    def save(done: int):
        drain()
        ckpt.save(state, {"step": done, "data_step": done, "seed": cfg.train.seed}, val_loss=last["eval/loss"] if last.get("eval_step") == done else None)

    def do_sample(done: int) -> str:
        text = sample_text(merge_model(graphdef, state), tokenizer, cfg.log.sample_prompt, cfg.log.sample_tokens,
                           temperature=cfg.log.sample_temperature, seed=cfg.train.seed)
        tracker.text(done, "samples/text", text)
        return text

    def call_length(s: int) -> int:
        """Steps in the jitted call starting at global step s: up to train.steps_per_call, cut at
        every eval / checkpoint / sample step, the end, and around the profiled window."""
        n = min(cfg.train.steps_per_call - s % cfg.train.steps_per_call, cfg.train.steps - s)
        for every in (cfg.train.eval_every, cfg.checkpoint.every, cfg.log.sample_every):
            if every:
                n = min(n, every - s % every)
        if cfg.log.profile_steps:
            a, b = cfg.log.profile_steps
            n = min(n, a - s) if s < a else (1 if s <= b else n)
        return n

    done = start
    sample = None
    try:
        with _StopFlag() as stop:
            step = start
            while step < cfg.train.steps:
                n = call_length(step)
                xs, ys = zip(*(next(batches) for _ in range(n)))
                profiler.before_step(step)
                with profiler.annotation(step):
                    if n == 1:
                        state, metrics = step_fn(state, parallel.global_batch(xs[0], mesh), parallel.global_batch(ys[0], mesh))
                    else:
                        xg = parallel.global_batch(np.stack(xs), mesh, stacked=True)
                        state, metrics = multi_fn(state, xg, parallel.global_batch(np.stack(ys), mesh, stacked=True))
                profiler.after_step(step, state)
                drain()  # the previous call's metrics: keeps one call in flight
                pending.append((step, n, metrics))
                step = done = step + n
                bar.update(n)
                final = done == cfg.train.steps
                if done % cfg.train.eval_every == 0 or final:
                    drain()
                    ev = evaluate(eval_fn, state, data_dir, cfg, mesh)
                    last.update({"eval/loss": ev["eval/loss"], "eval_step": done})
                    tracker.scalars(done, ev, "eval")
                    if lead:
                        bar.write(f"step {done}: val loss {ev['eval/loss']:.4f}, ppl {ev['eval/perplexity']:.2f}, acc {ev['eval/accuracy']:.3f}")
                if cfg.log.sample_every and done % cfg.log.sample_every == 0 and not final:
                    do_sample(done)
                if done % cfg.checkpoint.every == 0 or final:
                    save(done)
                if stop.signal is not None:
                    if lead:
                        bar.write(f"{stop.signal}: saving a checkpoint at step {done} and exiting")
                    save(done)
                    break
            drain()
            if done == cfg.train.steps:
                sample = do_sample(done)
    finally:
        bar.close()
        batches.close()
        profiler.close()
        ckpt.close()
        tracker.close()
    if lead and sample is not None:
        print(f"\n--- sample after {done} steps ---\n{sample}\n---")
    return {"step": done, "train_loss": last["train/loss"], "val_loss": last["eval/loss"], "sample": sample,
            "wall_s": time.time() - t_start, "run_dir": str(run_dir)}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m jaxlm.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="TOML file (see docs/training.md); defaults apply to missing keys")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one key (value read as TOML: 3, 1e-3, true, [1, 2], \"text\"); repeatable")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                    help="continue from the run directory's latest checkpoint (default: checkpoint.resume)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    overrides = list(args.overrides)
    if args.resume is not None:
        overrides.append(f"checkpoint.resume={'true' if args.resume else 'false'}")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    try:
        summary = train(cfg)
    except TrainingDiverged as e:
        print(f"training diverged: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    val = "not evaluated in this invocation" if summary["val_loss"] is None else f"{summary['val_loss']:.4f}"
    print(f"done: step {summary['step']}, val loss {val}, {summary['wall_s']:.1f} s, run dir {summary['run_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
