"""Check a training run before it starts, so that a bad input costs seconds, not a run.

`preflight(cfg)` runs at the top of `jaxlm.train.start`, before any run directory is
created or any step is compiled: the output directory and the saved run when resuming,
jax.distributed start-up, the attention kernel and the batch on this machine's devices,
then the data (prepared here when needed: the only thing written, atomically), its
tokenizer against the saved run's, each split's size and its token ids. Every failure
is one UserError line naming the key, file or value.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from jaxlm.core import sharding
from jaxlm.core.config import ComputeConfig, Config, ModelConfig, to_dict, toml_value
from jaxlm.core.errors import CheckpointError, ConfigError, DataError
from jaxlm.core.files import writable_dir_problem
from jaxlm.core.typedconfig import flatten_tree
from jaxlm.data.prepare import META, SPLITS, ensure_prepared, max_token_id, read_meta
from jaxlm.nn.attention import cudnn_problem
from jaxlm.training.checkpoint import find_run_dir, read_run_config, saved_steps

# What a resumed run must share with the saved one: the architecture (the saved arrays'
# shapes and meaning) and the seed (the data order); the tokenizer (what the ids mean) is
# compared by digest in `check_data`. Execution keys (compute.*, log.*, train.steps, ...) may differ.
MUST_MATCH = ("model.", "train.seed", "lora.", "qat.", "compute.scan_layers")


def preflight(cfg: Config) -> Path:
    """Validate `cfg` against this machine, the run directory and the data; returns the data directory."""
    check_run_dir(cfg)
    check_init_from(cfg)
    start_distributed(cfg)
    check_devices(cfg)
    data_dir = prepare_data(cfg)
    check_data(cfg, data_dir)
    check_same_tokenizer(cfg, data_dir)
    return data_dir


def check_run_dir(cfg: Config) -> None:
    """train.out_dir can be written; a run there is continued only by a compatible config."""
    run_dir = Path(cfg.train.out_dir)
    problem = writable_dir_problem(run_dir)
    if problem:
        raise ConfigError(f"train.out_dir = {str(run_dir)!r}: {problem}; choose another train.out_dir")
    steps = saved_steps(run_dir)
    if not steps:
        return
    if not cfg.checkpoint.resume:
        raise ConfigError(
            f"train.out_dir = {str(run_dir)!r}: holds checkpoints (newest: step {steps[-1]}) and checkpoint.resume is "
            f"false, so a fresh run would mix with them; resume it, choose another train.out_dir, or move "
            f"{run_dir / 'checkpoints'} away")
    if (run_dir / "config.toml").is_file():
        check_compatible(read_run_config(run_dir), cfg, run_dir)


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


def check_compatible(saved: Config, cfg: Config, run_dir: Path) -> None:
    """One CheckpointError naming every key the resumed run may not change (`model.d_model: checkpoint 128, config 64`)."""
    old, new = flatten_tree(to_dict(saved)), flatten_tree(to_dict(cfg))
    keys = [k for k in sorted(old.keys() | new.keys()) if k.startswith(MUST_MATCH) and old.get(k) != new.get(k)]
    if (saved.optim.grad_clip > 0) != (cfg.optim.grad_clip > 0):  # clipping adds a state to the optimizer
        keys.append("optim.grad_clip")
    if keys:
        shown = "; ".join(f"{k}: checkpoint {_show(old.get(k))}, config {_show(new.get(k))}" for k in keys)
        raise CheckpointError(f"{run_dir / 'config.toml'}: the saved run differs: {shown}; use the saved values to "
                              "resume it, or another train.out_dir to start a new run")


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


def check_devices(cfg: Config) -> None:
    """The attention kernel runs on this backend; the batch divides over the devices and processes."""
    check_attention(cfg.model, cfg.compute)
    mesh = sharding.make_mesh(cfg=cfg.parallel)
    sharding.check_model(cfg.model, mesh)
    sharding.check_pipeline(cfg.model, cfg.compute.scan_layers, cfg.parallel.microbatches,
                            cfg.data.batch_size // cfg.train.grad_accum, mesh)
    sharding.check_batch(cfg.data.batch_size, cfg.train.grad_accum, mesh)


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
        ensure_prepared(cfg.data)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("data prepared")
    data_dir = ensure_prepared(cfg.data)
    vocab = read_meta(data_dir)["vocab_size"]
    if vocab > cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size = {cfg.model.vocab_size}: smaller than the tokenizer's vocabulary ({vocab} "
                          f"in {Path(data_dir) / META}); raise it to at least {vocab}")
    return data_dir


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
    """A resumed run reads token ids that mean what they meant when it was saved."""
    run_dir = Path(cfg.train.out_dir)
    saved = run_dir / "tokenizer"
    if not (cfg.checkpoint.resume and saved_steps(run_dir) and (saved / META).is_file()):
        return
    was, now = read_meta(saved).get("tokenizer_sha256"), read_meta(data_dir).get("tokenizer_sha256")
    if was and now and was != now:
        raise DataError(f"{Path(data_dir) / META}: made with tokenizer {read_meta(data_dir)['tokenizer']!r}, but the run in "
                        f"{run_dir} was trained with {read_meta(saved)['tokenizer']!r} ({saved / META}); point "
                        "data.dir at data made with that tokenizer, or use another train.out_dir")
