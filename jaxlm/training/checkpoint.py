"""Checkpoints with orbax: the train state, the data position and the run's identity.

Run directory layout (everything `jaxlm.generate` needs, no flags):

    RUN/config.toml              the resolved config (`load_config(RUN/config.toml)` rebuilds it)
    RUN/tokenizer/              the token files' meta.json (names the tokenizer) + its vocab/merges copy
    RUN/checkpoints/<step>/state the train state: step, params, optimizer state, model RNG
    RUN/checkpoints/<step>/meta  JSON: step, data position, seed, val loss if known

The data loader's batch of global step s is a pure function of (seed, s), so the
data position is the step itself. Orbax writes each step to a temporary directory
and renames it when complete, so a killed run leaves its last complete checkpoint
usable (and the orphaned temporary directory, removed when the run restarts).
Saving is asynchronous; `wait()` and `close()` wait for it. A save that fails (a full
disk, no permission) is one `WriteFailed` line naming the directory and the cause;
orbax's own log (and its tracebacks) go to RUN/error.log. Restores go against an abstract
target (shapes, dtypes, shardings), never into plain dicts, and take the newest
checkpoint that restores cleanly: a damaged newer one is named in a warning and
skipped, never deleted.

PRNG key arrays (dropout streams) are stored as their raw uint32 key data (jaxlm.training.orbax_io).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Iterator

import jax
import orbax.checkpoint as ocp
from flax import nnx
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from jaxlm.core.config import CheckpointConfig, Config, load_config
from jaxlm.core.errors import CheckpointError, ConfigError, WriteFailed, write_traceback
from jaxlm.core.files import atomic_write, read_json, write_cause
from jaxlm.core.lock import unfinished
from jaxlm.core.typedconfig import dumps_toml, to_dict
from jaxlm.nn import scan
from jaxlm.nn.lora import has_adapters
from jaxlm.training.orbax_io import (
    abstract_savable,
    from_savable,
    log_orbax_to,
    mute_failed_reads,
    restore_newest,
    to_savable,
)
from jaxlm.training.step import TrainState, build_model, split_model

UNRESTORABLE = ".unrestorable"  # suffix of a checkpoint set aside because it does not restore


class Checkpointer:
    """An orbax CheckpointManager for RUN/checkpoints with the run's keep / keep-best policy; `save_gb` bounds the
    host memory of a save's copies (orbax copies every array at once without it: about 0.8 x the state)."""

    def __init__(self, run_dir: str | Path, cfg: CheckpointConfig, save_gb: float | None = None):
        self.run_dir = Path(run_dir).absolute()
        self.dir = self.run_dir / "checkpoints"
        self.saving: int | None = None  # the step of the save in flight
        self.failed = False
        policies = [pp.LatestN(n=cfg.keep)]
        if cfg.keep_best:
            policies.append(pp.BestN(get_metric_fn=lambda m: m["val_loss"], reverse=True, n=1,
                                     keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=pp.AnyPreservationPolicy(policies) if len(policies) > 1 else policies[0],
            enable_async_checkpointing=True, create=True,
            # What a killed save left behind. Not in a new directory: orbax lists it in a background thread that
            # only a save waits for, and an import interrupted before its save removes the directory under it.
            cleanup_tmp_directories=self.dir.is_dir(),
            # Directories made in save() itself: made in the background, a failure left orbax's other
            # threads waiting 5 minutes for it, and the process hanging at exit.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
        )
        mute_failed_reads()
        self._undo_logs = log_orbax_to(self.run_dir / "error.log")
        try:
            handlers = {"state": ocp.StandardCheckpointHandler(save_concurrent_gb=save_gb),
                        "meta": ocp.JsonCheckpointHandler()}
            self.manager = ocp.CheckpointManager(self.dir, options=options, item_handlers=handlers)
        except BaseException:
            self._undo_logs()
            raise

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, state: TrainState, meta: dict, val_loss: float | None = None) -> None:
        """Start saving `state` as checkpoint meta["step"] (after the previous save is on disk)."""
        step = int(meta["step"])
        if step in self.manager.all_steps():
            return
        self.wait()
        self.saving = step  # before orbax starts writing: a second Ctrl-C inside save() must not say none was
        with self._writing(step):
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(to_savable(state.as_dict())), meta=ocp.args.JsonSave(meta)
                ),
                metrics={"val_loss": float(val_loss)} if val_loss is not None else None,
                force=True,
            )

    def wait(self) -> None:
        """Block until the save in flight is complete on disk."""
        if self.saving is not None:
            with self._writing(self.saving):
                self.manager.wait_until_finished()
            self.saving = None

    @contextlib.contextmanager
    def _writing(self, step: int) -> Iterator[None]:
        """A failure inside is one WriteFailed line naming the directory and the cause (traceback: RUN/error.log)."""
        try:
            yield
        except Exception as e:
            self.failed = True
            log = write_traceback(self.run_dir)
            raise WriteFailed(f"{self.dir}: saving checkpoint {step} failed: {write_cause(e)}; free space or fix the "
                              f"directory, then run again to resume from the newest complete checkpoint "
                              f"(full traceback in {log})") from e

    def restore(self, abstract_state: TrainState) -> tuple[TrainState, dict]:
        """The newest checkpoint that restores cleanly. Newer ones that do not are renamed
        STEP.unrestorable (kept for inspection, out of the way of the steps saved again)."""
        target = abstract_state.as_dict()
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_savable(target)), meta=ocp.args.JsonRestore())
        step, out, failed = restore_newest(self.dir, self.manager.all_steps(),
                                           lambda s: self.manager.restore(s, args=args))
        if failed:
            self._set_aside(failed)
        return TrainState(**from_savable(out["state"], target)), dict(out["meta"])

    def _set_aside(self, steps: list[int]) -> None:
        if jax.process_index() == 0:
            for step in steps:
                dest, n = self.dir / f"{step}{UNRESTORABLE}", 1
                while dest.exists():
                    dest, n = self.dir / f"{step}{UNRESTORABLE}.{n}", n + 1
                os.replace(self.dir / str(step), dest)
                print(f"warning: {self.dir / str(step)} moved to {dest}", file=sys.stderr)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("unrestorable checkpoints set aside")
        self.manager.reload()

    def abort_note(self) -> str:
        """What a second Ctrl-C leaves behind (jaxlm.core.stop): the checkpoint in flight, saved or not, and any
        orbax temporary directory on disk (a save under way)."""
        saving, partial = self.saving, sorted(p.name for p in self.dir.glob("*.orbax-checkpoint-tmp*"))
        if saving is not None and (self.dir / str(saving)).is_dir():
            return f"checkpoint {saving} was saved in {self.dir}"
        if saving is None and not partial:
            return f"no checkpoint was being saved (the newest is in {self.dir})"
        left = f" ({', '.join(partial)} left: the next start removes it)" if partial else ""
        step = saving if saving is not None else "(unknown step)"
        return f"checkpoint {step} was not completed in {self.dir}{left}"

    def close(self) -> None:
        """Wait for the save in flight (unless one failed already), then close the manager."""
        try:
            if not self.failed:
                self.wait()
        finally:
            try:
                self.manager.close()
            except Exception:  # after a failed save, orbax's close reports that failure again
                if not self.failed:
                    raise
            finally:
                self._undo_logs()


def saved_steps(run_dir: str | Path) -> list[int]:
    """The steps of RUN/checkpoints, oldest first (orbax names a finished checkpoint by its step alone)."""
    d = Path(run_dir) / "checkpoints"
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and p.is_dir()) if d.is_dir() else []


def imported_from(run: str | Path) -> str | None:
    """The Hugging Face source a run was imported from (`python -m jaxlm.hf import`: its checkpoint's meta)."""
    run_dir, _ = find_run_dir(run)
    steps = saved_steps(run_dir)
    meta = read_json(run_dir / "checkpoints" / str(steps[0]) / "meta" / "metadata", default={}) if steps else {}
    return meta.get("imported_from") if isinstance(meta, dict) else None


def write_run_files(run_dir: str | Path, cfg: Config, data_dir: str | Path) -> None:
    """RUN/config.toml (resolved) and RUN/tokenizer/meta.json (from the token files), each written atomically."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "config.toml", dumps_toml(to_dict(cfg)))
    meta = Path(data_dir) / "meta.json"
    if meta.is_file():
        (run_dir / "tokenizer").mkdir(exist_ok=True)
        for name in ["meta.json", *json.loads(meta.read_text()).get("tokenizer_files", [])]:
            atomic_write(run_dir / "tokenizer" / name, (Path(data_dir) / name).read_bytes())


def find_run_dir(path: str | Path) -> tuple[Path, int | None]:
    """A run dir, its checkpoints dir, or one step's dir -> (run dir, step or None for latest)."""
    path = Path(path).absolute()
    for candidate, step in ((path, None), (path.parent, None), (path.parent.parent, path.name)):
        if (left := unfinished(candidate)) is not None:
            raise CheckpointError(f"{candidate}: left unfinished by `{left}`, which was killed before it completed; "
                                  "run that command again: it replaces the unfinished directory")
        if (candidate / "config.toml").is_file():
            return candidate, int(step) if step is not None and str(step).isdigit() else None
    raise CheckpointError(f"{path}: no config.toml here or in its parents, so not a jaxlm run directory")


def read_run_config(run_dir: str | Path) -> Config:
    """RUN/config.toml as a Config; a CheckpointError naming the file when it cannot be read."""
    path = Path(run_dir) / "config.toml"
    try:
        return load_config(path)
    except ConfigError as e:
        raise CheckpointError(f"{path}: the run's saved config cannot be read ({e})") from None


def restore_for_inference(run_or_ckpt_dir: str | Path, step: int | None = None):
    """(model, cfg, tokenizer) from a run directory (or a checkpoint inside one), on the default device.

    Only the parameters and model variables are read, not the optimizer state; the newest
    checkpoint that restores is taken (unless a step is named). Creates and changes nothing.
    `tokenizer` is None when the run has no tokenizer/meta.json.
    """
    run_dir, found_step = find_run_dir(run_or_ckpt_dir)
    step = step if step is not None else found_step
    cfg = read_run_config(run_dir)
    ckpt_dir, steps = run_dir / "checkpoints", saved_steps(run_dir)
    if not steps:
        raise CheckpointError(f"{run_dir}: holds no checkpoint yet ({ckpt_dir} has none); train it first")
    if step is not None and step not in steps:
        raise CheckpointError(f"{ckpt_dir}/{step}: no such checkpoint; saved steps: {', '.join(map(str, steps))}")
    abstract = nnx.eval_shape(lambda: build_model(cfg))
    graphdef, params, non_trainable = split_model(abstract)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {"params": params, "non_trainable": non_trainable}
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), target)
    saved = abstract_savable(target)
    args = ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=saved, restore_args=ocp.checkpoint_utils.construct_restore_args(saved), partial_restore=True))
    manager = ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(create=False),
                                    item_names=("state", "meta"))
    try:
        _, out, _ = restore_newest(ckpt_dir, steps if step is None else [step], lambda s: manager.restore(s, args=args))
    finally:
        manager.close()
    restored = from_savable(out["state"], target)
    model = nnx.merge(graphdef, restored["params"], restored["non_trainable"])
    tokenizer = None
    if (run_dir / "tokenizer" / "meta.json").is_file():
        from jaxlm.data.prepare import load_tokenizer_from_meta

        tokenizer = load_tokenizer_from_meta(run_dir / "tokenizer")
    return model, cfg, tokenizer


def _shapes(state) -> dict[str, tuple]:
    """{"layers/0/attn/q_proj/weight": shape} of an nnx.State."""
    flat = jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(a.shape) for path, a in flat}


def load_base_weights(path: str | Path, cfg: Config):
    """The nnx.Param weights of the run at `path` (a run, or RUN/checkpoints/STEP), checked against the
    model `cfg` builds: train.init_from. Either layer layout loads into either (compute.scan_layers).
    One CheckpointError line naming the first mismatch."""
    model, saved, _ = restore_for_inference(path)
    if has_adapters(model):
        raise CheckpointError(f"train.init_from = {str(path)!r}: a LoRA run (lora.rank = {saved.lora.rank}); fold its "
                              f"adapters into the weights first: python -m jaxlm.lora merge {path} --out DIR")
    scan.relayout(model, cfg.compute.scan_layers)  # either layer layout: the same numbers, (un)stacked
    loaded = nnx.state(model, nnx.Param)
    plain = Config(model=cfg.model, compute=cfg.compute)  # the weights alone: no adapters, no quantised base
    want = _shapes(nnx.state(nnx.eval_shape(lambda: build_model(plain)), nnx.Param))
    have = _shapes(loaded)
    for name, shape in want.items():
        if name not in have:
            raise CheckpointError(f"train.init_from = {str(path)!r}: has no weight {name} (its model differs: "
                                  "compare its config.toml with model.*)")
        if have[name] != shape:
            raise CheckpointError(f"train.init_from = {str(path)!r}: {name} has shape {have[name]} there, this "
                                  f"run's model.* needs {shape}")
    extra = sorted(set(have) - set(want))
    if extra:
        raise CheckpointError(f"train.init_from = {str(path)!r}: has weights this run's model lacks ({extra[0]}, "
                              f"{len(extra)} in all; compare its config.toml with model.*)")
    return loaded


def load_for_generation(path: str | Path, cfg: Config | None = None, tokenizer: str | None = None):
    """(model, tokenizer) restored from a run or checkpoint directory, run with `cfg.compute` when given;
    `tokenizer` (a `load_tokenizer` spec) stands in for the run's own."""
    if cfg is not None and cfg.compute.attention == "cudnn" and jax.default_backend() != "gpu":
        raise ConfigError(f"compute.attention: 'cudnn' needs an NVIDIA GPU, JAX sees {jax.default_backend()!r} "
                          "devices; use 'xla' or 'auto'")
    try:
        model, saved, own = restore_for_inference(path)
    except CheckpointError:
        raise
    except Exception as e:  # orbax / config / missing-file errors all mean "cannot restore this path"
        raise CheckpointError(f"{path}: cannot restore a checkpoint: {type(e).__name__}: {e}") from e
    if tokenizer is not None:
        from jaxlm.data.tokenizer import load_tokenizer

        own = load_tokenizer(tokenizer)
    if own is None:
        raise CheckpointError(f"{path}: the run records no tokenizer (tokenizer/meta.json), so text cannot be encoded; "
                              "pass --tokenizer DIR (a directory with tokenizer.json, or vocab.json + merges.txt)")
    if cfg is not None and cfg.compute != saved.compute:  # same weights, another way to run them
        scan.relayout(model, cfg.compute.scan_layers)
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: build_model(dataclasses.replace(saved, compute=cfg.compute))))
        model = nnx.merge(graphdef, nnx.state(model))
    return model, own
