"""Check a training run before it starts, so that a bad input costs seconds, not a run.

`launch(cfg)` is the start-up in one pass, before any run directory is created or any step is
compiled: train.out_dir's lock (one writer per run; jax.distributed is started first when
configured, since only process 0 takes it), the run directory (its checkpoints/ and the saved
run when resuming), train.init_from, the model's size against the devices' memory, the
attention kernel on this backend, the mesh (made once) and the layout over it, then the data
(prepared here when needed: the only thing written, atomically), its tokenizer against the
saved run's (or train.init_from's), each split's size and its token ids. It returns the lock,
the mesh and the data directory. Once the step is built, `check_disk` and `check_memory` hold
one checkpoint and the compiled step against the free disk and the device's memory. Every
failure is one UserError line naming the key, file or value.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh

from jaxlm.analysis.flops import param_counts
from jaxlm.analysis.memory import compiled_memory
from jaxlm.core import sharding
from jaxlm.core.config import ComputeConfig, Config, ModelConfig
from jaxlm.core.errors import CheckpointError, ConfigError, DataError
from jaxlm.core.files import path_problem, read_json, writable_dir_problem
from jaxlm.core.limits import host_memory
from jaxlm.core.lock import DirLock
from jaxlm.core.stop import StopFlag
from jaxlm.core.typedconfig import flatten_tree, to_dict, toml_value
from jaxlm.core.units import binary
from jaxlm.data.prepare import META, SPLITS, ensure_prepared, max_token_id, read_meta
from jaxlm.nn.attention import cudnn_problem
from jaxlm.nn.loss import chunk_tokens
from jaxlm.training.checkpoint import find_run_dir, imported_from, read_run_config, saved_steps

# What a resumed run must share with the saved one: the architecture (the saved arrays'
# shapes and meaning) and the seed (the data order); the tokenizer (what the ids mean) is
# compared by digest in `check_data`. Execution keys (compute.*, log.*, train.steps, ...) may differ.
MUST_MATCH = ("model.", "train.seed", "lora.", "qat.", "compute.scan_layers")


class Launch(NamedTuple):
    """What `launch` hands the loop: the lock it holds, the mesh it checked the layout on, the prepared data."""

    lock: DirLock | None  # train.out_dir's lock (process 0; None on the others)
    mesh: Mesh
    data_dir: Path


def launch(cfg: Config, stop: StopFlag | None = None) -> Launch:
    """Lock, then validate `cfg` against the run directory, this machine and the data (module docstring);
    the lock is released when a check fails, and by a second Ctrl-C (`stop`) while the data is prepared."""
    lock = lock_run(cfg)  # starts jax.distributed when configured: the lock is process 0's
    if lock is not None and stop is not None:
        stop.on_abort.append(lambda: lock.release() or "")
    try:
        check_run_dir(cfg)
        check_init_from(cfg)
        check_model_size(cfg)
        check_attention(cfg.model, cfg.compute)
        mesh = sharding.make_mesh(cfg=cfg.parallel)
        sharding.check_layout(cfg, mesh)
        note_loss_chunk(cfg)
        data_dir = prepare_data(cfg)
        check_data(cfg, data_dir)
        check_same_tokenizer(cfg, data_dir)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return Launch(lock, mesh, data_dir)


def lock_run(cfg: Config) -> DirLock | None:
    """train.out_dir's lock (jaxlm.core.lock), taken by process 0 before anything in it is read or written;
    None on the other processes."""
    check_out_dir(Path(cfg.train.out_dir))
    _check_writable(Path(cfg.train.out_dir))
    if cfg.parallel.distributed:
        start_distributed(cfg)
        if jax.process_index() != 0:
            return None
    return DirLock(cfg.train.out_dir, f"train.out_dir = {cfg.train.out_dir!r}").acquire()


# What may sit in train.out_dir before its run starts: the traceback file of a failed start, and what a plan
# runner (experiments.run) writes before it starts the run there: its spec and the run's output log.
ALLOWED_BEFORE_A_RUN = ("error.log", "spec.json", "output.log")


def check_out_dir(run_dir: Path) -> None:
    """train.out_dir is not a file system's root or a home directory, and an existing non-empty directory is a run
    (it holds config.toml or checkpoints/): training writes config.toml, metrics.jsonl, tokenizer/ and tb/ there."""
    if problem := path_problem(run_dir.expanduser()):
        raise ConfigError(f"train.out_dir = {str(run_dir)!r}: {problem}; choose another train.out_dir")
    where = run_dir.expanduser().resolve()
    if where == Path(where.anchor) or where == Path(os.path.expanduser("~")).resolve():
        what = "the file system's root" if where == Path(where.anchor) else "a home directory"
        raise ConfigError(f"train.out_dir = {str(run_dir)!r}: {what}; a run writes config.toml, metrics.jsonl and "
                          "checkpoints/ into its directory: choose a directory of its own, e.g. runs/NAME")
    if not where.is_dir() or (where / "config.toml").is_file() or (where / "checkpoints").is_dir():
        return
    try:
        others = sorted(p.name for p in where.iterdir() if p.name not in ALLOWED_BEFORE_A_RUN)
    except OSError:  # unreadable: the writability check says so
        return
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ConfigError(f"train.out_dir = {str(run_dir)!r}: not empty and not a jaxlm run (no config.toml, no "
                          f"checkpoints/): it holds {shown}, which the run would write over or mix with; choose a "
                          "new or empty directory")


def _check_writable(run_dir: Path) -> None:
    for d in (run_dir, run_dir / "checkpoints"):
        problem = writable_dir_problem(d)
        if problem:
            raise ConfigError(f"train.out_dir = {str(run_dir)!r}: {problem}; choose another train.out_dir")


def check_run_dir(cfg: Config) -> None:
    """train.out_dir and its checkpoints/ can be written; a run there is continued only by a compatible config."""
    run_dir = Path(cfg.train.out_dir)
    _check_writable(run_dir)
    steps = saved_steps(run_dir)
    if not steps:
        return
    if not cfg.checkpoint.resume:
        raise ConfigError(
            f"train.out_dir = {str(run_dir)!r}: holds checkpoints (newest: step {steps[-1]}) and checkpoint.resume is "
            f"false, so a fresh run would mix with them; resume it, choose another train.out_dir, or move "
            f"{run_dir / 'checkpoints'} away")
    check_not_imported(run_dir)
    # The newest checkpoint whose meta reads: a damaged one is skipped by the restore too.
    step, saved = next(((s, i) for s in reversed(steps) if (i := checkpoint_identity(run_dir, s)) is not None),
                       (None, None))
    if saved is None:
        return
    toml = run_dir / "config.toml"
    written = run_identity(read_run_config(run_dir)) if toml.is_file() else None
    note = "" if written in (None, saved) else f" ({toml} no longer matches its checkpoints: edited?)"
    check_compatible(saved, cfg, run_dir / "checkpoints" / str(step), "checkpoint", note)


def resumed_changes(cfg: Config, step: int) -> dict[str, list]:
    """The keys but train.steps in which a run resumed at `step` differs from its config.toml, {key: [saved, now]},
    said in one line: they may change (the MUST_MATCH ones are refused before), but not without a word."""
    run_dir = Path(cfg.train.out_dir)
    saved, now = (flatten_tree(to_dict(c)) for c in (read_run_config(run_dir), cfg))
    changes = {k: [saved.get(k), now.get(k)] for k in sorted(saved.keys() | now.keys())
               if k != "train.steps" and saved.get(k) != now.get(k)}
    if changes and jax.process_index() == 0:
        shown = ", ".join(f"{k} {_show(old)} -> {_show(new)}" for k, (old, new) in changes.items())
        print(f"train.out_dir = {str(run_dir)!r}: resumed at step {step} with a changed config: {shown}; config.toml "
              "now holds the new values and metrics.jsonl records the change (another train.out_dir keeps runs "
              "apart)", file=sys.stderr)
    return changes


def check_not_imported(run_dir: Path) -> None:
    """A checkpoint `python -m jaxlm.hf import` wrote holds weights and no optimizer state: it is fine-tuned from
    into another directory, not resumed (nor trained over, which would delete it once checkpoint.keep is reached)."""
    if source := imported_from(run_dir):
        raise CheckpointError(f"train.out_dir = {str(run_dir)!r}: holds the checkpoint imported from {source} "
                              "(weights, no optimizer state), which is fine-tuned from, not resumed; train into a new "
                              f"directory: --set 'train.init_from=\"{run_dir}\"' --set 'train.out_dir=\"runs/NEW\"'")


# The model keys that fix the shapes of the weights train.init_from loads (RoPE and context are not weights).
WEIGHT_SHAPE_KEYS = ("vocab_size", "d_model", "num_layers", "d_ff", "ffn", "norm", "tie_embeddings")


def check_init_from(cfg: Config) -> None:
    """train.init_from names a run with a checkpoint whose weights fit this run's model (by its config)."""
    if not cfg.train.init_from or saved_steps(cfg.train.out_dir):
        return  # a resumed run restores its own checkpoint
    run_dir, step = find_run_dir(cfg.train.init_from)
    steps = saved_steps(run_dir)
    if not steps or (step is not None and step not in steps):
        raise CheckpointError(f"train.init_from = {cfg.train.init_from!r}: no such checkpoint (saved steps: "
                              f"{', '.join(map(str, steps)) or 'none'})")
    saved = read_run_config(run_dir).model
    for key in WEIGHT_SHAPE_KEYS:
        if getattr(saved, key) != getattr(cfg.model, key):
            raise ConfigError(f"train.init_from = {cfg.train.init_from!r}: its model.{key} = "
                              f"{toml_value(getattr(saved, key))}, this run's is {toml_value(getattr(cfg.model, key))}")


def run_identity(cfg: Config) -> dict:
    """The MUST_MATCH keys of `cfg` (flat) and whether it clips gradients (clipping adds an optimizer state):
    recorded in every checkpoint's meta, compared on resume."""
    flat = flatten_tree(to_dict(cfg))
    return {**{k: v for k, v in flat.items() if k.startswith(MUST_MATCH)},
            "optim.grad_clip > 0": cfg.optim.grad_clip > 0}


def checkpoint_identity(run_dir: Path, step: int) -> dict | None:
    """The identity checkpoint `step` was saved with (its meta JSON), None when it records none."""
    meta = read_json(Path(run_dir) / "checkpoints" / str(step) / "meta" / "metadata", default={})
    return meta.get("identity") if isinstance(meta, dict) and isinstance(meta.get("identity"), dict) else None


def check_compatible(saved: dict, cfg: Config, where: Path, what: str, note: str = "") -> None:
    """One CheckpointError naming every key the resumed run may not change
    (`model.d_model: checkpoint 128, config 64`)."""
    new = run_identity(cfg)
    keys = [k for k in sorted(saved.keys() | new.keys()) if saved.get(k) != new.get(k)]
    if keys:
        shown = "; ".join(f"{k}: {what} {_show(saved.get(k))}, config {_show(new.get(k))}" for k in keys)
        raise CheckpointError(f"{where}: the saved run differs: {shown}{note}; use the saved values to resume it, "
                              "or another train.out_dir to start a new run")


def _show(value) -> str:
    return "unset" if value is None else toml_value(value)


def start_distributed(cfg: Config) -> None:
    """jax.distributed.initialize() when configured (before anything asks for the devices)."""
    try:
        sharding.maybe_initialize_distributed(cfg.parallel)
    except (ValueError, RuntimeError) as e:
        line = next((l for l in str(e).splitlines() if l.strip()), type(e).__name__)
        raise ConfigError(f"parallel.distributed = true: jax.distributed.initialize() failed ({line[:200]}); set "
                          "parallel.coordinator, num_processes and process_id, or run under Slurm") from None


def check_attention(m: ModelConfig, c: ComputeConfig) -> None:
    """compute.attention can run this model on this machine (cuDNN needs an NVIDIA GPU, no dropout)."""
    if c.attention != "cudnn":
        return
    problem = cudnn_problem(c.dtype, m.head_dim)
    if problem:
        raise ConfigError(f"compute.attention = 'cudnn': {problem}; use \"xla\" or \"auto\"")
    if m.dropout > 0:
        raise ConfigError(f"compute.attention = 'cudnn': has no attention dropout, but model.dropout = {m.dropout}; "
                          "use \"auto\" (XLA while training with dropout) or \"xla\"")


def prepare_data(cfg: Config) -> Path:
    """Tokenise the sources once (process 0 first, the others wait); refuse a tokenizer larger than the model."""
    if jax.process_index() == 0:
        ensure_prepared(cfg.data, progress=cfg.log.progress)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("data prepared")
    data_dir = ensure_prepared(cfg.data, progress=cfg.log.progress)
    vocab = read_meta(data_dir)["vocab_size"]
    if vocab > cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size = {cfg.model.vocab_size}: smaller than the tokenizer's vocabulary "
                          f"({vocab} in {Path(data_dir) / META}); raise it to at least {vocab}")
    return data_dir


def note_loss_chunk(cfg: Config) -> None:
    """A warning, once, when compute.loss_chunk is below the micro-batch: a block of the chunked loss holds at
    least one position of every row, so the block is raised to the micro-batch."""
    micro, chunk = cfg.data.batch_size // cfg.train.grad_accum, chunk_tokens(cfg.compute, cfg.model.vocab_size)
    if 0 < chunk < micro:
        print(f"warning: compute.loss_chunk = {chunk} is below the micro-batch of {micro} rows (data.batch_size / "
              f"train.grad_accum); a block holds one position of every row, so blocks of {micro} tokens are used",
              file=sys.stderr)


def check_data(cfg: Config, data_dir: Path) -> None:
    """Each split holds at least one batch, and every token id is < model.vocab_size."""
    meta, T = read_meta(data_dir), cfg.model.context_length
    micro = cfg.data.batch_size // cfg.train.grad_accum
    for split in SPLITS:
        path = Path(data_dir) / f"{split}.bin"
        if not path.is_file():
            raise DataError(f"{path}: file not found; prepare the data again (docs/data.md)")
        size, itemsize = path.stat().st_size, np.dtype(meta["dtype"]).itemsize
        if size % itemsize:
            raise DataError(f"{path}: {size} bytes, not a whole number of {meta['dtype']} ids (truncated?)")
        n = size // itemsize
        if split == "train" and n <= T:
            raise DataError(f"{path}: {n} tokens, fewer than one training window of model.context_length + 1 = {T + 1}")
        if split == "val" and (n - 1) // T < micro:
            raise DataError(
                f"{path}: {n} tokens make {(n - 1) // T} evaluation windows of {T}, fewer than one batch of {micro} "
                "(data.batch_size / train.grad_accum); give the validation split more text (data.val_fraction) "
                "or lower data.batch_size or model.context_length")
        top = max_token_id(data_dir, split)
        if top >= cfg.model.vocab_size:
            raise DataError(f"{path}: holds token id {top}, but model.vocab_size = {cfg.model.vocab_size} (ids must be "
                            f"smaller); prepare the data with the model's tokenizer or raise model.vocab_size")


def check_same_tokenizer(cfg: Config, data_dir: Path) -> None:
    """A resumed run (or one that starts from train.init_from's weights) reads token ids that mean what
    they meant when those weights were trained."""
    run_dir = Path(cfg.train.out_dir)
    if cfg.checkpoint.resume and saved_steps(run_dir):
        saved, whose, fix = run_dir / "tokenizer", f"the run in {run_dir}", "or use another train.out_dir"
    elif cfg.train.init_from:
        saved, whose = find_run_dir(cfg.train.init_from)[0] / "tokenizer", f"train.init_from = {cfg.train.init_from!r}"
        fix = "or start from a run trained on this tokenizer"
    else:
        return
    if not (saved / META).is_file():
        return
    was, now = read_meta(saved).get("tokenizer_sha256"), read_meta(data_dir).get("tokenizer_sha256")
    if was and now and was != now:
        raise DataError(f"{Path(data_dir) / META}: made with tokenizer {read_meta(data_dir)['tokenizer']!r}, but "
                        f"{whose} was trained with {read_meta(saved)['tokenizer']!r} ({saved / META}); point "
                        f"data.dir at data made with that tokenizer, {fix}")


# --------------------------------------------------------------------------- once the step is built


def check_disk(cfg: Config, checkpoint_bytes: int) -> None:
    """The file system of train.out_dir holds the next checkpoint (refused when not even one fits; a warning
    when the checkpoint.keep + 1 that exist during a save do not)."""
    probe = Path(cfg.train.out_dir).absolute()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < checkpoint_bytes:
        raise ConfigError(f"train.out_dir = {cfg.train.out_dir!r}: its file system has {binary(free)} free, one "
                          f"checkpoint of this run takes {binary(checkpoint_bytes)}; free space or choose another "
                          "train.out_dir")
    if free < (cfg.checkpoint.keep + 1) * checkpoint_bytes:
        print(f"warning: train.out_dir = {cfg.train.out_dir!r}: {binary(free)} free holds fewer than "
              f"checkpoint.keep + 1 = {cfg.checkpoint.keep + 1} checkpoints of {binary(checkpoint_bytes)}",
              file=sys.stderr)


def available_memory() -> tuple[int, str] | None:
    """(bytes one device may still use, what that is), or None where it cannot be known. A GPU/TPU reports
    its own limit; the CPU devices share the host's memory, within the tightest of its available memory, the
    process's memory cgroup and its address-space limit (jaxlm.core.limits)."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0), f"this {device.device_kind} has"
    host = host_memory()
    if host is None or device.platform != "cpu":
        return None
    n = len(jax.local_devices())
    return host[0] // n, host[1] + (f" per each of its {n} CPU devices" if n > 1 else "")


def check_model_size(cfg: Config) -> None:
    """The weights alone (float32, or the quantised base's bytes) and the RoPE tables fit the memory of every
    device together: checked before anything is built, where a width of 1e20 would reach NumPy and XLA."""
    have = available_memory()
    if have is None:
        return
    per_device, where = have
    m = cfg.model
    params = param_counts(m)["total"]
    weights = params * BASE_BYTES[cfg.lora.base] + (m.context_length * m.head_dim * 4 if m.rope else 0)
    total = per_device * jax.device_count()
    if weights > total:
        raise ConfigError(f"model.d_model = {m.d_model}, model.num_layers = {m.num_layers}, model.vocab_size = "
                          f"{m.vocab_size}, model.d_ff = {m.d_ff}, model.context_length = {m.context_length}: "
                          f"{params:,.4g} parameters take {binary(weights)} before any optimizer state or activation, "
                          f"but {where} {binary(per_device)}"
                          + (f" ({jax.device_count()} devices: {binary(total)})" if jax.device_count() > 1 else "")
                          + "; choose a smaller model")


BASE_BYTES = {"float32": 4, "int8": 1, "nf4": 0.5}  # bytes per weight: a lower bound of every kind of lora.base


def check_memory(cfg: Config, compiled, batch_unit: int) -> None:
    """The compiled step (`compiled_memory`: arguments + outputs - donated + temporaries, per device) fits
    the device; else one line with the figure and the largest data.batch_size that fits (temporaries
    scale with the batch; `batch_unit` = what the batch must be a multiple of)."""
    have, m = available_memory(), compiled_memory(compiled)
    if m is None or have is None:
        return
    free, where = have
    need = m.total
    if need <= free:
        return
    B, fixed, temp = cfg.data.batch_size, need - m.temp, max(m.temp, 1)
    fits = int((free - fixed) / temp * B) // batch_unit * batch_unit
    figure = (f"the compiled train step needs {binary(need)} per device ({binary(fixed)} parameters, optimizer state "
              f"and batch, {binary(m.temp)} temporaries), but {where} {binary(free)}")
    if fits >= batch_unit:
        raise ConfigError(f"data.batch_size = {B}: {figure}; about {fits} fits: lower data.batch_size, raise "
                          "train.grad_accum or set compute.remat")
    raise ConfigError(f"model.d_model = {cfg.model.d_model}, model.num_layers = {cfg.model.num_layers} (a --preset?): "
                      f"{figure}, so no batch fits; choose a smaller model, or shard it over more devices "
                      "(parallel.fsdp)")
